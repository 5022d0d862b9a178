package statestore.spark;

import java.io.IOException;
import java.util.AbstractMap;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.spark.TaskContext;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.KeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreCheckpointInfo;
import org.apache.spark.sql.execution.streaming.state.StateStoreCustomMetric;
import org.apache.spark.sql.execution.streaming.state.StateStoreInstanceMetric;
import org.apache.spark.sql.execution.streaming.state.StateStoreIterator;
import org.apache.spark.sql.execution.streaming.state.StateStoreMetrics;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.Platform;

import scala.Option;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The store a task updates: version + 1 in the making. Its changes go to an overlay (the
 * delta: a value, or {@link StateData#TOMBSTONE} for a removed key) over the loaded
 * version, which stays unchanged until the commit is acknowledged; reads see the overlay
 * first. {@code abort()} drops the overlay.
 */
final class WriteStore extends StoreBase implements StateStore {
  private static final int UPDATING = 0;
  private static final int COMMITTED = 1;
  private static final int ABORTED = 2;

  final long epoch;
  /** {@link StateData#shardEpochs} of the version this store starts from (null: unknown). */
  final long[] baseEpochs;
  final long task;
  final boolean forceSnapshot;
  private final RingStateStoreProvider.Loaded loaded;
  /** The batch's changes; like a version, it moves to a spill store when the cache is full. */
  final StateData overlay;
  private volatile int state = UPDATING;
  private long keyDelta;
  private long bytesDelta;
  private long bytesCommitted;
  private long commitMs;
  private boolean snapshotSent;
  int shardsCommitted;
  private volatile StateData committedData;
  /** What the lazily loaded base this store reads through read from the ring (null: none). */
  private final LazyBase.Reads lazy;
  /** Bytes its base read for this batch (-1: not counted yet). */
  private long lazyFetched = -1;
  /**
   * The iterators {@link #merged} handed out, closed when the store commits or aborts at the
   * latest (Spark closes few of those its operators stop early).
   */
  private final java.util.Queue<SpillStore.CloseableIterator<?>> handedOut =
      new java.util.concurrent.ConcurrentLinkedQueue<>();

  WriteStore(
      RingStateStoreProvider provider,
      long version,
      RingStateStoreProvider.Loaded loaded,
      boolean forceSnapshot,
      long epoch,
      long task) {
    super(provider, version, loaded.data);
    this.loaded = loaded;
    this.forceSnapshot = forceSnapshot;
    this.epoch = epoch;
    this.baseEpochs = data.version == version ? data.shardEpochs : null;
    this.task = task;
    this.overlay = data.emptyLike(provider.overlayRows());
    this.lazy = data.reads;
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
  public UnsafeRow get(UnsafeRow key, String cf) {
    defaultFamily(cf);
    UnsafeRow o = overlay.get(key);
    if (o != null) {
      return o == StateData.TOMBSTONE ? null : o;
    }
    return data.getRemembered(key);
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
    // the overlay's row and the write in one operation
    UnsafeRow o = overlay.swap(k, v);
    UnsafeRow before;
    try {
      before = o == null ? data.recall(k) : o == StateData.TOMBSTONE ? null : o;
    } catch (RuntimeException | Error e) {
      if (o == null) { // the put fails whole: a put tried again counts the key as new
        try {
          overlay.remove(k);
        } catch (RuntimeException | Error undo) {
          e.addSuppressed(undo);
        }
      }
      throw e;
    }
    if (before == null) {
      keyDelta++;
      bytesDelta += k.getSizeInBytes() + v.getSizeInBytes() + StateBudget.ROW_COST;
    } else {
      bytesDelta += v.getSizeInBytes() - before.getSizeInBytes();
    }
  }

  @Override
  public void remove(UnsafeRow key, String cf) {
    defaultFamily(cf);
    updating("remove");
    UnsafeRow o = overlay.get(key);
    UnsafeRow before = o == null ? data.recall(key) : o == StateData.TOMBSTONE ? null : o;
    if (before == null) {
      return;
    }
    UnsafeRow k = key.copy();
    // a value the version answered is the version's: no second read to know it holds the key
    if (o == null || data.containsKey(k)) {
      overlay.putOver(k, StateData.TOMBSTONE, o);
    } else {
      overlay.remove(k);
    }
    keyDelta--;
    bytesDelta -= k.getSizeInBytes() + before.getSizeInBytes() + StateBudget.ROW_COST;
  }

  /**
   * Every row of version + 1 as it stands: the loaded version under the overlay. Closing it
   * closes the spill stores' iterators it reads; so does exhausting it, and the store's
   * commit or abort closes those still open.
   */
  SpillStore.CloseableIterator<Map.Entry<UnsafeRow, UnsafeRow>> merged() {
    boolean sorted = data.remote == null && data.spilled() && overlay.spilled();
    Iterator<Map.Entry<UnsafeRow, UnsafeRow>> base = data.entries();
    Iterator<Map.Entry<UnsafeRow, UnsafeRow>> added;
    try {
      added = overlay.entries();
    } catch (RuntimeException e) {
      if (base instanceof SpillStore.CloseableIterator<?> c) {
        c.close();
      }
      throw e;
    }
    SpillStore.CloseableIterator<Map.Entry<UnsafeRow, UnsafeRow>> rows =
        closing(sorted ? sortedMerge(base, added) : lookups(base, added), base, added);
    handedOut.add(rows);
    return rows;
  }

  /** Close the iterators {@link #merged} handed out (the commit's and abort's last step). */
  private void closeIterators() {
    for (SpillStore.CloseableIterator<?> it; (it = handedOut.poll()) != null; ) {
      it.close();
    }
  }

  /** {@code rows}, whose close closes those of {@code sources} that spill stores opened. */
  private static <T> SpillStore.CloseableIterator<T> closing(
      Iterator<T> rows, Iterator<?>... sources) {
    return new SpillStore.CloseableIterator<T>() {
      @Override
      public boolean hasNext() {
        return rows.hasNext();
      }

      @Override
      public T next() {
        return rows.next();
      }

      @Override
      public void close() {
        for (Iterator<?> s : sources) {
          if (s instanceof SpillStore.CloseableIterator<?> c) {
            c.close();
          }
        }
      }
    };
  }

  /** The merge of {@code base} under {@code added} by looking each base row up in the overlay. */
  private Iterator<Map.Entry<UnsafeRow, UnsafeRow>> lookups(
      Iterator<Map.Entry<UnsafeRow, UnsafeRow>> base,
      Iterator<Map.Entry<UnsafeRow, UnsafeRow>> added) {
    return new Lookahead<Map.Entry<UnsafeRow, UnsafeRow>>() {
      @Override
      protected Map.Entry<UnsafeRow, UnsafeRow> advance() {
        while (base.hasNext()) {
          Map.Entry<UnsafeRow, UnsafeRow> e = base.next();
          UnsafeRow o = overlay.get(e.getKey());
          if (o == null) {
            return e;
          }
          if (o != StateData.TOMBSTONE) {
            return new AbstractMap.SimpleImmutableEntry<>(e.getKey(), o);
          }
        }
        while (added.hasNext()) {
          Map.Entry<UnsafeRow, UnsafeRow> e = added.next();
          if (e.getValue() != StateData.TOMBSTONE && !data.containsKey(e.getKey())) {
            return e;
          }
        }
        return null;
      }
    };
  }

  /**
   * {@link #merged} when the version and the overlay are both in spill stores, whose entries
   * come in the order of their key bytes: one walk down both, the overlay's row winning (a
   * tombstone dropping the key), with no look-up of one in the other (two RocksDB reads a row
   * otherwise, on every pass over a spilled version).
   */
  static Iterator<Map.Entry<UnsafeRow, UnsafeRow>> sortedMerge(
      Iterator<Map.Entry<UnsafeRow, UnsafeRow>> base,
      Iterator<Map.Entry<UnsafeRow, UnsafeRow>> added) {
    return new Lookahead<Map.Entry<UnsafeRow, UnsafeRow>>() {
      private Map.Entry<UnsafeRow, UnsafeRow> b = base.hasNext() ? base.next() : null;
      private Map.Entry<UnsafeRow, UnsafeRow> a = added.hasNext() ? added.next() : null;

      @Override
      protected Map.Entry<UnsafeRow, UnsafeRow> advance() {
        while (b != null || a != null) {
          int c = b == null ? 1 : a == null ? -1 : compareBytes(b.getKey(), a.getKey());
          Map.Entry<UnsafeRow, UnsafeRow> out;
          if (c < 0) {
            out = b;
            b = base.hasNext() ? base.next() : null;
          } else {
            out = a;
            a = added.hasNext() ? added.next() : null;
            if (c == 0) {
              b = base.hasNext() ? base.next() : null;
            }
          }
          if (out.getValue() != StateData.TOMBSTONE) {
            return out;
          }
        }
        return null;
      }
    };
  }

  /** The order of a spill store's keys: their bytes, unsigned, a prefix first. */
  static int compareBytes(UnsafeRow x, UnsafeRow y) {
    Object xb = x.getBaseObject();
    Object yb = y.getBaseObject();
    long xo = x.getBaseOffset();
    long yo = y.getBaseOffset();
    int xn = x.getSizeInBytes();
    int yn = y.getSizeInBytes();
    int n = Math.min(xn, yn);
    for (int i = 0; i < n; i++) {
      int c = Integer.compare(
          Platform.getByte(xb, xo + i) & 0xff, Platform.getByte(yb, yo + i) & 0xff);
      if (c != 0) {
        return c;
      }
    }
    return Integer.compare(xn, yn);
  }

  @Override
  public StateStoreIterator<UnsafeRowPair> iterator(String cf) {
    defaultFamily(cf);
    Iterator<Map.Entry<UnsafeRow, UnsafeRow>> it = merged();
    return StateData.wrap(it, new Iterator<UnsafeRowPair>() {
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

  @Override
  public StateStoreIterator<UnsafeRowPair> prefixScan(UnsafeRow prefixKey, String cf) {
    defaultFamily(cf);
    if (data.prefixIndex == null) {
      throw new UnsupportedOperationException(
          "prefix scan on a state store created without a prefix key encoding");
    }
    List<UnsafeRow> keys = new ArrayList<>();
    Collection<UnsafeRow> old = data.keysWithPrefix(prefixKey);
    if (old != null) {
      keys.addAll(old);
    }
    Collection<UnsafeRow> fresh = overlay.keysWithPrefix(prefixKey);
    if (fresh != null) {
      for (UnsafeRow k : fresh) {
        if (!data.containsKey(k)) { // the base's keys are listed already
          keys.add(k);
        }
      }
    }
    Iterator<UnsafeRow> it = keys.iterator();
    return StateData.wrap(new Lookahead<UnsafeRowPair>() {
      @Override
      protected UnsafeRowPair advance() {
        while (it.hasNext()) {
          UnsafeRow k = it.next();
          UnsafeRow v = get(k, null);
          if (v != null) {
            return new UnsafeRowPair(k, v);
          }
        }
        return null;
      }
    });
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
      StateCommit.Result r;
      try {
        r = StateCommit.send(provider, this, newVersion, snapshot);
      } finally {
        closeIterators(); // the commit's passes and any a caller left open
      }
      StateData.forgetRecent(); // the batch's reads: none is asked for again
      bytesCommitted = r.bytes;
      snapshotSent = r.snapshot;
      shardsCommitted = r.shards;
    } catch (IOException | RuntimeException e) {
      state = ABORTED;
      try {
        provider.finished(this);
      } finally {
        overlay.retire(); // its bytes leave the cache, its spill store goes
      }
      String msg = e.getMessage();
      if (e instanceof RingErrors.RingError && "stale_epoch".equals(((RingErrors.RingError) e).code)) {
        msg = "fenced: a newer attempt owns " + storePath + " (" + msg + ")";
      }
      throw new IllegalStateException(
          "RingStateStoreProvider: commit of " + storePath + " version " + newVersion
              + " (epoch " + epoch + ") failed: " + msg,
          e);
    }
    commitMs = (System.nanoTime() - started) / 1_000_000;
    state = COMMITTED;
    long t1 = System.nanoTime();
    try {
      committedData = provider.committed(this, newVersion);
    } catch (Error e) {
      state = ABORTED; // as below, the error itself thrown on (an OutOfMemoryError stays one)
      throw e;
    } catch (RuntimeException e) {
      // the ring holds the version; this JVM could not make it (its rows applied part way
      // were let go): the task fails, and its retry reads the version before from the ring
      // and commits this one again under a newer epoch
      state = ABORTED;
      throw new IllegalStateException("RingStateStoreProvider: " + storePath + " version "
          + newVersion + " was committed to the ring, but applying it in this JVM failed: "
          + e.getMessage(), e);
    } finally {
      overlay.retire(); // its bytes leave the cache, its spill store goes
    }
    if (Trace.ON) {
      Trace.log("commit %s v%d overlay=%d send=%dms apply=%.1fms", storePath, newVersion,
          overlay.size(), commitMs, (System.nanoTime() - t1) / 1e6);
    }
    if (provider.storeConf().commitValidationEnabled()) {
      StateStore.reportCommitToCoordinator(newVersion, id(), provider.hadoopConf());
    }
    return newVersion;
  }

  @Override
  public void abort() {
    closeIterators();
    StateData.forgetRecent();
    if (state == UPDATING) {
      state = ABORTED;
      if (!overlay.spilled()) {
        overlay.clear();
      }
      overlay.retire();
      provider.finished(this);
    } else {
      state = ABORTED;
    }
  }

  /** The key count of the version this store commits (its base's and what it changed). */
  long keysAfter() {
    return Math.max(0, data.size() + keyDelta);
  }

  /** The keys this store adds to its version (removed ones negative). */
  long keyDelta() {
    return keyDelta;
  }

  /** The bytes this store's rows add to its version (key + value + a row's cost, each). */
  long bytesDelta() {
    return bytesDelta;
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
    custom.put(RingMetrics.HEAD_READS, loaded.headReads);
    // the load's reads, and what a lazily loaded version's base read since the last batch
    // reported it (this batch's gets, read stores' included: they come before this store;
    // and what the prefetch read, until the version was whole and after)
    if (lazy != null && lazyFetched < 0) {
      long now = lazy.fetched.get();
      lazyFetched = Math.max(0, now - lazy.reported.getAndSet(now));
    }
    custom.put(RingMetrics.BYTES_FETCHED, loaded.restoredBytes + Math.max(0, lazyFetched));
    Map<StateStoreInstanceMetric, Object> none = new HashMap<>();
    StateData after = committedData;
    // on the heap: the version (when not spilled) and, before a commit, the overlay
    long heap = after != null ? after.heapBytes()
        : (data.spilled() ? overlay.heapBytes() : Math.max(0, data.bytes.get() + bytesDelta));
    long spilled = after != null ? after.spillBytes()
        : (data.spilled() ? Math.max(0, data.bytes.get() + bytesDelta) : 0);
    custom.put(RingMetrics.CACHE_BYTES, heap);
    custom.put(RingMetrics.SPILL_BYTES, spilled);
    return new StateStoreMetrics(
        after != null ? after.size() : keysAfter(),
        heap,
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
