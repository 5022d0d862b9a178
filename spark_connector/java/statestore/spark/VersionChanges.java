package statestore.spark;

import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;

/**
 * What one version of a Spark store changed, read from the ring: the rows of that version's
 * own delta (every shard's), a put per changed key and a delete per removed key. This is what
 * Spark's state reader shows for {@code readChangeFeed} and what {@code snapshotStartBatchId}
 * replays (docs/spark.md, "Spark's state tools").
 *
 * <p>A version the ring holds only as a snapshot (one the provider sent whole: the first
 * commit after {@code loadEmpty}, a re-split into more shards, {@code snapshotInterval}, a
 * store moved from its legacy name) has no delta of its own: its changes are the difference
 * between the whole state of the version before and its own (a put for each key added or
 * changed, a delete for each key gone). A compaction's snapshot never hides a delta: it has
 * the delta's epoch, and the delta is kept until retention drops the version.
 */
final class VersionChanges {
  /** One change: {@code value} is {@code null} for a delete. */
  record Change(UnsafeRow key, UnsafeRow value) {}

  /** The whole state of a version, for versions without a delta of their own. */
  interface WholeState {
    StateData load(long version);
  }

  private VersionChanges() {}

  /**
   * The changes of {@code version} of the store at {@code storePath} (shard 0's name).
   *
   * @throws IOException when the ring cannot be read by {@code deadline}
   * @throws IllegalStateException when the ring holds no such version (past retention, or
   *     never committed)
   */
  static List<Change> read(RingDirect direct, String storePath, long version, int keyFields,
      int valueFields, long deadline, WholeState whole) throws IOException {
    RingDirect.VersionManifests first = direct.versionManifests(storePath, version, deadline);
    if (first.isEmpty()) {
      throw new IllegalStateException("RingStateStoreProvider: version " + version + " of "
          + storePath + " is not on the ring (older than the ring keeps, see "
          + "spark.sql.streaming.minBatchesToRetain, or never committed)");
    }
    if (!first.hasDelta()) {
      return difference(whole, version);
    }
    List<ManifestCodec.Manifest> deltas = new ArrayList<>();
    deltas.add(first.delta());
    int shards = shardsOf(first.delta().positions());
    for (int s = 1; s < shards; s++) {
      RingDirect.VersionManifests m =
          direct.versionManifests(StateCommit.shardPath(storePath, s), version, deadline);
      if (!m.hasDelta()) {
        return difference(whole, version);
      }
      deltas.add(m.delta());
    }
    List<Change> out = new ArrayList<>();
    for (ManifestCodec.Manifest m : deltas) {
      for (ChunkCodec.Row row : direct.rowsOf(m, deadline)) {
        UnsafeRow key = new UnsafeRow(keyFields);
        key.pointTo(row.key(), row.key().length);
        UnsafeRow value = null;
        if (row.value() != null) {
          value = new UnsafeRow(valueFields);
          value.pointTo(row.value(), row.value().length);
        }
        out.add(new Change(key, value));
      }
    }
    return out;
  }

  /** Shard 0's {@code "shards"} position (1 when absent). */
  static int shardsOf(Map<String, Object> positions) {
    Object n = positions.get("shards");
    return n instanceof Number num ? Math.max(1, num.intValue()) : 1;
  }

  /** The changes from the whole state of {@code version - 1} to that of {@code version}. */
  static List<Change> difference(WholeState whole, long version) {
    StateData before = version > 1 ? whole.load(version - 1) : null;
    StateData after = whole.load(version);
    List<Change> out = new ArrayList<>();
    java.util.Iterator<Map.Entry<UnsafeRow, UnsafeRow>> rows = after.entries();
    while (rows.hasNext()) {
      Map.Entry<UnsafeRow, UnsafeRow> e = rows.next();
      UnsafeRow old = before == null ? null : before.get(e.getKey());
      if (old == null || !old.equals(e.getValue())) {
        out.add(new Change(e.getKey(), e.getValue()));
      }
    }
    if (before != null) {
      rows = before.entries();
      while (rows.hasNext()) {
        UnsafeRow key = rows.next().getKey();
        if (!after.containsKey(key)) {
          out.add(new Change(key, null));
        }
      }
      before.retire();
    }
    after.retire();
    return out;
  }

  /** Apply changes to a version in memory (puts and removes). */
  static void apply(StateData data, List<Change> changes) {
    for (Change c : changes) {
      if (c.value() == null) {
        data.remove(c.key());
      } else {
        data.put(c.key(), c.value());
      }
    }
  }
}
