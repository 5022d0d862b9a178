package statestore.spark;

import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Callable;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.ReentrantReadWriteLock;

import org.apache.hadoop.conf.Configuration;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.KeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.NoPrefixKeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.PrefixKeyScanStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.ReadStateStore;
import org.apache.spark.sql.execution.streaming.state.RecordType$;
import org.apache.spark.sql.execution.streaming.state.StateSchemaProvider;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreConf;
import org.apache.spark.sql.execution.streaming.state.StateStoreCustomMetric;
import org.apache.spark.sql.execution.streaming.state.StateStoreId;
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider;
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider$;
import org.apache.spark.sql.execution.streaming.state.SupportsFineGrainedReplay;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.util.NextIterator;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import scala.Enumeration;
import scala.Option;
import scala.Tuple4;
import scala.jdk.javaapi.CollectionConverters;

/**
 * A Spark {@link StateStoreProvider} whose state lives on a statestore ring: the provider's
 * lifecycle and its cache of the last committed version (docs/spark.md says what each rule
 * is for and how it is tested).
 *
 * <p>The cached version is used only when the ring's head is that version and epoch, else
 * the version is restored from the ring ({@code GET /v1/stores/.../state?version=N}). Stores
 * hold a version without changing it ({@link StateData}, copy on write); a write store's
 * commit goes out through {@link StateCommit}, and its epoch follows {@link #nextEpoch}. No
 * state is written under the checkpoint's partition folders, only a marker file per store
 * ({@link StoreNaming#markPartition}) so Spark's state data source finds every partition.
 * Maintenance (snapshots, retention) is done by the ring.
 *
 * <p>As {@link SupportsFineGrainedReplay} it gives Spark's state reader each version's own
 * changes ({@code readChangeFeed}) and a version replayed change by change from an earlier
 * one ({@code snapshotStartBatchId}), both read from the ring's per-version deltas
 * ({@link VersionChanges}).
 */
public final class RingStateStoreProvider implements StateStoreProvider, SupportsFineGrainedReplay {
  private static final Logger LOG = LoggerFactory.getLogger(RingStateStoreProvider.class);
  /** The last epoch this JVM handed out, per ring store. */
  private static final ConcurrentHashMap<String, Long> LAST_EPOCH = new ConcurrentHashMap<>();
  private static final AtomicLong ANONYMOUS = new AtomicLong();

  // -- fields of the Scala trait --------------------------------------------------------
  private volatile boolean unloaded;
  private ReentrantReadWriteLock maintenanceLock = new ReentrantReadWriteLock(true);

  // -- set by init ----------------------------------------------------------------------
  private StateStoreId stateStoreId;
  private StateStoreConf storeConf;
  private Configuration hadoopConf;
  private RingConfig config;
  private RingHttp ring;
  private RingDirect direct;
  private String storePath;
  /** The store's name before names carried the query id (null when they are the same). */
  private String legacyPath;
  private int keyFields;
  private int valueFields;
  private StructType keySchema;
  private StructType valueSchema;
  /** Whether a restored row was checked against the schemas ({@code formatValidation}). */
  private volatile boolean validated;
  private DataType[] prefixTypes;

  // -- the in-memory versions -----------------------------------------------------------
  private volatile StateData cached;

  /**
   * The head a read store read for {@code headVersion} in task {@code headTask}: the write
   * store that task opens next on the same version uses it instead of asking the ring again
   * (one head read per task, {@link #headFor}).
   */
  private RingHttp.Head taskHead;
  private long headTask;
  private long headVersion = -1;

  public RingStateStoreProvider() {
    StateStoreProvider.$init$(this);
    SupportsFineGrainedReplay.$init$(this);
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
    this.keySchema = keySchema;
    this.valueSchema = valueSchema;
    if (prefixCols > 0) {
      this.prefixTypes = new DataType[prefixCols];
      for (int i = 0; i < prefixCols; i++) {
        prefixTypes[i] = keySchema.fields()[i].dataType();
      }
    }
    this.config = RingConfig.from(hadoopConf, storeConf);
    StateBudget.setLimit(config.cacheBytes);
    this.ring = RingHttp.shared(config);
    this.direct = config.direct ? RingDirect.shared(config) : null;
    String queryId = StoreNaming.queryId(stateStoreId.checkpointRootLocation(), hadoopConf);
    this.storePath = StoreNaming.storePath(stateStoreId, queryId);
    String legacy = StoreNaming.storePath(stateStoreId, null);
    this.legacyPath = legacy.equals(storePath) ? null : legacy;
    StoreNaming.markPartition(stateStoreId, hadoopConf);
    LIVE.computeIfAbsent(stateStoreId, id -> new CopyOnWriteArrayList<>()).add(this);
  }

  @Override
  public StateStoreId stateStoreId() {
    return stateStoreId;
  }

  @Override
  public synchronized void close() {
    LIVE.computeIfPresent(stateStoreId, (id, all) -> {
      all.remove(this);
      return all.isEmpty() ? null : all;
    });
    StateData old = cached;
    cached = null;
    drop(old);
  }

  /**
   * The providers of this JVM by their store ({@link #readAhead} finds a task's by it): more
   * than one at times (Spark's state reader, or a task's provider loaded again before the old
   * one is closed), each with its own versions.
   */
  private static final ConcurrentHashMap<StateStoreId, List<RingStateStoreProvider>> LIVE =
      new ConcurrentHashMap<>();

  /** Keys whose base values the read-aheads of this JVM brought (tests, the bench). */
  public static long readAheadKeys() {
    return LazyBase.READ_AHEAD_KEYS.get();
  }

  /** Lookups the read-aheads of this JVM sent (tests, the bench). */
  public static long readAheadLookups() {
    return LazyBase.READ_AHEAD_LOOKUPS.get();
  }

  /** Of {@link #readAheadKeys}, the keys read from their blocks (tests, the bench). */
  public static long readAheadBlockKeys() {
    return LazyBase.READ_AHEAD_BLOCK_KEYS.get();
  }

  /** Read-ahead lookups and block reads of this JVM that failed (tests, the bench). */
  public static long readAheadFailed() {
    return LazyBase.READ_AHEAD_FAILED.get();
  }

  /** Rows a read-ahead takes at once ({@code ReadAheadExec}). */
  public static int readAheadRows() {
    return LazyBase.readAheadRows();
  }

  /**
   * Bytes of rows and keys a read-ahead window holds at most (a quarter of the memo of
   * looked-up rows: not counted in {@code cacheBytes}, so kept small).
   */
  public static long readAheadBytes() {
    return LazyBase.memoBytes() / 4;
  }

  /**
   * Holders of versions that read-aheads read: from {@code Long.MIN_VALUE} up, apart from
   * task attempts' ids and from the negative ids of stores opened outside a task.
   */
  private static final AtomicLong AHEAD_HOLDER = new AtomicLong(Long.MIN_VALUE);

  /**
   * A batch's {@code keys} of store {@code id}, about to be read from version
   * {@code version} one by one ({@code ReadAheadExec}, under a streaming aggregation's
   * restore): when that version is loaded lazily here, what its base holds of them comes
   * now, in a few lookups ({@link StateData#readAhead}). Nothing otherwise, and nothing
   * with {@code spark.statestore.readAhead=false}; best effort, never an error.
   */
  public static void readAhead(StateStoreId id, long version, List<UnsafeRow> keys) {
    List<RingStateStoreProvider> all = LIVE.get(id);
    if (all == null) {
      return;
    }
    for (RingStateStoreProvider p : all) {
      if (!p.config.readAhead) {
        continue;
      }
      // the version is held while it is read (a holder of its own, for this call): another
      // provider of the store (an earlier run's, a reader's) closed meanwhile, or a commit
      // that moves the cache on, lets it go only after, never with its spill store mid-read
      long holder = AHEAD_HOLDER.incrementAndGet();
      StateData data;
      synchronized (p) {
        data = p.cached;
        if (data == null || data.version != version) {
          continue;
        }
        data.hold(holder);
      }
      try {
        data.readAhead(keys, p.config.readAheadMinKeys); // of each holding it
      } catch (RuntimeException e) {
        // best effort: the restore reads those keys one by one, and says what is wrong
        LOG.debug("read-ahead of {} version {} skipped: {}", p.storePath, version,
            e.toString());
      } finally {
        synchronized (p) {
          data.release(holder);
          p.drop(data); // let go now if nothing else holds or caches it
        }
      }
    }
  }

  /**
   * Whether a read-ahead of {@code version} of {@code id} may bring anything: true while a
   * provider of the store in this JVM that reads ahead holds that version lazily, or none
   * holds it yet; false once those that hold it hold it whole (a build, or a lazy version
   * the prefetch finished: a whole version never turns lazy again). Another provider of the
   * store holding another version (a reader's, an earlier run's) does not count. Version 0,
   * the empty state a query's first batch starts from, is never lazy (and never cached).
   */
  public static boolean readsAhead(StateStoreId id, long version) {
    if (version == 0) {
      return false;
    }
    List<RingStateStoreProvider> all = LIVE.get(id);
    if (all == null) {
      return true;
    }
    boolean held = false;
    for (RingStateStoreProvider p : all) {
      if (!p.config.readAhead) {
        continue;
      }
      StateData data = p.cached; // volatile: no wait on a provider's lock (a restore's)
      if (data != null && data.version == version) {
        if (data.remote != null) {
          return true;
        }
        held = true;
      }
    }
    return !held;
  }

  /** Write stores' puts and removes that took a read store's answer for their key (bench). */
  public static long recalledReads() {
    return StateData.RECALLED.sum();
  }

  /** Those that read the spilled or lazy version again for it (bench). */
  public static long recallMisses() {
    return StateData.RECALL_MISSES.sum();
  }

  /**
   * A version that no store holds and this provider no longer caches leaves the executor's
   * cache (and its spill store is deleted).
   */
  private void drop(StateData data) {
    if (data != null && data != cached && data.unheld()) {
      data.retire();
    }
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

  /** What a load produced: the version to work on and how it got there. */
  static final class Loaded {
    StateData data;
    boolean hit;
    /** The ring's head was read for this store's task (once, {@link #headFor}). */
    long headReads;
    long restoreMs;
    long restoredRows;
    /** Bytes read from the ring for the load ({@code ringBytesFetched}). */
    long restoredBytes;
  }

  private static long taskId() {
    TaskContext ctx = TaskContext.get();
    // outside a task every store is its own holder
    return ctx != null ? ctx.taskAttemptId() : -ANONYMOUS.incrementAndGet();
  }

  @Override
  public StateStore getStore(
      long version, Option<String> uniqueId, boolean forceSnapshotOnCommit, boolean loadEmpty) {
    checkVersion(version, uniqueId);
    long task = taskId();
    synchronized (this) {
      Loaded l = new Loaded();
      RingHttp.Head head = headFor(task, version, l);
      load(version, loadEmpty, head, task, l);
      if (l.data.pendingMiss) {
        // a read store of this task loaded it: the write store reports the restore
        l.hit = false;
        l.restoreMs = l.data.pendingRestoreMs;
        l.restoredRows = l.data.pendingRestoredRows;
        l.restoredBytes = l.data.pendingRestoredBytes;
        l.data.pendingMiss = false;
      }
      long epoch = nextEpoch(head, l.data.epoch);
      // a version loaded from the legacy name has no base under the new one: a snapshot
      boolean snapshot = forceSnapshotOnCommit || loadEmpty || l.data.legacy;
      return new WriteStore(this, version, l, snapshot, epoch, task);
    }
  }

  @Override
  public ReadStateStore getReadStore(long version, Option<String> uniqueId) {
    checkVersion(version, uniqueId);
    long task = taskId();
    synchronized (this) {
      RingHttp.Head head = head();
      taskHead = head;
      headTask = task;
      headVersion = version;
      ReadStore store =
          new ReadStore(this, version, load(version, false, head, task, new Loaded()).data, task);
      TaskContext ctx = TaskContext.get();
      if (ctx != null) {
        ctx.addTaskCompletionListener((org.apache.spark.util.TaskCompletionListener) c -> {
          store.release();
        });
      }
      return store;
    }
  }

  @Override
  public StateStore upgradeReadStoreToWriteStore(
      ReadStateStore readStore, long version, Option<String> uniqueId, boolean forceSnapshot) {
    readStore.release();
    return getStore(version, uniqueId, forceSnapshot, false);
  }

  // -- fine-grained replay: Spark's state reader ---------------------------------------

  /**
   * Version {@code endVersion} as {@code snapshotVersion} replayed with the changes of every
   * version after it, for Spark's state reader ({@code snapshotStartBatchId}). Where
   * HDFS-backed needs a snapshot file at {@code snapshotVersion}, the ring rebuilds that
   * version from whatever its chain holds (its own snapshot there, or the nearest earlier one
   * and the deltas above it); the changes after it are each version's own delta.
   */
  @Override
  public ReadStateStore replayReadStateFromSnapshot(
      long snapshotVersion, long endVersion, Option<String> snapshotId, Option<String> endId) {
    checkVersion(snapshotVersion, snapshotId);
    checkVersion(endVersion, endId);
    long task = taskId();
    synchronized (this) {
      StateData data = replay(snapshotVersion, endVersion);
      data.hold(task);
      return new ReadStore(this, endVersion, data, task);
    }
  }

  /**
   * {@link #replayReadStateFromSnapshot} as a store to update (never read-only). Its commit
   * is a snapshot over as many shards as the ring's {@code endVersion} has, so the new version
   * is the replayed state plus the store's changes, whatever the ring's chain below holds.
   */
  @Override
  public StateStore replayStateFromSnapshot(long snapshotVersion, long endVersion,
      boolean readOnly, Option<String> snapshotId, Option<String> endId) {
    if (readOnly) {
      throw new IllegalArgumentException("RingStateStoreProvider.replayStateFromSnapshot gives a "
          + "store to update: use replayReadStateFromSnapshot for a read-only one");
    }
    checkVersion(snapshotVersion, snapshotId);
    checkVersion(endVersion, endId);
    long task = taskId();
    synchronized (this) {
      Loaded l = new Loaded();
      RingHttp.Head head = headFor(task, endVersion, l);
      l.data = replay(snapshotVersion, endVersion);
      l.data.shards = Math.max(l.data.shards, shardsAt(endVersion));
      l.data.hold(task);
      return new WriteStore(this, endVersion, l, true, nextEpoch(head, l.data.epoch), task);
    }
  }

  private StateData replay(long snapshotVersion, long endVersion) {
    if (snapshotVersion < 1 || endVersion < snapshotVersion) {
      throw new IllegalArgumentException("RingStateStoreProvider: cannot replay version "
          + endVersion + " from version " + snapshotVersion + ": the start must be at least 1 "
          + "and at most the end");
    }
    StateData data = whole(snapshotVersion);
    for (long v = snapshotVersion + 1; v <= endVersion; v++) {
      VersionChanges.apply(data, changes(v));
    }
    data.version = endVersion;
    return data;
  }

  /**
   * Each change of versions {@code startVersion} to {@code endVersion} as Spark's state
   * reader wants it ({@code readChangeFeed}): (PUT_RECORD or DELETE_RECORD, key, value or
   * null, batch id = version - 1), version by version, each version's rows in the order of
   * its delta (by key group and key).
   */
  @Override
  public NextIterator<Tuple4<Enumeration.Value, UnsafeRow, UnsafeRow, Object>>
      getStateStoreChangeDataReader(long startVersion, long endVersion,
          Option<String> colFamilyName, Option<String> endId) {
    checkVersion(startVersion, endId);
    if (colFamilyName != null && colFamilyName.isDefined()) {
      defaultFamilyOnly(colFamilyName.get());
    }
    return new NextIterator<>() {
      private long next = startVersion;
      private long batch;
      private java.util.Iterator<VersionChanges.Change> rows = java.util.Collections.emptyIterator();

      @Override
      public Tuple4<Enumeration.Value, UnsafeRow, UnsafeRow, Object> getNext() {
        while (!rows.hasNext()) {
          if (next > endVersion) {
            finished_$eq(true);
            return null;
          }
          rows = changes(next).iterator();
          batch = next - 1;
          next++;
        }
        VersionChanges.Change c = rows.next();
        Enumeration.Value type = c.value() == null
            ? RecordType$.MODULE$.DELETE_RECORD() : RecordType$.MODULE$.PUT_RECORD();
        return new Tuple4<>(type, c.key(), c.value(), batch);
      }

      @Override
      public void close() {
        rows = java.util.Collections.emptyIterator();
      }
    };
  }

  private static void defaultFamilyOnly(String name) {
    if (!StoreBase.DEFAULT_CF.equals(name)) {
      throw new UnsupportedOperationException("RingStateStoreProvider has one column family "
          + "('default'), not '" + name + "'");
    }
  }

  /** The changes version {@code version} made, from the ring. */
  private List<VersionChanges.Change> changes(long version) {
    long deadline = System.nanoTime() + config.restoreTimeoutMs * 1_000_000L;
    RingDirect reader = direct != null ? direct : RingDirect.shared(config);
    String source = storePath;
    try {
      if (legacyPath != null && ring.head(storePath) == null) {
        source = legacySource(version, null);
      }
      return VersionChanges.read(reader, source, version, keyFields, valueFields, deadline,
          this::whole);
    } catch (IOException e) {
      throw new IllegalStateException("RingStateStoreProvider: cannot read the changes of "
          + "version " + version + " of " + storePath + " from the ring: " + e.getMessage(), e);
    }
  }

  /** How many shards the ring's {@code version} of this store is spread over. */
  private int shardsAt(long version) {
    RingDirect reader = direct != null ? direct : RingDirect.shared(config);
    long deadline = System.nanoTime() + config.restoreTimeoutMs * 1_000_000L;
    try {
      RingDirect.VersionManifests m = reader.versionManifests(storePath, version, deadline);
      ManifestCodec.Manifest top = m.hasDelta() ? m.delta() : m.snapshot();
      return top == null ? 1 : VersionChanges.shardsOf(top.positions());
    } catch (IOException e) {
      throw new IllegalStateException("RingStateStoreProvider: cannot read version " + version
          + " of " + storePath + " from the ring: " + e.getMessage(), e);
    }
  }

  /** The whole state of {@code version}, restored from the ring (not cached). */
  private StateData whole(long version) {
    if (version == 0) {
      return new StateData(prefixTypes, keyFields, valueFields);
    }
    return restore(version, new Loaded(), legacySource(version, head()));
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

  /**
   * The ring's head for task {@code task}'s write store of {@code version}: what this task's
   * read store of the same version read a moment ago, else read now. Either way it is one
   * head read of the task ({@code l.headReads}, the {@code ringHeadReads} metric). Reusing
   * it is as safe as the read itself: a writer that commits between the two reads is fenced
   * at this store's commit (409 stale_epoch: the task fails and Spark retries it).
   */
  private RingHttp.Head headFor(long task, long version, Loaded l) {
    boolean readByTask = headVersion >= 0 && headTask == task;
    boolean reuse = readByTask && headVersion == version;
    headVersion = -1; // used once: a later store of the task asks the ring
    // the read store reports no metrics: its read is counted here
    l.headReads = reuse || !readByTask ? 1 : 2;
    return reuse ? taskHead : head();
  }

  private RingHttp.Head head() {
    try {
      long t0 = System.nanoTime();
      RingHttp.Head h = ring.head(storePath);
      if (Trace.ON) {
        Trace.log("head %s %.1fms", storePath, (System.nanoTime() - t0) / 1e6);
      }
      return h;
    } catch (IOException e) {
      throw new IllegalStateException(
          "RingStateStoreProvider: cannot read the head of " + storePath + " from the ring: "
              + e.getMessage(),
          e);
    }
  }

  /**
   * The version to work on, held for {@code task}: an empty one for version 0 or
   * {@code loadEmpty}; the cached one only when the ring's head is that very version and
   * epoch (a version re-committed elsewhere, or an older version asked for, is restored);
   * else restored from the ring.
   */
  private Loaded load(long version, boolean loadEmpty, RingHttp.Head head, long task, Loaded l) {
    StateData data;
    if (loadEmpty || version == 0) {
      data = new StateData(prefixTypes, keyFields, valueFields);
      data.version = version;
      if (cached != null && cached.shards > 1) {
        data.shards = cached.shards;
      }
    } else if (cached != null && cached.version == version && head != null
        && head.version == version && head.epoch == cached.epoch) {
      data = cached;
      l.hit = true;
      LazyBase base = data.remote;
      if (base != null && version - base.confirmed >= lazyHorizon()) {
        data = rebased(data, version, l);
      }
    } else {
      if (cached != null && cached.version == version) {
        LOG.info("{}: cached version {} (epoch {}) is not the ring's head {}: restoring",
            storePath, version, cached.epoch, head);
      }
      String source = legacySource(version, head);
      data = source.equals(storePath) ? lazyLoad(version, l) : null;
      if (data == null) {
        data = restore(version, l, source);
      } else {
        Prefetcher.schedule(data, config.prefetchBytesPerSec);
      }
      StateData old = cached;
      cached = data;
      drop(old);
    }
    data.hold(task);
    l.data = data;
    return l;
  }

  /**
   * Where a query started by a provider that named stores by the checkpoint path alone keeps
   * its state: the legacy name, when the new name has no version yet and the legacy one has
   * {@code version}; else the store's own name.
   */
  private String legacySource(long version, RingHttp.Head head) {
    if (legacyPath == null || head != null) {
      return storePath;
    }
    RingHttp.Head old;
    try {
      old = ring.head(legacyPath);
    } catch (IOException e) {
      return storePath;
    }
    if (old == null || old.version < version) {
      return storePath;
    }
    LOG.info("{}: version {} comes from the store's name before query ids ({}); the next "
        + "commit is a snapshot under the new name", storePath, version, legacyPath);
    return legacyPath;
  }

  /**
   * Version {@code version} loaded lazily ({@code spark.statestore.lazyRestore}), or null
   * when it cannot be: the coordinator path or a relayed plan, an operator that scans by
   * prefix, a version whose commit did not count its keys (before 0.3.0, or the coordinator
   * path), or a base with whole chunks. Reads each shard's chain and the deltas above its base
   * (folded into the version's map); the base's chunks, their indexes too, stay on the ring
   * until a key is read ({@link LazyBase}) or a scan needs them all.
   */
  private StateData lazyLoad(long version, Loaded l) {
    long started = System.nanoTime();
    long deadline = started + config.restoreTimeoutMs * 1_000_000L;
    List<List<ManifestCodec.Manifest>> chains = lazyChains(version, deadline);
    return chains == null ? null : lazyLoad(version, l, chains, started, deadline);
  }

  /**
   * A lazily loaded version whose base was last seen to start its chains
   * {@link #lazyHorizon} versions ago: the chains of {@code version} read again. Still
   * starting at that base, the ring needs the base to restore the version it now holds, so the
   * version stays lazy (and is checked again a horizon later). Starting at a newer snapshot
   * (the nodes folded one since), the version is loaded lazily again over that one (the
   * deltas above it), before the ring's retention or thinning may drop the
   * old base's chunks; the old version is dropped. Made whole only when it cannot be loaded
   * lazily any more (the newer base has whole chunks, say): a version kept for a long time
   * costs a chain read every horizon and the deltas above every newer base, not the whole state.
   * Between two checks the base stays: thinning drops a snapshot only once two newer ones
   * were written, 2 x {@code --snapshot-every} versions at least (more than the horizon while
   * that is 4 or more; 10 by default), and its chunks 10 compaction passes after that. A base
   * dropped sooner is replaced by the read that finds it gone ({@link #newerBase}).
   */
  private StateData rebased(StateData data, long version, Loaded l) {
    long started = System.nanoTime();
    long deadline = started + config.restoreTimeoutMs * 1_000_000L;
    List<List<ManifestCodec.Manifest>> chains = lazyChains(version, deadline);
    if (chains != null && data.remote.startsEvery(chains)) {
      data.remote.confirmed = version;
      return data;
    }
    StateData fresh = chains == null ? null : lazyLoad(version, l, chains, started, deadline);
    if (fresh == null) {
      data.materialize(); // read whole while its base is still on the ring
      return data;
    }
    LOG.info("{} version {}: its chains start at a newer snapshot ({}) than the lazy "
        + "version's base ({}): loaded lazily over it", storePath, version,
        chains.get(0).get(0).version(), data.remote.oldest());
    Prefetcher.schedule(fresh, config.prefetchBytesPerSec);
    StateData old = cached;
    cached = fresh;
    drop(old);
    return fresh;
  }

  /**
   * The chain of every shard of {@code version} (each from its base, read at once after
   * shard 0's, which says how many there are), or null when this provider does not load
   * lazily or the version's commit did not record its key count.
   */
  private List<List<ManifestCodec.Manifest>> lazyChains(long version, long deadline) {
    if (!config.lazyRestore || !config.direct || config.relayed() || prefixTypes != null) {
      return null;
    }
    List<List<ManifestCodec.Manifest>> chains = new ArrayList<>();
    try {
      List<ManifestCodec.Manifest> first = direct.chain(StateCommit.shardPath(storePath, 0),
          version, deadline);
      Map<String, Object> top = first.get(first.size() - 1).positions();
      if (!(top.get("keys") instanceof Long)) {
        return null;
      }
      int shards = VersionChanges.shardsOf(top);
      chains.add(first);
      List<Callable<List<ManifestCodec.Manifest>>> rest = new ArrayList<>();
      for (int shard = 1; shard < shards; shard++) {
        String path = StateCommit.shardPath(storePath, shard);
        rest.add(() -> direct.chain(path, version, deadline));
      }
      chains.addAll(RingDirect.together(rest, deadline,
          "reading the chains of " + storePath + " version " + version));
    } catch (IOException e) {
      throw new IllegalStateException("RingStateStoreProvider: cannot load version " + version
          + " of " + storePath + " from the ring: " + e.getMessage(), e);
    }
    return chains;
  }

  /**
   * Version {@code version} loaded lazily from its shards' {@code chains}, or null when a
   * base has whole chunks.
   */
  private StateData lazyLoad(long version, Loaded l, List<List<ManifestCodec.Manifest>> chains,
      long started, long deadline) {
    List<ManifestCodec.Manifest> first = chains.get(0);
    long keys = (Long) first.get(first.size() - 1).positions().get("keys");
    List<ManifestCodec.Manifest> bases = blockedBases(chains);
    if (bases == null) {
      return null;
    }
    StateData data = new StateData(prefixTypes, keyFields, valueFields);
    data.version = version;
    data.shards = chains.size();
    long bytes = 0;
    long rows = 0;
    long[] epochs = new long[chains.size()];
    try {
      for (int shard = 0; shard < chains.size(); shard++) {
        List<ManifestCodec.Manifest> chain = chains.get(shard);
        epochs[shard] = chain.get(chain.size() - 1).epoch();
        for (ManifestCodec.Manifest m : chain.subList(1, chain.size())) {
          for (ManifestCodec.ChunkRef ref : m.chunks()) {
            bytes += ref.size();
            for (ChunkCodec.Row row : direct.chunkRows(m, ref, deadline)) {
              UnsafeRow key = new UnsafeRow(keyFields);
              key.pointTo(row.key(), row.key().length);
              if (row.value() == null) {
                data.loadRemove(key);
              } else {
                UnsafeRow value = new UnsafeRow(valueFields);
                value.pointTo(row.value(), row.value().length);
                validate(key, value, version);
                data.loadPut(key, value);
                rows++;
              }
            }
          }
        }
      }
      data.readFrom(lazyBase(bases, null));
    } catch (IOException | ChunkCodec.CorruptChunkException e) {
      data.retire(); // what it loaded leaves the cache now, not when it is collected
      throw new IllegalStateException("RingStateStoreProvider: cannot load version " + version
          + " of " + storePath + " from the ring: " + e.getMessage(), e);
    }
    data.reads = data.remote.reads;
    if (!validated && storeConf.formatValidationEnabled()) {
      // the first row of the base is checked, as a whole restore checks its first row
      try {
        byte[][] row = data.remote.firstRow();
        if (row != null) {
          UnsafeRow key = new UnsafeRow(keyFields);
          key.pointTo(row[0], row[0].length);
          UnsafeRow value = new UnsafeRow(valueFields);
          value.pointTo(row[1], row[1].length);
          validate(key, value, version);
        }
      } catch (RuntimeException e) {
        data.retire(); // its base and what it read of it let go now
        throw e;
      }
    }
    data.lazyCount.set(keys);
    data.epoch = epochs[0];
    data.shardEpochs = epochs;
    loaded(l, data, started, rows, bytes);
    LOG.info("loaded {} version {} lazily: {} keys, {} rows of deltas and {} bytes read, {} "
        + "shards in {} ms", storePath, version, keys, rows, bytes, chains.size(), l.restoreMs);
    return data;
  }

  /** Each shard's base (the first manifest of its chain), or null when one has whole chunks. */
  private static List<ManifestCodec.Manifest> blockedBases(
      List<List<ManifestCodec.Manifest>> chains) {
    List<ManifestCodec.Manifest> bases = new ArrayList<>();
    for (List<ManifestCodec.Manifest> chain : chains) {
      for (ManifestCodec.ChunkRef ref : chain.get(0).chunks()) {
        if (!ref.blocked()) {
          return null;
        }
      }
      bases.add(chain.get(0));
    }
    return bases;
  }

  /**
   * The lazy base over {@code bases} (each shard's first manifest, blocked chunks): nothing
   * read, each chunk's index is read when a read needs it ({@link LazyBase}). {@code reads}:
   * the counters of the base it replaces (null: a new version's).
   */
  private LazyBase lazyBase(List<ManifestCodec.Manifest> bases, LazyBase.Reads reads) {
    List<List<LazyBase.Part>> parts = new ArrayList<>();
    for (ManifestCodec.Manifest base : bases) {
      List<LazyBase.Part> shard = new ArrayList<>(base.chunks().size());
      for (ManifestCodec.ChunkRef ref : base.chunks()) {
        String key = RingWriter.chunkKey(base.store(), base.version(), ref.name());
        shard.add(new LazyBase.Part(key, base.version(), ref));
      }
      parts.add(shard);
    }
    return new LazyBase(direct, config.restoreTimeoutMs, bases, parts, reads, this::newerBase);
  }

  /**
   * {@link LazyBase.Rebaser}: the base {@code version}'s chains start at now, read from the
   * ring after a read of {@code stale} failed, or null when they still start at
   * {@code stale} or that base has whole chunks. The provider reads the chains again at the
   * horizon ({@link #rebased}); this covers a base the ring dropped before that, on nodes
   * that fold and thin snapshots faster than the horizon ({@code --snapshot-every} below 4).
   * Takes no lock of the provider's.
   */
  private LazyBase newerBase(long version, LazyBase stale) {
    long deadline = System.nanoTime() + config.restoreTimeoutMs * 1_000_000L;
    List<List<ManifestCodec.Manifest>> chains = lazyChains(version, deadline);
    if (chains == null || chains.size() != stale.bases.size() || stale.startsEvery(chains)) {
      return null;
    }
    List<ManifestCodec.Manifest> bases = blockedBases(chains);
    if (bases == null) {
      return null;
    }
    LazyBase fresh = lazyBase(bases, stale.reads);
    LOG.warn("{} version {}: its lazy base ({}) could not be read and its chains start at a "
        + "newer snapshot ({}) now: reading that one (the nodes fold and thin snapshots "
        + "faster than the provider's checks: --snapshot-every below 4?)", storePath, version,
        stale.oldest(), fresh.oldest());
    return fresh;
  }

  /**
   * Versions after which a lazily loaded version is made whole: {@link #LAZY_HORIZON}, or half
   * the versions the ring keeps for this query (Spark's {@code minBatchesToRetain}) when that
   * is fewer, so its base's chunks are still there when it is read whole. The base is the
   * newest snapshot when the version is loaded; on nodes that thin snapshots
   * ({@code --thin-snapshots}) it stays until two newer ones were written, at least the
   * nodes' {@code --snapshot-every} versions later (10 by default), and its chunks 10
   * compaction passes after that (docs/operations.md, "Snapshots").
   */
  private long lazyHorizon() {
    int retain = StateCommit.retain(this);
    return Math.max(1, Math.min(LAZY_HORIZON, (retain > 0 ? retain : 100) / 2));
  }

  /** The most versions a lazily loaded version stays lazy (see {@link #lazyHorizon}). */
  static final long LAZY_HORIZON = 5;

  /** What a load read, for the metrics of the store that uses it. */
  private static void loaded(Loaded l, StateData data, long started, long rows, long bytes) {
    l.restoreMs = (System.nanoTime() - started) / 1_000_000;
    l.restoredRows = rows;
    l.restoredBytes = bytes;
    data.pendingRestoreMs = l.restoreMs;
    data.pendingRestoredRows = rows;
    data.pendingRestoredBytes = bytes;
    data.pendingMiss = true;
  }

  private StateData restore(long version, Loaded l, String source) {
    StateData data = new StateData(prefixTypes, keyFields, valueFields);
    data.version = version;
    long started = System.nanoTime();
    long rows = 0;
    long bytes = 0;
    long deadline = started + config.restoreTimeoutMs * 1_000_000L;
    long[] epochs = new long[1];
    try {
      int shards = 1;
      for (int shard = 0; shard < shards; shard++) {
        int s = shard;
        int n = shards;
        int[] attempts = {0};
        String path = StateCommit.shardPath(source, shard);
        RingHttp.RestoreTarget target = () -> {
          if (attempts[0]++ > 0) {
            // an attempt broke off: drop what it delivered of this shard
            if (n == 1) {
              data.clear();
            } else {
              data.removeIf(k -> StateCommit.shardOf(k, n) == s);
            }
          }
          return (k, v) -> {
            UnsafeRow key = new UnsafeRow(keyFields);
            key.pointTo(k, k.length);
            if (v == null) { // a delete of the direct path's chain
              data.remove(key);
              return;
            }
            UnsafeRow value = new UnsafeRow(valueFields);
            value.pointTo(v, v.length);
            validate(key, value, version);
            data.put(key, value);
          };
        };
        // star is read by the JVM itself; a line or tree plan runs through the nodes' relay,
        // whose folded rows one node streams here as frames
        RingHttp.Restored r = config.direct && !config.relayed()
            ? direct.restore(path, version, deadline, target)
            : ring.restore(path, version, target);
        if (r.version != version) {
          throw new IllegalStateException(
              "RingStateStoreProvider: asked the ring for version " + version + " of " + path
                  + " and got version " + r.version);
        }
        if (shard == 0) {
          data.epoch = r.writerEpoch;
          shards = StateCommit.shardsOf(r.positions);
          data.shards = shards;
          epochs = new long[shards];
        }
        epochs[shard] = r.writerEpoch; // what the next version of this shard builds on
        rows += r.rows;
        bytes += r.bytes;
      }
    } catch (IOException e) {
      throw new IllegalStateException(
          "RingStateStoreProvider: cannot load version " + version + " of " + storePath
              + " from the ring: " + e.getMessage(),
          e);
    }
    loaded(l, data, started, rows, bytes);
    data.legacy = !source.equals(storePath);
    // the epochs of another store's chain are no base under this one
    data.shardEpochs = data.legacy ? null : epochs;
    if (Trace.ON) {
      Trace.log("restore %s v%d rows=%d bytes=%d %dms", storePath, version, rows, bytes, l.restoreMs);
    }
    LOG.info("restored {} version {} from the ring: {} rows, {} bytes, {} shards in {} ms",
        storePath, version, rows, bytes, data.shards, l.restoreMs);
    return data;
  }

  /**
   * Spark's row format check, as HDFS-backed does it: when
   * {@code spark.sql.streaming.stateStore.formatValidation.enabled} is on (the default), the
   * first row this provider restores is checked against the operator's key schema (and the
   * value schema when {@code formatValidationCheckValue}) with
   * {@code UnsafeRowUtils.validateStructuralIntegrity}; a mismatch fails the load with
   * Spark's own error as the cause.
   */
  private void validate(UnsafeRow key, UnsafeRow value, long version) {
    if (validated || !storeConf.formatValidationEnabled()) {
      return;
    }
    try {
      StateStoreProvider$.MODULE$.validateStateRowFormat(
          key, keySchema, value, valueSchema, stateStoreId, storeConf);
    } catch (RuntimeException e) {
      throw new IllegalStateException(
          "RingStateStoreProvider: version " + version + " of " + storePath + " on the ring "
              + "does not match the operator's state schema (key " + keySchema.simpleString()
              + ", value " + valueSchema.simpleString() + "): " + e.getMessage()
              + ". The state was written by a query with another schema; restart it from a new "
              + "checkpoint, or set spark.sql.streaming.stateStore.formatValidation.enabled="
              + "false if the rows are known to be compatible",
          e);
    }
    validated = true;
  }

  /**
   * The epoch rule: a write store's epoch is one above the highest of the ring's head epoch
   * for the store (read when the store is opened), the epoch of the version it starts from,
   * and every epoch this JVM handed out for the store. No clock is involved: the head only
   * moves forward, so a later attempt gets a higher epoch than any attempt whose commit it
   * could see, and the ring refuses a commit below its head (409 stale_epoch).
   */
  private long nextEpoch(RingHttp.Head head, long loadedEpoch) {
    long floor = Math.max(loadedEpoch, head == null ? 0 : head.epoch);
    return LAST_EPOCH.merge(storePath, floor + 1, (prev, proposed) -> Math.max(prev + 1, proposed));
  }

  /** Rows of the last committed overlay: what the next one is made ready to hold. */
  private volatile int overlayRows;

  /** Rows the next write store's overlay is made to hold before its map grows. */
  int overlayRows() {
    return overlayRows;
  }

  /** A write store's commit was acknowledged: its version becomes the cached one. */
  synchronized StateData committed(WriteStore store, long newVersion) {
    StateData base = store.data;
    overlayRows = (int) Math.min(store.overlay.size(), Integer.MAX_VALUE);
    StateData next = null;
    boolean released = false;
    store.overlay.letFilterGo(); // its keys are the version's now: the room is the version's
    try {
      next = base.onlyHeldBy(store.task) ? base : base.copy();
      base.release(store.task);
      released = true;
      next.apply(store.overlay, store.keyDelta(), store.bytesDelta());
    } catch (RuntimeException | Error e) {
      // applied part way (a spill store's write failed, a disk filled): no version of this
      // JVM is that. A version applied in place is let go, cached or not, so that no load
      // takes it for the version it was (a retry then reads that version from the ring); a
      // copy is let go, its base kept as it was
      if (!released) { // the store's own hold only (its task's read store may hold it too)
        base.release(store.task);
      }
      if (next == base && cached == base) {
        cached = null;
      }
      if (next != null && next != base) {
        next.retire();
      }
      drop(base);
      throw e;
    }
    if (next != base) {
      Prefetcher.schedule(next, config.prefetchBytesPerSec); // a copy: its own merge
    }
    next.version = newVersion;
    next.epoch = store.epoch;
    next.shards = store.shardsCommitted;
    next.shardEpochs = new long[store.shardsCommitted];
    java.util.Arrays.fill(next.shardEpochs, store.epoch); // every shard at the store's epoch
    next.pendingMiss = false;
    next.legacy = false;
    StateData old = cached;
    cached = next;
    drop(base);
    if (old != base) {
      drop(old);
    }
    return next;
  }

  /** The version a load of the next batch may take (tests). */
  StateData cachedForTests() {
    return cached;
  }

  /** A write store ended without a commit. */
  synchronized void finished(WriteStore store) {
    store.data.release(store.task);
    drop(store.data);
  }

  synchronized void released(ReadStore store) {
    store.data.release(store.task);
    drop(store.data);
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

  RingDirect direct() {
    return direct;
  }

  StateStoreConf storeConf() {
    return storeConf;
  }

  Configuration hadoopConf() {
    return hadoopConf;
  }
}
