package statestore.spark;

import java.util.List;

import org.apache.spark.sql.execution.streaming.state.StateStoreCustomMetric;
import org.apache.spark.sql.execution.streaming.state.StateStoreCustomSumMetric;
import org.apache.spark.sql.execution.streaming.state.StateStoreCustomTimingMetric;

/** The provider's custom metrics (summed over partitions in a query's progress). */
final class RingMetrics {
  private RingMetrics() {}

  static final StateStoreCustomSumMetric BYTES_COMMITTED =
      new StateStoreCustomSumMetric("ringBytesCommitted", "bytes of rows committed to the ring");
  static final StateStoreCustomTimingMetric COMMIT_TIME =
      new StateStoreCustomTimingMetric("ringCommitTimeMs", "time to commit to the ring (W acks)");
  static final StateStoreCustomTimingMetric RESTORE_TIME =
      new StateStoreCustomTimingMetric("ringRestoreTimeMs", "time to restore state from the ring");
  static final StateStoreCustomSumMetric RESTORED_ROWS =
      new StateStoreCustomSumMetric("ringRestoredRows", "rows restored from the ring");
  static final StateStoreCustomSumMetric CACHE_HITS =
      new StateStoreCustomSumMetric("ringCacheHitCount", "loads served by the executor's cache");
  static final StateStoreCustomSumMetric CACHE_MISSES =
      new StateStoreCustomSumMetric("ringCacheMissCount", "loads that restored from the ring");
  static final StateStoreCustomSumMetric SNAPSHOTS =
      new StateStoreCustomSumMetric("ringSnapshotCommits", "commits sent as full snapshots");

  static final StateStoreCustomSumMetric HEAD_READS =
      new StateStoreCustomSumMetric("ringHeadReads", "reads of the ring's head (one per task)");

  static final StateStoreCustomSumMetric BYTES_FETCHED =
      new StateStoreCustomSumMetric("ringBytesFetched", "bytes read from the ring");
  static final StateStoreCustomSumMetric CACHE_BYTES =
      new StateStoreCustomSumMetric("cacheBytes", "bytes of state in the executor's heap cache");
  static final StateStoreCustomSumMetric SPILL_BYTES =
      new StateStoreCustomSumMetric("spillBytes", "bytes of state in the local spill store");

  static final List<StateStoreCustomMetric> ALL =
      List.of(BYTES_COMMITTED, COMMIT_TIME, RESTORE_TIME, RESTORED_ROWS, CACHE_HITS, CACHE_MISSES,
          SNAPSHOTS, HEAD_READS, BYTES_FETCHED, CACHE_BYTES, SPILL_BYTES);
}
