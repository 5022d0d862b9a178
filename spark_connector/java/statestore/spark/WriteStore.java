package statestore.spark;

import java.io.IOException;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;

import org.apache.spark.TaskContext;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.KeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreCheckpointInfo;
import org.apache.spark.sql.execution.streaming.state.StateStoreCustomMetric;
import org.apache.spark.sql.execution.streaming.state.StateStoreInstanceMetric;
import org.apache.spark.sql.execution.streaming.state.StateStoreMetrics;
import org.apache.spark.sql.types.StructType;

import scala.Option;
import scala.jdk.javaapi.CollectionConverters;

/** The store a task updates: version + 1 in the making. */
final class WriteStore extends StoreBase implements StateStore {
  private static final int UPDATING = 0;
  private static final int COMMITTED = 1;
  private static final int ABORTED = 2;

  final long epoch;
  private final boolean forceSnapshot;
  private final RingStateStoreProvider.Loaded loaded;
  private final HashMap<UnsafeRow, UnsafeRow> undo = new HashMap<>();
  private final LinkedHashMap<UnsafeRow, UnsafeRow> delta = new LinkedHashMap<>();
  private volatile int state = UPDATING;
  private long bytesCommitted;
  private long commitMs;
  private boolean snapshotSent;

  WriteStore(
      RingStateStoreProvider provider,
      long version,
      RingStateStoreProvider.Loaded loaded,
      boolean forceSnapshot,
      long epoch) {
    super(provider, version, loaded.data);
    this.loaded = loaded;
    this.forceSnapshot = forceSnapshot;
    this.epoch = epoch;
    TaskContext ctx = TaskContext.get();
    if (ctx != null) {
      ctx.addTaskCompletionListener(c -> {
        if (state == UPDATING) {
          abort();
        }
      });
    }
  }

  private void updating(String what) {
    if (state != UPDATING) {
      throw new IllegalStateException(
          "RingStateStoreProvider: cannot " + what + " after the store was committed or aborted");
    }
  }

  @Override
  public void put(UnsafeRow key, UnsafeRow value, String cf) {
    defaultFamily(cf);
    if (value == null) {
      throw new IllegalArgumentException("cannot put a null value");
    }
    updating("put");
    UnsafeRow k = key.copy();
    UnsafeRow v = value.copy();
    UnsafeRow prev = data.put(k, v);
    if (!undo.containsKey(k)) {
      undo.put(k, prev);
    }
    delta.put(k, v);
  }

  @Override
  public void remove(UnsafeRow key, String cf) {
    defaultFamily(cf);
    updating("remove");
    UnsafeRow prev = data.remove(key);
    if (prev != null) {
      UnsafeRow k = key.copy();
      if (!undo.containsKey(k)) {
        undo.put(k, prev);
      }
      delta.put(k, null);
    }
  }

  @Override
  public long commit() {
    updating("commit");
    long newVersion = version + 1;
    RingConfig config = provider.config();
    String storePath = provider.storePath();
    boolean snapshot =
        forceSnapshot || (config.snapshotInterval > 0 && newVersion % config.snapshotInterval == 0);
    long started = System.nanoTime();
    try {
      byte[] body = snapshot ? RowFraming.frame(data.map) : RowFraming.frame(delta);
      provider.ring().commit(storePath, newVersion, epoch, snapshot, body);
      bytesCommitted = body.length;
      snapshotSent = snapshot;
    } catch (IOException | RuntimeException e) {
      rollback();
      state = ABORTED;
      provider.finished(this, true);
      String msg = e.getMessage();
      if (e instanceof RingHttp.RingError && "stale_epoch".equals(((RingHttp.RingError) e).code)) {
        msg = "fenced: a newer attempt owns " + storePath + " (" + msg + ")";
      }
      throw new IllegalStateException(
          "RingStateStoreProvider: commit of " + storePath + " version " + newVersion
              + " failed: " + msg,
          e);
    }
    commitMs = (System.nanoTime() - started) / 1_000_000;
    undo.clear();
    delta.clear();
    state = COMMITTED;
    provider.committed(this, newVersion);
    if (provider.storeConf().commitValidationEnabled()) {
      StateStore.reportCommitToCoordinator(newVersion, id(), provider.hadoopConf());
    }
    return newVersion;
  }

  private void rollback() {
    for (Map.Entry<UnsafeRow, UnsafeRow> e : undo.entrySet()) {
      if (e.getValue() == null) {
        data.remove(e.getKey());
      } else {
        data.put(e.getKey(), e.getValue());
      }
    }
    undo.clear();
    delta.clear();
  }

  @Override
  public void abort() {
    if (state == UPDATING) {
      rollback();
      state = ABORTED;
      provider.finished(this, false);
    } else {
      state = ABORTED;
    }
  }

  @Override
  public StateStoreMetrics metrics() {
    Map<StateStoreCustomMetric, Object> custom = new HashMap<>();
    custom.put(RingMetrics.BYTES_COMMITTED, bytesCommitted);
    custom.put(RingMetrics.COMMIT_TIME, commitMs);
    custom.put(RingMetrics.RESTORE_TIME, loaded.restoreMs);
    custom.put(RingMetrics.RESTORED_ROWS, loaded.restoredRows);
    custom.put(RingMetrics.CACHE_HITS, loaded.hit ? 1L : 0L);
    custom.put(RingMetrics.CACHE_MISSES, loaded.hit ? 0L : 1L);
    custom.put(RingMetrics.SNAPSHOTS, snapshotSent ? 1L : 0L);
    Map<StateStoreInstanceMetric, Object> none = new HashMap<>();
    return new StateStoreMetrics(
        data.map.size(),
        data.bytes.get(),
        scala.collection.immutable.Map$.MODULE$.from(CollectionConverters.asScala(custom)),
        scala.collection.immutable.Map$.MODULE$.from(CollectionConverters.asScala(none)));
  }

  @Override
  public StateStoreCheckpointInfo getStateStoreCheckpointInfo() {
    return new StateStoreCheckpointInfo(
        id().partitionId(), version + 1, Option.apply(null), Option.apply(null));
  }

  @Override
  public boolean hasCommitted() {
    return state == COMMITTED;
  }

  @Override
  public void createColFamilyIfAbsent(
      String name, StructType k, StructType v, KeyStateEncoderSpec spec, boolean multi,
      boolean internal) {
    throw new UnsupportedOperationException(
        "RingStateStoreProvider does not support multiple column families");
  }

  @Override
  public boolean removeColFamilyIfExists(String name) {
    throw new UnsupportedOperationException(
        "RingStateStoreProvider does not support multiple column families");
  }

  @Override
  public void putList(UnsafeRow key, UnsafeRow[] values, String cf) {
    throw new UnsupportedOperationException("RingStateStoreProvider: putList");
  }

  @Override
  public void merge(UnsafeRow key, UnsafeRow value, String cf) {
    throw new UnsupportedOperationException("RingStateStoreProvider: merge");
  }

  @Override
  public void mergeList(UnsafeRow key, UnsafeRow[] values, String cf) {
    throw new UnsupportedOperationException("RingStateStoreProvider: mergeList");
  }

  @Override
  public String toString() {
    return "RingStateStore[" + provider.storePath() + ", version=" + version + ", epoch=" + epoch
        + "]";
  }
}
