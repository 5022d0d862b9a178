package statestore.spark;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.function.Predicate;

import com.fasterxml.jackson.databind.JsonNode;

import statestore.spark.RingErrors.RingException;

/**
 * A ring view: the members, R, W and vnodes at one ring epoch (Python's RingView). While
 * nodes join or leave it holds two rings, as Python's core/view.py: the current ring of the
 * live {@code normal} and {@code leaving} members, which owns every item now (reads), and
 * the future ring of the live {@code normal} and {@code joining} members. A write goes to
 * both ({@link #writeReplicasOf}) and counts only with W acknowledgements among the current
 * owners and W among the future ones ({@link #checkWriteSets}), so that it is
 * readable before the switch and after it. With nobody moving they are one ring.
 *
 * <p>The quorum rules of Python's {@code core/quorum.py} that a write is counted by live here
 * too ({@link #checkWriteSets}, {@link #quorumOf}). {@link RingWriter} sends the writes.
 */
public final class RingView {
  /**
   * One member of a ring view: its failure-detector status ({@code up}, {@code suspect},
   * {@code down}), its ring state ({@code joining}, {@code normal}, {@code leaving},
   * {@code left}; Python core/handover.py), the tokens it owns ({@code vnodes}, 0: the view's
   * count) and, while a rebalance moves them, the count it moves to ({@code nextVnodes}, 0:
   * none; Python core/view.py).
   */
  public record MemberInfo(String id, String address, String status, String zone, String state,
      int vnodes, int nextVnodes) {
    public MemberInfo(String id, String address, String status, String zone, String state) {
      this(id, address, status, zone, state, 0, 0);
    }

    public MemberInfo(String id, String address, String status, String zone) {
      this(id, address, status, zone, "normal");
    }

    /** This member on the read ring of a view whose count is {@code dflt}. */
    RingPlacement.Member placed(int dflt) {
      int n = vnodes != 0 ? vnodes : dflt;
      return new RingPlacement.Member(id, zone, n == dflt ? 0 : n);
    }

    /** This member on the future ring. */
    RingPlacement.Member placedLater(int dflt) {
      int n = nextVnodes != 0 ? nextVnodes : vnodes != 0 ? vnodes : dflt;
      return new RingPlacement.Member(id, zone, n == dflt ? 0 : n);
    }
  }

  /** The largest token count a view's member may claim (Python's MAX_VIEW_VNODES). */
  static final int MAX_VIEW_VNODES = 4096;

  /** Ring states whose live members own items now (Python's READ_STATES). */
  static final Set<String> READ_STATES = Set.of("normal", "leaving");
  /** Ring states whose live members own items once every move finishes (FUTURE_STATES). */
  static final Set<String> FUTURE_STATES = Set.of("normal", "joining");
  private static final Set<String> STATES = Set.of("joining", "normal", "leaving", "left");

  public final long epoch;
  public final List<MemberInfo> members;
  public final int replicas;
  public final int writeQuorum;
  public final int vnodes;
  /**
   * Every member reads blocked chunks (Python core/view.py {@code blocks}): a writer may write
   * them; until then (a ring being upgraded from 0.2) it writes whole chunks.
   */
  public final boolean blocks;
  /**
   * Every member reads chunk format 3 (Python core/view.py {@code whole_names}): a writer's
   * whole snapshot names its chunks {@code w}, which thinning never drops; until then {@code s}.
   */
  public final boolean wholeNames;
  private final RingPlacement ring;
  private final RingPlacement future;
  /** The ring counting every member in a read state, down ones too (the items' homes). */
  private final RingPlacement home;
  private final List<String> live;
  private final Map<String, String> address = new LinkedHashMap<>();

  public RingView(long epoch, List<MemberInfo> members, int replicas, int writeQuorum, int vnodes) {
    this(epoch, members, replicas, writeQuorum, vnodes, false, false);
  }

  public RingView(long epoch, List<MemberInfo> members, int replicas, int writeQuorum, int vnodes,
      boolean blocks, boolean wholeNames) {
    if (replicas < 1 || writeQuorum < 1 || writeQuorum > replicas) {
      throw new IllegalArgumentException("replicas " + replicas + " / write quorum " + writeQuorum);
    }
    this.epoch = epoch;
    this.members = List.copyOf(members);
    this.replicas = replicas;
    this.writeQuorum = writeQuorum;
    this.vnodes = vnodes;
    this.blocks = blocks;
    this.wholeNames = wholeNames;
    List<RingPlacement.Member> now = new ArrayList<>();
    List<RingPlacement.Member> later = new ArrayList<>();
    List<RingPlacement.Member> all = new ArrayList<>();
    TreeSet<String> liveIds = new TreeSet<>();
    for (MemberInfo m : members) {
      if (READ_STATES.contains(m.state())) {
        all.add(m.placed(vnodes));
      }
      if (!m.status().equals("down") && !m.state().equals("left")) {
        if (READ_STATES.contains(m.state())) {
          now.add(m.placed(vnodes));
        }
        if (FUTURE_STATES.contains(m.state())) {
          later.add(m.placedLater(vnodes));
        }
        liveIds.add(m.id());
      }
      address.put(m.id(), m.address());
    }
    ring = new RingPlacement(now, vnodes);
    future = new LinkedHashSet<>(later).equals(new LinkedHashSet<>(now))
        ? ring : new RingPlacement(later, vnodes);
    live = List.copyOf(liveIds);
    home = new LinkedHashSet<>(all).equals(new LinkedHashSet<>(now))
        ? ring : new RingPlacement(all, vnodes);
  }

  /** The chunk kind of a writer's whole snapshot on this ring: {@code 'w'}, or {@code 's'}. */
  public char snapshotKind() {
    return wholeNames ? 'w' : 's';
  }

  /** The block size a writer on this ring uses: the default, or 0 (whole chunks). */
  public int blockSize() {
    return blocks ? ChunkCodec.DEFAULT_BLOCK_SIZE : 0;
  }

  public static RingView fromJson(JsonNode obj) {
    List<MemberInfo> members = new ArrayList<>();
    for (JsonNode m : obj.get("members")) {
      String status = m.get("status").asText();
      if (!status.equals("up") && !status.equals("suspect") && !status.equals("down")) {
        throw new RingException("malformed_data", "ring view member status " + status);
      }
      // Ring states (Python core/handover.py): a joining member is a pending owner (writes
      // go to it, reads do not yet), a leaving one still owns what it holds, a left one owns
      // nothing any more.
      String state = m.has("state") ? m.get("state").asText() : "normal";
      if (!STATES.contains(state)) {
        throw new RingException("malformed_data", "ring view member state " + state);
      }
      members.add(new MemberInfo(m.get("id").asText(), m.get("address").asText(), status,
          m.has("zone") ? m.get("zone").asText() : "", state, count(m, "vnodes"),
          count(m, "next_vnodes")));
    }
    return new RingView(obj.get("epoch").asLong(), members, obj.get("replicas").asInt(),
        obj.get("write_quorum").asInt(), obj.get("vnodes").asInt(),
        flag(obj, "blocks"), flag(obj, "whole_names"));
  }

  private static boolean flag(JsonNode obj, String field) {
    return obj.has(field) && obj.get(field).isBoolean() && obj.get(field).asBoolean();
  }

  /** A member's token count: absent is 0, else an integer from 0 to MAX_VIEW_VNODES. */
  private static int count(JsonNode m, String field) {
    if (!m.has(field)) {
      return 0;
    }
    JsonNode v = m.get(field);
    if (!v.isInt() || v.asInt() < 0 || v.asInt() > MAX_VIEW_VNODES) {
      throw new RingException("malformed_data", "ring view member " + field + " " + v);
    }
    return v.asInt();
  }

  /** The current ring (the live normal and leaving members). */
  public RingPlacement placement() {
    return ring;
  }

  /** The ring once every move finishes (the current ring when nobody moves). */
  public RingPlacement futurePlacement() {
    return future;
  }

  /** Whether a member is joining or leaving (the two rings differ). */
  public boolean moving() {
    return future != ring;
  }

  /** Addresses of the R nodes that hold {@code key} at this epoch (its current owners). */
  public List<String> replicasOf(String key) {
    List<String> out = new ArrayList<>();
    for (String id : ring.replicas(key, replicas)) {
      out.add(address.get(id));
    }
    return out;
  }

  /** Addresses of {@code key}'s owners once every move finishes. */
  public List<String> futureReplicasOf(String key) {
    if (!moving()) {
      return replicasOf(key);
    }
    List<String> out = new ArrayList<>();
    for (String id : future.replicas(key, replicas)) {
      out.add(address.get(id));
    }
    return out;
  }

  /**
   * Where a write of {@code key} goes: its current owners, then its pending owners (future
   * owners that do not own it yet), as Python's {@code write_replicas_of}.
   */
  public List<String> writeReplicasOf(String key) {
    List<String> out = replicasOf(key);
    if (!moving()) {
      return out;
    }
    for (String a : futureReplicasOf(key)) {
      if (!out.contains(a)) {
        out.add(a);
      }
    }
    return out;
  }

  /**
   * {@code key}'s home replicas (its owners on the ring counting down members too) as a
   * manifest write counts them, as Python's {@code write_homes}: a live one by its address, a
   * down one as {@code down:ID}, which no answer matches. A manifest needs W of them, down
   * ones included: a stand-in's copy is a hint ({@link #checkWriteSets}).
   */
  public List<String> writeHomesOf(String key) {
    List<String> out = new ArrayList<>();
    for (String id : home.replicas(key, replicas)) {
      out.add(live.contains(id) ? address.get(id) : "down:" + id);
    }
    return out;
  }

  /** The live ones of {@link #writeHomesOf} (Python's {@code live_home_replicas}). */
  public List<String> liveHomeReplicasOf(String key) {
    List<String> out = new ArrayList<>();
    for (String a : writeHomesOf(key)) {
      if (!a.startsWith("down:")) {
        out.add(a);
      }
    }
    return out;
  }

  /** Replicas first, then every other live node in ring order (where it may have moved). */
  public List<String> readOrder(String key) {
    List<String> out = replicasOf(key);
    for (String id : ring.preference(key)) {
      String a = address.get(id);
      if (!out.contains(a)) {
        out.add(a);
      }
    }
    return out;
  }

  /** Every member that is not down and has not left, joining ones included. */
  public List<String> liveAddresses() {
    List<String> out = new ArrayList<>();
    for (String id : live) {
      out.add(address.get(id));
    }
    return out;
  }

  // -- the write quorum (Python's core/quorum.py) -----------------------------------------

  /**
   * Throw quorum_not_reached unless W of the current owners <em>and</em> W of the future owners
   * acknowledged ({@code acked}: the addresses that did), naming the set that fell short: the
   * rule of Python's {@code core/quorum.check_write_sets}. With nobody moving the two sets are
   * one.
   */
  static void checkWriteSets(String what, Set<String> acked, List<String> current,
      List<String> future, int w, List<RingException> errors) {
    checkWrite(what, countIn(current, acked), w, current.size(), errors);
    if (!future.equals(current)) {
      checkWrite(what + " (on its owners after the move)", countIn(future, acked), w, future.size(),
          errors);
    }
  }

  /**
   * {@link #checkWriteSets}, and W of the home replicas {@code homes} ({@link #writeHomesOf};
   * all of them on a ring of fewer members): Python's {@code check_write_sets} with
   * {@code homes}, for a manifest.
   */
  static void checkWriteSets(String what, Set<String> acked, List<String> current,
      List<String> future, int w, List<RingException> errors, List<String> homes) {
    checkWriteSets(what, acked, current, future, w, errors);
    if (!homes.isEmpty() && !new LinkedHashSet<>(homes).containsAll(current)) {
      int need = Math.min(w, homes.size());
      int got = countIn(homes, acked);
      if (got < need) {
        checkWrite(what + " (on its home replicas)", got, need, homes.size(), errors);
      }
    }
  }

  private static int countIn(List<String> addresses, Set<String> acked) {
    int n = 0;
    for (String a : addresses) {
      if (acked.contains(a)) {
        n++;
      }
    }
    return n;
  }

  private static void checkWrite(
      String what, int acks, int w, int placed, List<RingException> errors) {
    if (acks >= w) {
      return;
    }
    Set<String> msgs = new TreeSet<>();
    for (RingException e : errors) {
      msgs.add(e.getMessage());
    }
    String why = msgs.isEmpty() ? "no replica answered" : String.join("; ", msgs);
    if (placed < w) {
      why = "the ring has only " + placed + " live node(s) for it; " + why;
    }
    throw new RingException("quorum_not_reached", what + " reached " + acks + " of the " + w
        + " replicas it needs (W): " + why + ". Nothing was acknowledged; retry when the ring has"
        + " enough live nodes");
  }

  /** W acknowledgements from the current owners and W from the future ones. */
  static Predicate<Set<String>> quorumOf(List<String> current, List<String> future, int w) {
    int needCurrent = Math.min(w, current.size());
    int needFuture = Math.min(w, future.size());
    return acked -> countIn(current, acked) >= needCurrent && countIn(future, acked) >= needFuture;
  }

  /** {@link #quorumOf}, and W of the home replicas (all on a ring of fewer members). */
  static Predicate<Set<String>> quorumOf(List<String> current, List<String> future, int w,
      List<String> homes) {
    Predicate<Set<String>> owners = quorumOf(current, future, w);
    int needHome = Math.min(w, homes.size());
    return acked -> owners.test(acked) && countIn(homes, acked) >= needHome;
  }
}
