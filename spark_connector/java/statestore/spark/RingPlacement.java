package statestore.spark;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;

/**
 * Consistent-hashing placement, as {@code statestore/core/placement.py}: every node owns
 * {@code vnodes} tokens {@code xxh64("<node id>#<i>")} (the ring's count, or the member's own
 * when a rebalance gave it one); an item's token is
 * {@code xxh3_64(key)}; its replicas are the first R distinct nodes met walking clockwise
 * from the first token at or after it. With more than one zone, the walk first takes nodes of
 * zones not used yet and fills up from the rest. Tokens compare as unsigned 64-bit values.
 */
public final class RingPlacement {
  public static final int DEFAULT_VNODES = 256;

  /** A physical node as placement sees it; {@code vnodes} 0 means the ring's count. */
  public record Member(String id, String zone, int vnodes) {
    public Member(String id, String zone) {
      this(id, zone, 0);
    }
  }

  private final List<Member> members;
  private final long[] tokens;
  private final String[] owners;
  private final Map<String, String> zoneOf = new HashMap<>();
  private final boolean zoned;

  public RingPlacement(Iterable<Member> nodes, int vnodes) {
    if (vnodes < 1) {
      throw new IllegalArgumentException("vnodes must be at least 1, got " + vnodes);
    }
    // sorted and deduplicated as Python sorts and dedups its frozen dataclasses
    Comparator<Member> byIdZone = Comparator.comparing(Member::id, RingPlacement::compareCodePoints)
        .thenComparing(Member::zone, RingPlacement::compareCodePoints)
        .thenComparingInt(Member::vnodes);
    TreeSet<Member> set = new TreeSet<>(byIdZone);
    for (Member m : nodes) {
      if (m.vnodes() < 0) {
        throw new IllegalArgumentException("a member's vnodes is 0 (the ring's count) or more");
      }
      set.add(m);
    }
    members = List.copyOf(set);
    Map<String, Integer> weight = new HashMap<>();
    for (Member m : members) {
      weight.put(m.id(), m.vnodes() == 0 ? vnodes : m.vnodes()); // a later duplicate id wins
    }
    int n = 0;
    for (Member m : members) {
      n += weight.get(m.id());
    }
    long[] tok = new long[n];
    String[] own = new String[n];
    Integer[] order = new Integer[n];
    int i = 0;
    for (Member m : members) {
      int count = weight.get(m.id());
      for (int v = 0; v < count; v++) {
        tok[i] = xxh64((m.id() + "#" + v).getBytes(StandardCharsets.UTF_8));
        own[i] = m.id();
        order[i] = i;
        i++;
      }
    }
    // (token, id) pairs sorted as Python sorts the tuples
    Arrays.sort(order, (a, b) -> {
      int c = Long.compareUnsigned(tok[a], tok[b]);
      return c != 0 ? c : compareCodePoints(own[a], own[b]);
    });
    tokens = new long[n];
    owners = new String[n];
    for (int j = 0; j < n; j++) {
      tokens[j] = tok[order[j]];
      owners[j] = own[order[j]];
    }
    Set<String> zones = new HashSet<>();
    for (Member m : members) {
      zoneOf.put(m.id(), m.zone()); // a later duplicate id wins, as Python's dict
      zones.add(m.zone());
    }
    zoned = zones.size() > 1;
  }

  static int compareCodePoints(String a, String b) {
    int i = 0;
    int j = 0;
    while (i < a.length() && j < b.length()) {
      int ca = a.codePointAt(i);
      int cb = b.codePointAt(j);
      if (ca != cb) {
        return Integer.compare(ca, cb);
      }
      i += Character.charCount(ca);
      j += Character.charCount(cb);
    }
    return Integer.compare(a.length() - i, b.length() - j);
  }

  public List<Member> members() {
    return members;
  }

  /** The item token of a key: XXH3-64 of its UTF-8 bytes. */
  public static long itemToken(String key) {
    return Xxh3.hash(key.getBytes(StandardCharsets.UTF_8));
  }

  /** Every node, in the order the clockwise walk from {@code key}'s token meets them. */
  public List<String> preference(String key) {
    List<String> seen = new ArrayList<>();
    int n = tokens.length;
    if (n == 0) {
      return seen;
    }
    long t = itemToken(key);
    int lo = 0;
    int hi = n; // bisect_left: the first token >= t
    while (lo < hi) {
      int mid = (lo + hi) >>> 1;
      if (Long.compareUnsigned(tokens[mid], t) < 0) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    Set<String> seenSet = new HashSet<>();
    int total = members.size();
    for (int i = 0; i < n; i++) {
      String owner = owners[(lo + i) % n];
      if (seenSet.add(owner)) {
        seen.add(owner);
        if (seen.size() == total) {
          break;
        }
      }
    }
    return seen;
  }

  /** The {@code r} nodes that hold {@code key} (fewer if the ring is smaller). */
  public List<String> replicas(String key, int r) {
    List<String> walk = preference(key);
    if (!zoned) {
      return new ArrayList<>(walk.subList(0, Math.min(r, walk.size())));
    }
    List<String> chosen = new ArrayList<>();
    Set<String> zones = new HashSet<>();
    for (String node : walk) {
      if (chosen.size() == r) {
        break;
      }
      if (zones.add(zoneOf.get(node))) {
        chosen.add(node);
      }
    }
    for (String node : walk) {
      if (chosen.size() == r) {
        break;
      }
      if (!chosen.contains(node)) {
        chosen.add(node);
      }
    }
    return chosen;
  }

  // --- XXH64, seed 0 -----------------------------------------------------------------------

  private static long round(long acc, long input) {
    acc += input * Xxh3.PRIME64_2;
    acc = Long.rotateLeft(acc, 31);
    return acc * Xxh3.PRIME64_1;
  }

  private static long mergeRound(long acc, long val) {
    acc ^= round(0, val);
    return acc * Xxh3.PRIME64_1 + Xxh3.PRIME64_4;
  }

  /** XXH64 with seed 0 (node tokens), as {@code xxhash.xxh64_intdigest}. */
  public static long xxh64(byte[] b) {
    int len = b.length;
    int p = 0;
    long h;
    if (len >= 32) {
      long v1 = Xxh3.PRIME64_1 + Xxh3.PRIME64_2;
      long v2 = Xxh3.PRIME64_2;
      long v3 = 0;
      long v4 = -Xxh3.PRIME64_1;
      do {
        v1 = round(v1, Xxh3.r64(b, p));
        v2 = round(v2, Xxh3.r64(b, p + 8));
        v3 = round(v3, Xxh3.r64(b, p + 16));
        v4 = round(v4, Xxh3.r64(b, p + 24));
        p += 32;
      } while (p <= len - 32);
      h = Long.rotateLeft(v1, 1) + Long.rotateLeft(v2, 7) + Long.rotateLeft(v3, 12)
          + Long.rotateLeft(v4, 18);
      h = mergeRound(h, v1);
      h = mergeRound(h, v2);
      h = mergeRound(h, v3);
      h = mergeRound(h, v4);
    } else {
      h = Xxh3.PRIME64_5;
    }
    h += len;
    while (p + 8 <= len) {
      h ^= round(0, Xxh3.r64(b, p));
      h = Long.rotateLeft(h, 27) * Xxh3.PRIME64_1 + Xxh3.PRIME64_4;
      p += 8;
    }
    if (p + 4 <= len) {
      h ^= (Xxh3.r32(b, p) & 0xFFFFFFFFL) * Xxh3.PRIME64_1;
      h = Long.rotateLeft(h, 23) * Xxh3.PRIME64_2 + Xxh3.PRIME64_3;
      p += 4;
    }
    while (p < len) {
      h ^= (b[p] & 0xFFL) * Xxh3.PRIME64_5;
      h = Long.rotateLeft(h, 11) * Xxh3.PRIME64_1;
      p++;
    }
    return Xxh3.xxh64Avalanche(h);
  }
}
