package statestore.spark;

import java.io.ByteArrayOutputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Supplier;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * How one version's rows reach the ring without one huge body: a partition's state is
 * spread over {@code n} ring stores by key hash (shard 0 is the store of {@link
 * StoreNaming}, shard {@code i > 0} the same name plus {@code .s<i>}), and each shard gets
 * its own commit of at most {@code maxCommitBytes} (the provider's part limit, lowered for
 * the JVM when a node answers 413 because its {@code --max-commit} is smaller).
 *
 * <p>{@code n} starts at 1 (the layout of a store that never needed more). When one shard's
 * part would exceed the limit, {@code n} doubles until every shard of the whole state fits
 * and the version is sent as a snapshot of every shard (so shards never need keys moved
 * between deltas). Every version is committed to all {@code n} shards (empty deltas
 * included), biggest body first so that a 413 comes before anything was written, shard 0
 * last; shard 0's positions carry {@code "shards": n}, which a restore reads to fetch the
 * others. Each body is framed into its own buffer of at most the limit.
 */
final class StateCommit {
  private static final Logger LOG = LoggerFactory.getLogger(StateCommit.class);
  private static final int MAX_SHARDS = 4096;
  /** Part limits learned from 413 answers, per ring (seeds). */
  private static final ConcurrentHashMap<String, Long> LEARNED = new ConcurrentHashMap<>();

  private StateCommit() {}

  /** What was sent. */
  static final class Result {
    long bytes;
    boolean snapshot;
    int shards;
  }

  static int shardOf(UnsafeRow key, int shards) {
    if (shards == 1) {
      return 0;
    }
    int h = key.hashCode() * 0x9E3779B9;
    return Math.floorMod(h ^ (h >>> 16), shards);
  }

  static String shardPath(String storePath, int shard) {
    return shard == 0 ? storePath : storePath + ".s" + shard;
  }

  static String positions(long version, int shards) {
    return "{\"spark_state_version\":" + version + (shards > 1 ? ",\"shards\":" + shards : "")
        + "}";
  }

  /** Read {@code "shards"} from shard 0's positions (1 when absent). */
  static int shardsOf(String positionsJson) {
    int at = positionsJson.indexOf("\"shards\"");
    if (at < 0) {
      return 1;
    }
    int colon = positionsJson.indexOf(':', at);
    int end = colon + 1;
    while (end < positionsJson.length()
        && (Character.isDigit(positionsJson.charAt(end)) || positionsJson.charAt(end) == ' ')) {
      end++;
    }
    try {
      int n = Integer.parseInt(positionsJson.substring(colon + 1, end).trim());
      if (n < 1 || n > MAX_SHARDS) {
        throw new IllegalStateException("ring positions name " + n + " shards: not ours");
      }
      return n;
    } catch (NumberFormatException e) {
      throw new IllegalStateException("cannot read the shard count in " + positionsJson, e);
    }
  }

  /**
   * The epoch of version {@code newVersion - 1} of {@code shard} that the store was loaded
   * from: the commit's {@code base_epoch}, which restores of it follow (core/manifest.py,
   * "Lineage"); {@code null} (the chain takes the highest epoch there) when the store did not
   * start from that version as the ring has it (loaded empty, replayed, a new shard), and for
   * version 1, which applies to the empty state. Never above the commit's own epoch (the
   * replicas would fence it; the epoch rule keeps it below anyway).
   */
  static Long baseEpoch(WriteStore store, long newVersion, int shard) {
    long[] epochs = store.baseEpochs;
    if (newVersion <= 1 || store.version != newVersion - 1 || epochs == null
        || shard >= epochs.length || epochs[shard] > store.epoch) {
      return null;
    }
    return epochs[shard];
  }

  /** Spark's {@code minBatchesToRetain}: sent with every commit as {@code retain=N}. */
  static int retain(RingStateStoreProvider provider) {
    return provider.storeConf() == null ? 0 : provider.storeConf().minVersionsToRetain();
  }

  private static long limit(RingStateStoreProvider provider) {
    Long learned = LEARNED.get(String.join(",", provider.config().seeds));
    long configured = provider.config().maxCommitBytes;
    return learned == null ? configured : Math.min(configured, learned);
  }

  /**
   * The framed bytes of a commit's rows by the low bits of their shard hash, from one pass
   * over them: the size of every shard for any power-of-two shard count up to {@link
   * #MAX_SHARDS} ({@code shardOf(key, n) == shardOf(key, MAX_SHARDS) % n} when {@code n}
   * divides it), so finding how many shards a version needs reads its rows once, not once
   * per doubling.
   */
  static final class Sizes {
    private final long[] buckets = new long[MAX_SHARDS];

    void add(UnsafeRow key, UnsafeRow value) {
      UnsafeRow v = value == StateData.TOMBSTONE ? null : value;
      buckets[shardOf(key, MAX_SHARDS)] += RowFraming.framedSize(key, v);
    }

    void addAll(Iterator<Map.Entry<UnsafeRow, UnsafeRow>> rows) {
      while (rows.hasNext()) {
        Map.Entry<UnsafeRow, UnsafeRow> e = rows.next();
        add(e.getKey(), e.getValue());
      }
    }

    /**
     * Each of {@code shards} shards' bytes; a count that does not divide {@link #MAX_SHARDS}
     * (not one this provider writes: a store's positions may name any) is counted by another
     * pass over {@code rows}.
     */
    long[] at(int shards, Supplier<Iterator<Map.Entry<UnsafeRow, UnsafeRow>>> rows) {
      long[] out = new long[shards];
      if (MAX_SHARDS % shards != 0) {
        Iterator<Map.Entry<UnsafeRow, UnsafeRow>> it = rows.get();
        while (it.hasNext()) {
          Map.Entry<UnsafeRow, UnsafeRow> e = it.next();
          UnsafeRow v = e.getValue() == StateData.TOMBSTONE ? null : e.getValue();
          out[shardOf(e.getKey(), shards)] += RowFraming.framedSize(e.getKey(), v);
        }
        return out;
      }
      for (int i = 0; i < MAX_SHARDS; i++) {
        out[i % shards] += buckets[i];
      }
      return out;
    }
  }

  private static long max(long[] xs) {
    long m = 0;
    for (long x : xs) {
      m = Math.max(m, x);
    }
    return m;
  }

  /** Commit the store's version {@code newVersion} to every shard; see the class doc. */
  static Result send(
      RingStateStoreProvider provider, WriteStore store, long newVersion, boolean snapshot)
      throws IOException {
    int shards = store.data.shards;
    for (int round = 0; ; round++) {
      long limit = limit(provider);
      ShardFiles routed = null;
      boolean wrote = false;
      try {
        // one pass over the rows: their sizes for every power-of-two shard count (and, when
        // the rows are not all on the heap, each shard's rows in a local file of its own)
        Sizes all = new Sizes();
        Iterator<Map.Entry<UnsafeRow, UnsafeRow>> rows =
            snapshot ? store.merged() : store.overlay.entries();
        if (routes(store, snapshot, shards) && fits(store, snapshot, shards, limit)) {
          routed = ShardFiles.route(rows, shards, all);
        } else {
          all.addAll(rows);
        }
        long[] sizes = all.at(shards, snapshot ? store::merged : store.overlay::entries);
        if (max(sizes) > limit) {
          if (!snapshot) { // a delta too big for its shards: the version is sent whole
            snapshot = true;
            all = new Sizes();
            all.addAll(store.merged());
            sizes = all.at(shards, store::merged);
          }
          while (max(sizes) > limit) {
            if (shards * 2 > MAX_SHARDS) {
              throw new IOException(
                  "a state row of " + max(sizes) + " bytes does not fit a commit part of " + limit
                      + " bytes: raise " + RingConfig.PREFIX + "maxCommitBytes and the nodes' "
                      + "--max-commit");
            }
            shards *= 2;
            sizes = all.at(shards, store::merged);
          }
          LOG.info("{} version {}: {} shards of at most {} bytes each (snapshot)",
              provider.storePath(), newVersion, shards, limit);
          if (routed != null) { // routed for fewer shards, or a delta's rows
            routed.close();
            routed = null;
          }
        }
        if (routed == null && routes(store, snapshot, shards)) {
          routed = ShardFiles.route(snapshot ? store.merged() : store.overlay.entries(), shards,
              null);
        }
        Integer[] order = new Integer[shards];
        for (int i = 0; i < shards; i++) {
          order[i] = i;
        }
        long[] s = sizes;
        java.util.Arrays.sort(order, 1, shards, (a, b) -> Long.compare(s[b], s[a]));
        // biggest first (a 413 before anything is written), shard 0 (with the count) last
        Integer[] sendOrder = new Integer[shards];
        System.arraycopy(order, 1, sendOrder, 0, shards - 1);
        sendOrder[shards - 1] = 0;
        Result out = new Result();
        out.snapshot = snapshot;
        out.shards = shards;
        try {
          for (int shard : sendOrder) {
            String path = shardPath(provider.storePath(), shard);
            if (provider.config().direct) {
              out.bytes += direct(provider, store, newVersion, snapshot, shard, shards, path,
                  routed);
            } else {
              byte[] body = routed != null ? routed.body(shard)
                  : frame(store, snapshot, shard, shards, (int) Math.min(s[shard], limit));
              provider.ring().commit(path, newVersion, store.epoch,
                  baseEpoch(store, newVersion, shard), snapshot, positions(newVersion, shards),
                  retain(provider), body);
              out.bytes += body.length;
            }
            wrote = true;
          }
          return out;
        } catch (RingErrors.RingError e) {
          if (e.status != 413) {
            throw e;
          }
          long lower = Math.max(1L << 10, max(sizes) / 2);
          LEARNED.merge(String.join(",", provider.config().seeds), lower, Math::min);
          if (wrote || round >= 20) {
            throw e; // the task's retry splits by the lowered limit
          }
          LOG.warn("{}: the ring refused a {}-byte commit body (413); parts now at most {} bytes",
              provider.storePath(), max(sizes), lower);
        }
      } finally {
        if (routed != null) {
          routed.close();
        }
      }
    }
  }

  /**
   * Whether a commit's rows go through {@link ShardFiles} (one pass over them for every
   * shard) rather than one pass per shard: when there are several shards and the rows are
   * not all on the heap (an overlay or a version in a spill store, or a version still on the
   * ring), where each pass would read them all again.
   */
  private static boolean routes(WriteStore store, boolean snapshot, int shards) {
    return shards > 1 && shards <= ShardFiles.MAX_FILES && (store.overlay.spilled()
        || (snapshot && (store.data.spilled() || store.data.remote != null)));
  }

  /**
   * Whether the rows look like fitting {@code shards} shards of {@code limit} bytes, by the
   * counts the stores keep (a row counted as key + value + {@link StateBudget#ROW_COST},
   * framed as key + value + 8): when they do not, the shards will double and the first pass
   * only counts, rather than writing files that a second pass would write again.
   */
  private static boolean fits(WriteStore store, boolean snapshot, int shards, long limit) {
    long bytes = snapshot ? store.data.bytes.get() + store.bytesDelta() : store.overlay.bytes.get();
    long rows = snapshot ? store.keysAfter() : store.overlay.size();
    return bytes - rows * (StateBudget.ROW_COST - 8) <= (long) shards * limit;
  }

  /**
   * One shard's commit on the direct path: its rows laid out in chunks in this JVM and
   * written to the replicas ({@link RingDirect}); returns its rows' framed size (what the
   * coordinator path would have sent, so {@code ringBytesCommitted} means the same on both).
   */
  private static long direct(RingStateStoreProvider provider, WriteStore store, long version,
      boolean snapshot, int shard, int shards, String path, ShardFiles routed)
      throws IOException {
    List<byte[]> keys = new ArrayList<>();
    List<byte[]> values = new ArrayList<>();
    List<byte[]> deletes = new ArrayList<>();
    long framed = 0;
    if (routed != null) {
      framed = routed.rows(shard, (k, v) -> {
        if (v == null) {
          deletes.add(k);
        } else {
          keys.add(k);
          values.add(v);
        }
      });
    } else {
      Iterator<Map.Entry<UnsafeRow, UnsafeRow>> rows =
          snapshot ? store.merged() : store.overlay.entries();
      while (rows.hasNext()) {
        Map.Entry<UnsafeRow, UnsafeRow> e = rows.next();
        if (shardOf(e.getKey(), shards) == shard) {
          if (e.getValue() == StateData.TOMBSTONE) {
            deletes.add(e.getKey().getBytes());
            framed += RowFraming.framedSize(e.getKey(), null);
          } else {
            keys.add(e.getKey().getBytes());
            values.add(e.getValue().getBytes());
            framed += RowFraming.framedSize(e.getKey(), e.getValue());
          }
        }
      }
    }
    Map<String, Object> positions = new LinkedHashMap<>();
    positions.put("spark_state_version", version);
    if (shards > 1) {
      positions.put("shards", (long) shards);
    }
    if (shard == 0) { // the version's key count, for a lazy load's numKeys (RingStateStoreProvider)
      positions.put("keys", store.keysAfter());
    }
    provider.direct().commit(path, version, store.epoch, baseEpoch(store, version, shard),
        snapshot, positions, retain(provider), keys, values, deletes);
    return framed;
  }

  private static byte[] frame(WriteStore store, boolean snapshot, int shard, int shards, int size)
      throws IOException {
    ByteArrayOutputStream buf = new ByteArrayOutputStream(Math.max(1024, size));
    DataOutputStream out = new DataOutputStream(buf);
    Iterator<Map.Entry<UnsafeRow, UnsafeRow>> rows =
        snapshot ? store.merged() : store.overlay.entries();
    while (rows.hasNext()) {
      Map.Entry<UnsafeRow, UnsafeRow> e = rows.next();
      if (shardOf(e.getKey(), shards) == shard) {
        UnsafeRow v = e.getValue() == StateData.TOMBSTONE ? null : e.getValue();
        RowFraming.writeRow(out, e.getKey(), v);
      }
    }
    out.flush();
    return buf.toByteArray();
  }
}
