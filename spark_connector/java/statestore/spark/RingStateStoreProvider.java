package statestore.spark;

import java.io.IOException;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.ReentrantReadWriteLock;

import org.apache.hadoop.conf.Configuration;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.KeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.NoPrefixKeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.PrefixKeyScanStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.ReadStateStore;
import org.apache.spark.sql.execution.streaming.state.StateSchemaProvider;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreConf;
import org.apache.spark.sql.execution.streaming.state.StateStoreCustomMetric;
import org.apache.spark.sql.execution.streaming.state.StateStoreId;
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import scala.Option;
import scala.jdk.javaapi.CollectionConverters;

/**
 * A Spark {@link StateStoreProvider} whose state lives on a statestore ring.
 *
 * <p>The last committed version of the partition stays in memory (in this executor JVM), so
 * the next micro-batch loads nothing. A write store changes that map in place and keeps an
 * undo log (for {@code abort()}) and the delta; {@code commit()} posts the delta as framed
 * rows to a ring coordinator ({@code POST /v1/stores/.../commit}) and returns once W replicas
 * hold it. On a miss (restart, task moved, executor lost) the version is restored from the
 * ring ({@code GET /v1/stores/.../state?version=N}). Nothing is written under the
 * checkpoint's partition folders. Maintenance (snapshots, retention) is done by the ring.
 *
 * <p>Store ids: query = the sanitized checkpoint root plus a hash of it, operator, partition,
 * name = Spark's store name. Writer epochs rise monotonically per JVM and stay above the
 * epoch of the state they start from, so a stale task attempt is fenced by the ring (409).
 */
public final class RingStateStoreProvider implements StateStoreProvider {
  private static final Logger LOG = LoggerFactory.getLogger(RingStateStoreProvider.class);
  private static final AtomicLong LAST_EPOCH = new AtomicLong();

  // -- fields of the Scala trait --------------------------------------------------------
  private volatile boolean unloaded;
  private ReentrantReadWriteLock maintenanceLock = new ReentrantReadWriteLock(true);

  // -- set by init ----------------------------------------------------------------------
  private StateStoreId stateStoreId;
  private StateStoreConf storeConf;
  private Configuration hadoopConf;
  private RingConfig config;
  private RingHttp ring;
  private String storePath;
  private int keyFields;
  private int valueFields;
  private DataType[] prefixTypes;

  // -- the in-memory versions -----------------------------------------------------------
  private StateData cached;
  private WriteStore activeWriter;

  public RingStateStoreProvider() {
    StateStoreProvider.$init$(this);
  }

  @Override
  public boolean unloaded() {
    return unloaded;
  }

  @Override
  public void unloaded_$eq(boolean value) {
    unloaded = value;
  }

  @Override
  public ReentrantReadWriteLock maintenanceLock() {
    return maintenanceLock;
  }

  @Override
  public void org$apache$spark$sql$execution$streaming$state$StateStoreProvider$_setter_$maintenanceLock_$eq(
      ReentrantReadWriteLock lock) {
    maintenanceLock = lock;
  }

  @Override
  public void init(
      StateStoreId stateStoreId,
      StructType keySchema,
      StructType valueSchema,
      KeyStateEncoderSpec keyStateEncoderSpec,
      boolean useColumnFamilies,
      StateStoreConf storeConf,
      Configuration hadoopConf,
      boolean useMultipleValuesPerKey,
      Option<StateSchemaProvider> stateSchemaProvider) {
    if (useColumnFamilies) {
      throw new UnsupportedOperationException(
          "RingStateStoreProvider does not support multiple column families "
              + "(transformWithState): Spark accepts only its RocksDB provider for that operator");
    }
    if (useMultipleValuesPerKey) {
      throw new UnsupportedOperationException(
          "RingStateStoreProvider does not support multiple values per key");
    }
    if (storeConf.enableStateStoreCheckpointIds()) {
      throw new UnsupportedOperationException(
          "RingStateStoreProvider supports spark.sql.streaming.stateStore.checkpointFormatVersion=1"
              + " only (the ring versions the state itself): unset it or set it to 1");
    }
    int prefixCols;
    if (keyStateEncoderSpec instanceof NoPrefixKeyStateEncoderSpec) {
      prefixCols = 0;
    } else if (keyStateEncoderSpec instanceof PrefixKeyScanStateEncoderSpec) {
      prefixCols = ((PrefixKeyScanStateEncoderSpec) keyStateEncoderSpec).numColsPrefixKey();
    } else {
      throw new UnsupportedOperationException(
          "RingStateStoreProvider does not support the key encoding "
              + keyStateEncoderSpec.getClass().getSimpleName() + " (range scans)");
    }
    this.stateStoreId = stateStoreId;
    this.storeConf = storeConf;
    this.hadoopConf = hadoopConf;
    this.keyFields = keySchema.length();
    this.valueFields = valueSchema.length();
    if (prefixCols > 0) {
      this.prefixTypes = new DataType[prefixCols];
      for (int i = 0; i < prefixCols; i++) {
        prefixTypes[i] = keySchema.fields()[i].dataType();
      }
    }
    this.config = RingConfig.from(hadoopConf, storeConf);
    this.ring = RingHttp.shared(config);
    this.storePath = StoreNaming.storePath(stateStoreId);
  }

  @Override
  public StateStoreId stateStoreId() {
    return stateStoreId;
  }

  @Override
  public synchronized void close() {
    cached = null;
    activeWriter = null;
  }

  @Override
  public void doMaintenance() {
    // snapshots and retention happen on the ring (nodes keep the last 100 versions)
  }

  @Override
  public scala.collection.immutable.Seq<StateStoreCustomMetric> supportedCustomMetrics() {
    return CollectionConverters.asScala(RingMetrics.ALL).toSeq();
  }

  @Override
  public String toString() {
    return "RingStateStoreProvider[" + storePath + "]";
  }

  // -- loading --------------------------------------------------------------------------

  /** What a load produced: the map to work on and how it got there. */
  static final class Loaded {
    StateData data;
    boolean detached;
    boolean hit;
    long restoreMs;
    long restoredRows;
  }

  @Override
  public StateStore getStore(
      long version, Option<String> uniqueId, boolean forceSnapshotOnCommit, boolean loadEmpty) {
    checkVersion(version, uniqueId);
    synchronized (this) {
      Loaded l = load(version, loadEmpty, true);
      if (l.data.pendingMiss) {
        // a read store of this task loaded it: the write store reports the restore
        l.hit = false;
        l.restoreMs = l.data.pendingRestoreMs;
        l.restoredRows = l.data.pendingRestoredRows;
        l.data.pendingMiss = false;
      }
      WriteStore store = new WriteStore(this, version, l, forceSnapshotOnCommit, nextEpoch(l.data.epoch));
      if (!l.detached) {
        activeWriter = store;
      }
      return store;
    }
  }

  @Override
  public ReadStateStore getReadStore(long version, Option<String> uniqueId) {
    checkVersion(version, uniqueId);
    synchronized (this) {
      return new ReadStore(this, version, load(version, false, false).data);
    }
  }

  private void checkVersion(long version, Option<String> uniqueId) {
    if (uniqueId != null && uniqueId.isDefined()) {
      throw new UnsupportedOperationException(
          "RingStateStoreProvider got a state checkpoint id: it supports "
              + "spark.sql.streaming.stateStore.checkpointFormatVersion=1 only");
    }
    if (version < 0) {
      throw new IllegalArgumentException("state store version " + version + " is negative");
    }
  }

  private Loaded load(long version, boolean loadEmpty, boolean forWrite) {
    Loaded l = new Loaded();
    if (cached != null && cached.version == version && activeWriter == null) {
      l.data = cached;
      l.hit = true;
      return l;
    }
    StateData data = new StateData(prefixTypes);
    data.version = version;
    if (version > 0 && !loadEmpty) {
      long started = System.nanoTime();
      RingHttp.Restored r;
      try {
        r = ring.restore(storePath, version, (k, v) -> {
          UnsafeRow key = new UnsafeRow(keyFields);
          key.pointTo(k, k.length);
          UnsafeRow value = new UnsafeRow(valueFields);
          value.pointTo(v, v.length);
          data.put(key, value);
        });
      } catch (IOException e) {
        throw new IllegalStateException(
            "RingStateStoreProvider: cannot load version " + version + " of " + storePath
                + " from the ring: " + e.getMessage(),
            e);
      }
      if (r.version != version) {
        throw new IllegalStateException(
            "RingStateStoreProvider: asked the ring for version " + version + " of " + storePath
                + " and got version " + r.version);
      }
      data.epoch = r.writerEpoch;
      l.restoreMs = (System.nanoTime() - started) / 1_000_000;
      l.restoredRows = r.rows;
      data.pendingRestoreMs = l.restoreMs;
      data.pendingRestoredRows = r.rows;
      LOG.info("restored {} version {} from the ring: {} rows, {} bytes in {} ms", storePath,
          version, r.rows, r.bytes, l.restoreMs);
    }
    if (forWrite) {
      long[] head = ring.head(storePath);
      if (head != null) {
        data.epoch = Math.max(data.epoch, head[1]);
      }
    }
    l.data = data;
    data.pendingMiss = true;
    if (activeWriter == null) {
      cached = data;
    } else {
      l.detached = true;
    }
    return l;
  }

  private static long nextEpoch(long floor) {
    long now = System.currentTimeMillis();
    return LAST_EPOCH.updateAndGet(prev -> Math.max(Math.max(prev + 1, floor + 1), now));
  }

  synchronized void committed(WriteStore store, long newVersion) {
    StateData data = store.data;
    data.version = newVersion;
    data.epoch = store.epoch;
    if (activeWriter == store) {
      activeWriter = null;
    } else if (activeWriter == null) {
      cached = data;
    }
  }

  synchronized void finished(WriteStore store, boolean broken) {
    if (activeWriter == store) {
      activeWriter = null;
      if (broken) {
        cached = null;
      }
    }
  }

  // -- what the stores call back -------------------------------------------------------

  String storePath() {
    return storePath;
  }

  RingConfig config() {
    return config;
  }

  RingHttp ring() {
    return ring;
  }

  StateStoreConf storeConf() {
    return storeConf;
  }

  Configuration hadoopConf() {
    return hadoopConf;
  }
}
