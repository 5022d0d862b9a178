package statestore.spark;

import java.io.ByteArrayOutputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.NoSuchElementException;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.ReentrantReadWriteLock;

import org.apache.hadoop.conf.Configuration;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.KeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.NoPrefixKeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.PrefixKeyScanStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.ReadStateStore;
import org.apache.spark.sql.execution.streaming.state.StateSchemaProvider;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreCheckpointInfo;
import org.apache.spark.sql.execution.streaming.state.StateStoreConf;
import org.apache.spark.sql.execution.streaming.state.StateStoreCustomMetric;
import org.apache.spark.sql.execution.streaming.state.StateStoreCustomSumMetric;
import org.apache.spark.sql.execution.streaming.state.StateStoreCustomTimingMetric;
import org.apache.spark.sql.execution.streaming.state.StateStoreId;
import org.apache.spark.sql.execution.streaming.state.StateStoreInstanceMetric;
import org.apache.spark.sql.execution.streaming.state.StateStoreIterator;
import org.apache.spark.sql.execution.streaming.state.StateStoreMetrics;
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import scala.Option;
import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.BoxedUnit;

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
  private static final String DEFAULT_CF = "default";
  private static final AtomicLong LAST_EPOCH = new AtomicLong();

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

  private static final List<StateStoreCustomMetric> METRICS =
      List.of(BYTES_COMMITTED, COMMIT_TIME, RESTORE_TIME, RESTORED_ROWS, CACHE_HITS, CACHE_MISSES,
          SNAPSHOTS);

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
    this.storePath =
        queryName(stateStoreId.checkpointRootLocation()) + "/" + stateStoreId.operatorId() + "/"
            + stateStoreId.partitionId() + "/" + safeName(stateStoreId.storeName());
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
    return CollectionConverters.asScala(METRICS).toSeq();
  }

  @Override
  public String toString() {
    return "RingStateStoreProvider[" + storePath + "]";
  }

  // -- loading --------------------------------------------------------------------------

  /** What a load produced: the map to work on and how it got there. */
  private static final class Loaded {
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
      WriteStore store = new WriteStore(version, l, forceSnapshotOnCommit, nextEpoch(l.data.epoch));
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
      return new ReadStore(version, load(version, false, false));
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

  private synchronized void committed(WriteStore store, long newVersion) {
    StateData data = store.data;
    data.version = newVersion;
    data.epoch = store.epoch;
    if (activeWriter == store) {
      activeWriter = null;
    } else if (activeWriter == null) {
      cached = data;
    }
  }

  private synchronized void finished(WriteStore store, boolean broken) {
    if (activeWriter == store) {
      activeWriter = null;
      if (broken) {
        cached = null;
      }
    }
  }

  // -- the map of one version -----------------------------------------------------------

  /** One version of the partition in memory, with a prefix index when Spark needs scans. */
  static final class StateData {
    final ConcurrentHashMap<UnsafeRow, UnsafeRow> map = new ConcurrentHashMap<>();
    final ConcurrentHashMap<UnsafeRow, Set<UnsafeRow>> prefixIndex;
    final UnsafeProjection prefixProjection;
    volatile long version;
    volatile long epoch;
    final AtomicLong bytes = new AtomicLong();
    // how this map was loaded, reported by the first write store that uses it
    long pendingRestoreMs;
    long pendingRestoredRows;
    boolean pendingMiss;

    StateData(DataType[] prefixTypes) {
      if (prefixTypes != null) {
        prefixIndex = new ConcurrentHashMap<>();
        prefixProjection = UnsafeProjection.create(prefixTypes);
      } else {
        prefixIndex = null;
        prefixProjection = null;
      }
    }

    private UnsafeRow prefixOf(UnsafeRow key) {
      synchronized (prefixProjection) {
        return prefixProjection.apply(key).copy();
      }
    }

    UnsafeRow put(UnsafeRow key, UnsafeRow value) {
      UnsafeRow prev = map.put(key, value);
      if (prev == null) {
        bytes.addAndGet(key.getSizeInBytes() + value.getSizeInBytes() + 64L);
        if (prefixIndex != null) {
          prefixIndex.computeIfAbsent(prefixOf(key), p -> ConcurrentHashMap.newKeySet()).add(key);
        }
      } else {
        bytes.addAndGet(value.getSizeInBytes() - prev.getSizeInBytes());
      }
      return prev;
    }

    UnsafeRow remove(UnsafeRow key) {
      UnsafeRow prev = map.remove(key);
      if (prev != null) {
        bytes.addAndGet(-(key.getSizeInBytes() + prev.getSizeInBytes() + 64L));
        if (prefixIndex != null) {
          UnsafeRow prefix = prefixOf(key);
          Set<UnsafeRow> keys = prefixIndex.get(prefix);
          if (keys != null) {
            keys.remove(key);
            if (keys.isEmpty()) {
              prefixIndex.remove(prefix, keys);
            }
          }
        }
      }
      return prev;
    }

    StateStoreIterator<UnsafeRowPair> iterator() {
      Iterator<Map.Entry<UnsafeRow, UnsafeRow>> it = map.entrySet().iterator();
      return wrap(new Iterator<UnsafeRowPair>() {
        @Override
        public boolean hasNext() {
          return it.hasNext();
        }

        @Override
        public UnsafeRowPair next() {
          Map.Entry<UnsafeRow, UnsafeRow> e = it.next();
          return new UnsafeRowPair(e.getKey(), e.getValue());
        }
      });
    }

    StateStoreIterator<UnsafeRowPair> prefixScan(UnsafeRow prefixKey) {
      if (prefixIndex == null) {
        throw new UnsupportedOperationException(
            "prefix scan on a state store created without a prefix key encoding");
      }
      Set<UnsafeRow> keys = prefixIndex.get(prefixKey);
      if (keys == null) {
        return wrap(java.util.Collections.emptyIterator());
      }
      Iterator<UnsafeRow> it = new ArrayList<>(keys).iterator();
      return wrap(new Iterator<UnsafeRowPair>() {
        private UnsafeRowPair next = advance();

        private UnsafeRowPair advance() {
          while (it.hasNext()) {
            UnsafeRow k = it.next();
            UnsafeRow v = map.get(k);
            if (v != null) {
              return new UnsafeRowPair(k, v);
            }
          }
          return null;
        }

        @Override
        public boolean hasNext() {
          return next != null;
        }

        @Override
        public UnsafeRowPair next() {
          if (next == null) {
            throw new NoSuchElementException();
          }
          UnsafeRowPair out = next;
          next = advance();
          return out;
        }
      });
    }
  }

  private static StateStoreIterator<UnsafeRowPair> wrap(Iterator<UnsafeRowPair> it) {
    return new StateStoreIterator<>(CollectionConverters.asScala(it), () -> BoxedUnit.UNIT);
  }

  private static void defaultFamily(String colFamilyName) {
    if (colFamilyName != null && !DEFAULT_CF.equals(colFamilyName)) {
      throw new UnsupportedOperationException(
          "RingStateStoreProvider has one column family ('default'), not '" + colFamilyName + "'");
    }
  }

  private static scala.collection.immutable.Set<String> families() {
    return CollectionConverters.asScala(Set.of(DEFAULT_CF)).toSet();
  }

  // -- stores ---------------------------------------------------------------------------

  /** A read-only view of one version. */
  private final class ReadStore implements ReadStateStore {
    private final long version;
    private final StateData data;

    ReadStore(long version, Loaded l) {
      this.version = version;
      this.data = l.data;
    }

    @Override
    public StateStoreId id() {
      return stateStoreId;
    }

    @Override
    public long version() {
      return version;
    }

    @Override
    public UnsafeRow get(UnsafeRow key, String colFamilyName) {
      defaultFamily(colFamilyName);
      return data.map.get(key);
    }

    @Override
    public scala.collection.Iterator<UnsafeRow> valuesIterator(UnsafeRow key, String cf) {
      throw new UnsupportedOperationException("RingStateStoreProvider: multiple values per key");
    }

    @Override
    public StateStoreIterator<UnsafeRowPair> prefixScan(UnsafeRow prefixKey, String cf) {
      defaultFamily(cf);
      return data.prefixScan(prefixKey);
    }

    @Override
    public StateStoreIterator<UnsafeRowPair> prefixScanWithMultiValues(UnsafeRow k, String cf) {
      throw new UnsupportedOperationException("RingStateStoreProvider: multiple values per key");
    }

    @Override
    public StateStoreIterator<UnsafeRowPair> iterator(String cf) {
      defaultFamily(cf);
      return data.iterator();
    }

    @Override
    public StateStoreIterator<UnsafeRowPair> iteratorWithMultiValues(String cf) {
      throw new UnsupportedOperationException("RingStateStoreProvider: multiple values per key");
    }

    @Override
    public void abort() {}

    @Override
    public void release() {}

    @Override
    public scala.collection.immutable.Set<String> allColumnFamilyNames() {
      return families();
    }

    @Override
    public String toString() {
      return "RingReadStateStore[" + storePath + ", version=" + version + "]";
    }
  }

  /** The store a task updates: version + 1 in the making. */
  private final class WriteStore implements StateStore {
    private static final int UPDATING = 0;
    private static final int COMMITTED = 1;
    private static final int ABORTED = 2;

    final long version;
    final StateData data;
    final long epoch;
    private final boolean forceSnapshot;
    private final Loaded loaded;
    private final HashMap<UnsafeRow, UnsafeRow> undo = new HashMap<>();
    private final LinkedHashMap<UnsafeRow, UnsafeRow> delta = new LinkedHashMap<>();
    private volatile int state = UPDATING;
    private long bytesCommitted;
    private long commitMs;
    private boolean snapshotSent;

    WriteStore(long version, Loaded loaded, boolean forceSnapshot, long epoch) {
      this.version = version;
      this.data = loaded.data;
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

    @Override
    public StateStoreId id() {
      return stateStoreId;
    }

    @Override
    public long version() {
      return version;
    }

    @Override
    public UnsafeRow get(UnsafeRow key, String cf) {
      defaultFamily(cf);
      return data.map.get(key);
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
      boolean snapshot =
          forceSnapshot || (config.snapshotInterval > 0 && newVersion % config.snapshotInterval == 0);
      long started = System.nanoTime();
      try {
        byte[] body = snapshot ? frame(data.map) : frame(delta);
        ring.commit(storePath, newVersion, epoch, snapshot, body);
        bytesCommitted = body.length;
        snapshotSent = snapshot;
      } catch (IOException | RuntimeException e) {
        rollback();
        state = ABORTED;
        finished(this, true);
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
      committed(this, newVersion);
      if (storeConf.commitValidationEnabled()) {
        StateStore.reportCommitToCoordinator(newVersion, stateStoreId, hadoopConf);
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
        finished(this, false);
      } else {
        state = ABORTED;
      }
    }

    @Override
    public StateStoreIterator<UnsafeRowPair> iterator(String cf) {
      defaultFamily(cf);
      return data.iterator();
    }

    @Override
    public StateStoreIterator<UnsafeRowPair> prefixScan(UnsafeRow prefixKey, String cf) {
      defaultFamily(cf);
      return data.prefixScan(prefixKey);
    }

    @Override
    public StateStoreMetrics metrics() {
      Map<StateStoreCustomMetric, Object> custom = new HashMap<>();
      custom.put(BYTES_COMMITTED, bytesCommitted);
      custom.put(COMMIT_TIME, commitMs);
      custom.put(RESTORE_TIME, loaded.restoreMs);
      custom.put(RESTORED_ROWS, loaded.restoredRows);
      custom.put(CACHE_HITS, loaded.hit ? 1L : 0L);
      custom.put(CACHE_MISSES, loaded.hit ? 0L : 1L);
      custom.put(SNAPSHOTS, snapshotSent ? 1L : 0L);
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
          stateStoreId.partitionId(), version + 1, Option.apply(null), Option.apply(null));
    }

    @Override
    public boolean hasCommitted() {
      return state == COMMITTED;
    }

    @Override
    public scala.collection.immutable.Set<String> allColumnFamilyNames() {
      return families();
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
    public scala.collection.Iterator<UnsafeRow> valuesIterator(UnsafeRow key, String cf) {
      throw new UnsupportedOperationException("RingStateStoreProvider: multiple values per key");
    }

    @Override
    public StateStoreIterator<UnsafeRowPair> prefixScanWithMultiValues(UnsafeRow k, String cf) {
      throw new UnsupportedOperationException("RingStateStoreProvider: multiple values per key");
    }

    @Override
    public StateStoreIterator<UnsafeRowPair> iteratorWithMultiValues(String cf) {
      throw new UnsupportedOperationException("RingStateStoreProvider: multiple values per key");
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
      return "RingStateStore[" + storePath + ", version=" + version + ", epoch=" + epoch + "]";
    }
  }

  // -- helpers --------------------------------------------------------------------------

  /** Frame rows as the coordinator endpoints read them (null value = delete). */
  static byte[] frame(Map<UnsafeRow, UnsafeRow> rows) {
    ByteArrayOutputStream buf = new ByteArrayOutputStream(Math.max(1024, rows.size() * 48));
    DataOutputStream out = new DataOutputStream(buf);
    try {
      for (Map.Entry<UnsafeRow, UnsafeRow> e : rows.entrySet()) {
        byte[] k = e.getKey().getBytes();
        UnsafeRow value = e.getValue();
        out.writeInt(k.length);
        if (value == null) {
          out.writeInt(-1);
          out.write(k);
        } else {
          byte[] v = value.getBytes();
          out.writeInt(v.length);
          out.write(k);
          out.write(v);
        }
      }
      out.flush();
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    return buf.toByteArray();
  }

  /** A checkpoint root as a ring query name: readable tail plus a hash of the whole. */
  static String queryName(String root) {
    String clean = root.replaceAll("[^A-Za-z0-9._-]+", "_").replaceAll("^[._-]+|[._-]+$", "");
    if (clean.length() > 100) {
      clean = clean.substring(clean.length() - 100).replaceAll("^[._-]+", "");
    }
    String hash = sha256(root).substring(0, 12);
    return clean.isEmpty() ? "q-" + hash : clean + "-" + hash;
  }

  static String safeName(String name) {
    String clean = name.replaceAll("[^A-Za-z0-9._-]+", "_");
    if (clean.equals(name) && !name.isEmpty() && name.length() <= 128 && !name.equals(".")
        && !name.equals("..")) {
      return name;
    }
    if (clean.length() > 100) {
      clean = clean.substring(0, 100);
    }
    return clean + "-" + sha256(name).substring(0, 12);
  }

  private static String sha256(String text) {
    try {
      byte[] d = MessageDigest.getInstance("SHA-256").digest(text.getBytes(StandardCharsets.UTF_8));
      StringBuilder sb = new StringBuilder();
      for (byte b : d) {
        sb.append(String.format("%02x", b));
      }
      return sb.toString();
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
  }
}
