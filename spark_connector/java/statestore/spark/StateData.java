package statestore.spark;

import java.lang.ref.Cleaner;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.StateStoreIterator;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.apache.spark.sql.types.DataType;

import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.BoxedUnit;

/**
 * One version of the partition in memory, with a prefix index when Spark needs scans.
 *
 * <p>A published version is not changed while another store holds it: write stores keep
 * their changes in an overlay ({@link WriteStore}) and the provider applies them at commit,
 * in place only when the committing store is the version's sole holder (or shares it only
 * with stores of the same task attempt), else to a copy. So every read store, and every
 * other attempt, sees a fixed version.
 *
 * <p>Rows are on the heap ({@link #map}) while the executor's cache has room
 * ({@link StateBudget}, {@code spark.statestore.cacheBytes}); a put that takes the cache past
 * its limit moves this version's rows to a local {@link SpillStore} ({@link #spill}), where
 * they stay. Reads and writes go through this class either way; a copy of a spilled
 * version is a RocksDB checkpoint. {@link #retire} gives the bytes back to the cache and
 * deletes the spill when no store holds the version and the provider no longer caches it
 * (a cleaner does the same for a version that is dropped without it).
 *
 * <p>A version loaded lazily ({@code spark.statestore.lazyRestore}) has a {@link #remote}
 * base still on the ring: its map (or spill) holds only the rows of the deltas above that
 * base and what was changed since, {@link #removed} the keys deleted since the base, and
 * {@link #lazyCount} the version's key count (from the commit that wrote it). A read of a
 * key found in neither is answered from the base, one block fetched at most (a read changes
 * nothing here: the block is cached by {@link LazyBase}); a scan first makes the version
 * whole ({@link #materialize}).
 */
final class StateData {
  /** The overlay's mark for a removed key (compared by identity). */
  static final UnsafeRow TOMBSTONE = new UnsafeRow(0);

  private static final Cleaner CLEANER = Cleaner.create();

  /**
   * The rows on the heap. A spill replaces it with an empty one (its table goes too), after
   * setting {@link #spill}: a reader reads this field first, then {@link #spill}, and one that
   * sees no spill store has the map as it was before the spill, rows and all.
   */
  volatile ConcurrentHashMap<UnsafeRow, UnsafeRow> map;
  /** The most rows a new map is made to hold before it grows (2 MiB of table). */
  static final int ROOM = 1 << 18;
  /**
   * An overlay's: once it spills, {@link #filter} is sized for this many keys first (or 4x
   * its rows then, if more); 0: a version's, sized for twice its rows then.
   */
  private long filterFor;
  /**
   * Every key written to {@link #spill}, once this map spilled (null: none kept; a read
   * then asks the store): its bytes are counted in the cache with the version's.
   */
  private volatile KeyFilter filter;
  /** This instance, among the JVM's ({@link #recall}). */
  private final long uid = UIDS.incrementAndGet();
  private static final AtomicLong UIDS = new AtomicLong();
  private final DataType[] prefixTypes;
  private final int keyFields;
  private final int valueFields;
  /** Where the rows are once this version outgrew the cache (null: in {@link #map}). */
  private volatile SpillStore spill;
  /** Rows in {@link #spill}. */
  private final AtomicLong spilledRows = new AtomicLong();
  private final Release release = new Release();
  private final Cleaner.Cleanable cleanable;
  /** Ring stores the version is spread over (key hash shards, {@link StateCommit}). */
  volatile int shards = 1;
  /** Task attempts holding this version through an open store (provider lock). */
  private final ArrayList<Long> holders = new ArrayList<>();
  /** The keys on the heap by prefix (null: no prefix key encoding); a spill replaces it. */
  volatile ConcurrentHashMap<UnsafeRow, Set<UnsafeRow>> prefixIndex;
  final UnsafeProjection prefixProjection;
  volatile long version;
  volatile long epoch;
  /**
   * The epoch of this version on each shard's ring store, as restored or committed (the
   * {@code base_epoch} the next version's commit names, core/manifest.py "Lineage");
   * {@code null} when not known from the ring (an empty version, a replayed one, one read
   * under the legacy name).
   */
  volatile long[] shardEpochs;
  final AtomicLong bytes = new AtomicLong();
  /** The rows still on the ring (null: every row is here). */
  volatile LazyBase remote;
  /** What the base this version was loaded lazily from read (kept once it is whole). */
  volatile LazyBase.Reads reads;
  /** Chunks of {@link #remote}'s bases merged into the map so far ({@link #mergeNext}). */
  private int merged;
  /** Keys deleted since {@link #remote}'s base (only while it is set). */
  final Set<UnsafeRow> removed = ConcurrentHashMap.newKeySet();
  /** The version's key count while {@link #remote} is set. */
  final AtomicLong lazyCount = new AtomicLong();
  // how this map was loaded, reported by the first write store that uses it
  long pendingRestoreMs;
  long pendingRestoredRows;
  long pendingRestoredBytes;
  boolean pendingMiss;
  /** Restored from the store's legacy name: its first commit must be a snapshot. */
  boolean legacy;

  /** What this version holds of the executor: its bytes in the cache, its spill. */
  private static final class Release implements Runnable {
    final AtomicLong heapBytes = new AtomicLong();
    /** Of {@link #heapBytes}, its key filter's: counted in {@link #FILTER_BYTES} too. */
    final AtomicLong filterBytes = new AtomicLong();
    volatile SpillStore spill;
    /** What the JVM holds of the base the version reads ({@link #readFrom}), let go with it. */
    LazyBase.Held base;
    volatile boolean done;

    @Override
    public synchronized void run() {
      done = true;
      StateBudget.add(-heapBytes.getAndSet(0));
      FILTER_BYTES.addAndGet(-filterBytes.getAndSet(0));
      SpillStore s = spill;
      spill = null;
      if (s != null) {
        s.close();
      }
      LazyBase.Held b = base;
      base = null;
      if (b != null) {
        b.unuse();
      }
    }
  }

  StateData(DataType[] prefixTypes, int keyFields, int valueFields) {
    this(prefixTypes, keyFields, valueFields, 0);
  }

  /**
   * With room for {@code expectedRows} in its map before it grows (0: the default; at most
   * {@link #ROOM}). The table made for that room is counted in the cache from the start,
   * until the map is let go (a spill or the release), on top of what each row counts: a
   * batch smaller than the one before leaves most of it empty.
   */
  StateData(DataType[] prefixTypes, int keyFields, int valueFields, int expectedRows) {
    int room = Math.min(expectedRows, ROOM);
    this.map = room > 0 ? new ConcurrentHashMap<>(room) : new ConcurrentHashMap<>();
    this.prefixTypes = prefixTypes;
    this.keyFields = keyFields;
    this.valueFields = valueFields;
    this.cleanable = CLEANER.register(this, release);
    long table = tableBytes(room);
    if (table > 0) {
      release.heapBytes.addAndGet(table);
      StateBudget.add(table);
    }
    if (prefixTypes != null) {
      prefixIndex = new ConcurrentHashMap<>();
      prefixProjection = UnsafeProjection.create(prefixTypes);
    } else {
      prefixIndex = null;
      prefixProjection = null;
    }
  }

  /**
   * The bytes of the table a {@code ConcurrentHashMap} made with room for {@code room} rows
   * allocates at its first put (JDK 17's constructor: the power of two at or above
   * {@code 1 + room / 0.75} slots, a reference a slot: 4 bytes with compressed references,
   * on heaps under 32 GiB, 8 above); 0 for none.
   */
  static long tableBytes(int room) {
    if (room <= 0) {
      return 0;
    }
    long size = 1 + (long) (room / 0.75f);
    long slots = Long.highestOneBit(size - 1) << 1;
    long ref = Runtime.getRuntime().maxMemory() < (32L << 30) ? 4 : 8;
    return 16 + slots * ref;
  }

  /**
   * An empty overlay of the same kind, made for {@code expectedRows} (the batch before's):
   * its map has room for them (up to {@link #ROOM}) before its table grows, and once it
   * spills, the keys it takes are kept in a {@link KeyFilter} sized for them.
   */
  StateData emptyLike(int expectedRows) {
    StateData out = new StateData(prefixTypes, keyFields, valueFields, expectedRows);
    out.filterFor = Math.max(1, expectedRows);
    return out;
  }

  /** An independent copy (rows are immutable and shared). */
  synchronized StateData copy() {
    StateData out = new StateData(prefixTypes, keyFields, valueFields);
    SpillStore s = spill;
    if (s != null) {
      out.spill = s.copy();
      if (Trace.ON) {
        Trace.log("spill copy v%d rows=%d", version, spilledRows.get());
      }
      out.release.spill = out.spill;
      out.spilledRows.set(spilledRows.get());
      out.bytes.set(bytes.get());
      KeyFilter f = filter;
      if (f != null && takeFilterRoom(f.bytes())) { // the copy's own, counted as the original's
        KeyFilter g = f.copy();
        out.filter = g;
        out.release.heapBytes.addAndGet(g.bytes());
        out.release.filterBytes.addAndGet(g.bytes());
        StateBudget.add(g.bytes());
      } // else none: the JVM's filters are at their total, the copy's reads ask its store
    } else {
      for (Map.Entry<UnsafeRow, UnsafeRow> e : map.entrySet()) {
        out.put(e.getKey(), e.getValue());
      }
    }
    out.version = version;
    out.epoch = epoch;
    out.shards = shards;
    out.shardEpochs = shardEpochs;
    out.removed.addAll(removed);
    out.lazyCount.set(lazyCount.get());
    out.merged = merged;
    out.readFrom(remote);
    out.reads = reads;
    return out;
  }

  /**
   * Make a lazily loaded version whole: every row of its base not changed or deleted since
   * is added, and the version no longer reads the ring. Idempotent; concurrent readers see
   * the same state throughout (rows are added before the base is let go), and the chunks a
   * prefetch ({@link Prefetcher}) merged already are not read again.
   */
  void materialize() {
    long started = System.nanoTime();
    boolean lazy = remote != null;
    try {
      while (!mergeNext()) {
        // one chunk of the base a step
      }
    } catch (java.io.IOException e) {
      throw new IllegalStateException("RingStateStoreProvider: cannot read version " + version
          + " whole from the ring: " + e.getMessage(), e);
    }
    if (lazy && Trace.ON) {
      Trace.log("materialize v%d rows=%d %.1fms", version, size(),
          (System.nanoTime() - started) / 1e6);
    }
  }

  /**
   * Merge the next chunk of a lazy version's base into the map: its rows not changed or
   * deleted since. The chunk is read outside the lock, merged under it (so a commit's
   * {@link #apply} waits for one chunk at most); when another thread merged it meanwhile,
   * what was read is dropped. Whether the version is whole now.
   */
  boolean mergeNext() throws java.io.IOException {
    LazyBase base;
    int at;
    synchronized (this) {
      base = remote;
      if (base == null) {
        return true;
      }
      at = merged;
      if (at >= base.chunks()) {
        whole(base);
        return true;
      }
    }
    List<ChunkCodec.Row> rows;
    try {
      rows = base.chunk(at);
    } catch (java.io.IOException e) {
      return rebase(base, e) == null; // merging goes on over the newer base, from its start
    }
    synchronized (this) {
      if (release.done) {
        return true; // let go meanwhile: nothing to merge into
      }
      if (remote != base || merged != at) {
        return remote == null;
      }
      for (ChunkCodec.Row r : rows) {
        byte[] v = r.value();
        if (v == null) {
          continue;
        }
        UnsafeRow key = new UnsafeRow(keyFields);
        key.pointTo(r.key(), r.key().length);
        if (!removed.contains(key) && localGet(key) == null) {
          UnsafeRow value = new UnsafeRow(valueFields);
          value.pointTo(v, v.length);
          localPut(key, value);
        }
      }
      merged = at + 1;
      if (merged == base.chunks()) {
        whole(base);
      }
      return remote == null;
    }
  }

  /**
   * After a read of {@code base} failed with {@code failure}: the base this version reads
   * now. When the version's chains start at a newer snapshot than {@code base} (the nodes
   * folded one, and thinning dropped the old one's chunks before the provider's check at
   * the horizon), that snapshot becomes the version's base: every row the map and
   * {@link #removed} hold is the version's own (the deltas above the old base, a superset of
   * those above the new one, and the commits since), and a key in neither is as the new
   * base holds it. Null when the version became whole meanwhile; {@code failure} rethrown
   * when the chains still start at {@code base} (the ring could not answer), the newer
   * base cannot be read lazily, or the chains cannot be read (that error suppressed in it).
   * Costs one read of the chains and of the new base's indexes, on a failed read only; the
   * rows held here stay until the provider loads the version again over a newer snapshot.
   */
  <E extends Exception> LazyBase rebase(LazyBase base, E failure) throws E {
    synchronized (this) {
      if (remote != base) {
        return remote; // another reader rebased it, or it was made whole
      }
    }
    LazyBase fresh;
    try {
      fresh = base.rebaser == null ? null : base.rebaser.newerBase(version, base);
    } catch (RuntimeException e) {
      failure.addSuppressed(e); // the read's own failure says more than the chains'
      throw failure;
    }
    if (fresh == null) {
      throw failure;
    }
    synchronized (this) {
      if (remote != base) {
        return remote;
      }
      readFrom(fresh);
      merged = 0; // a prefetch merges the new base's chunks (rows held here win)
      return fresh;
    }
  }

  /** Every chunk of the base is merged: the version no longer reads the ring. */
  private void whole(LazyBase base) {
    long held = spill != null ? spilledRows.get() : map.size();
    if (held != lazyCount.get()) {
      // the rows are what the ring holds (every chunk verified); only the count was off
      org.slf4j.LoggerFactory.getLogger(StateData.class).warn("version {} holds {} keys once "
          + "whole, not the {} its commit counted", version, held, lazyCount.get());
    }
    readFrom(null);
    removed.clear();
  }

  /**
   * Read {@code base} from now on (null: the version is whole), counted in the base's users:
   * the base the version read before is let go ({@link LazyBase.Held#unuse}), as it is when the
   * version is let go itself ({@link Release}). A version let go counts nothing.
   */
  void readFrom(LazyBase base) {
    synchronized (release) {
      LazyBase old = remote;
      remote = base;
      if (release.done || old == base) {
        return;
      }
      release.base = base == null ? null : base.held;
      if (base != null) {
        base.held.use();
      }
      if (old != null) {
        old.held.unuse();
      }
    }
  }

  /** Whether this version was let go (its bytes and spill released). */
  boolean retired() {
    return release.done;
  }

  /** A row of the version as loaded (a delta's put above a lazy base): no count changes. */
  void loadPut(UnsafeRow key, UnsafeRow value) {
    removed.remove(key);
    localPut(key, value);
  }

  /** A delete of a delta above a lazy base, as loaded: no count changes. */
  void loadRemove(UnsafeRow key) {
    localRemove(key);
    removed.add(key);
  }

  /**
   * Apply an overlay (value {@link #TOMBSTONE} = remove) whose store counted the keys it adds
   * ({@code keyDelta}, removed ones negative) and the bytes its rows add ({@code bytesDelta},
   * as this version counts a row): a lazily loaded version then reads nothing from its base
   * (the store read every key it put or removed already), and a spilled one writes the rows
   * in batches without reading what they replace ({@link SpillStore#writeAll}). The count
   * after it is taken here, under the version's lock (a prefetch may make a lazy version
   * whole, with its own count, until then).
   */
  synchronized void apply(StateData overlay, long keyDelta, long bytesDelta) {
    long keys = Math.max(0, size() + keyDelta);
    if (remote != null) {
      Iterator<Map.Entry<UnsafeRow, UnsafeRow>> it = overlay.entries();
      while (it.hasNext()) {
        Map.Entry<UnsafeRow, UnsafeRow> e = it.next();
        if (e.getValue() == TOMBSTONE) {
          loadRemove(e.getKey());
        } else {
          loadPut(e.getKey(), e.getValue());
        }
      }
      lazyCount.set(keys);
      return;
    }
    SpillStore s = spill;
    if (s != null) {
      s.writeAll(remembering(overlay.entries()), prefixIndex == null ? null : this::prefixOf);
      spilledRows.set(keys);
      bytes.addAndGet(bytesDelta);
      refilter(s);
      return;
    }
    long before = bytes.get();
    Iterator<Map.Entry<UnsafeRow, UnsafeRow>> it = overlay.entries();
    int failAfter = failApplyAfterForTests;
    int applied = 0;
    while (it.hasNext()) {
      if (applied++ == failAfter) {
        throw new IllegalStateException("apply failed part way (a test's hook)");
      }
      SpillStore moved = spill;
      if (moved != null) { // the version moved to a spill store part way: the rest in batches
        moved.writeAll(remembering(it), prefixIndex == null ? null : this::prefixOf);
        spilledRows.set(keys);
        bytes.set(before + bytesDelta);
        refilter(moved);
        return;
      }
      Map.Entry<UnsafeRow, UnsafeRow> e = it.next();
      if (e.getValue() == TOMBSTONE) {
        remove(e.getKey());
      } else {
        put(e.getKey(), e.getValue());
      }
    }
  }

  /**
   * Tests: a heap version's {@link #apply} throws after this many rows (-1: never), as a
   * spill store's write or a full disk would part way.
   */
  static volatile int failApplyAfterForTests = -1;

  /** Empty the map (a restore attempt starting again). */
  void clear() {
    SpillStore s = spill;
    if (s != null) {
      removeIf(k -> true);
      return;
    }
    map.clear();
    if (prefixIndex != null) {
      prefixIndex.clear();
    }
    account(-bytes.getAndSet(0));
  }

  /** Remove every key that {@code which} accepts. */
  void removeIf(java.util.function.Predicate<UnsafeRow> which) {
    if (spill == null) {
      List<UnsafeRow> gone = new ArrayList<>();
      for (UnsafeRow k : map.keySet()) {
        if (which.test(k)) {
          gone.add(k);
        }
      }
      for (UnsafeRow k : gone) {
        remove(k);
      }
      return;
    }
    Iterator<Map.Entry<UnsafeRow, UnsafeRow>> it = entries();
    while (it.hasNext()) {
      UnsafeRow k = it.next().getKey();
      if (which.test(k)) {
        remove(k);
      }
    }
  }

  // -- the executor's cache ----------------------------------------------------------------

  /** Count a change of this version's heap bytes; spill when the cache is over its limit. */
  private void account(long delta) {
    if (spill != null || release.done) {
      return;
    }
    release.heapBytes.addAndGet(delta);
    if (StateBudget.add(delta) && delta > 0 && bytes.get() >= StateBudget.minSpill()) {
      spillNow();
    }
  }

  /** Move every row to a new spill store: the heap keeps none of this version. */
  private synchronized void spillNow() {
    if (spill != null || release.done) {
      return;
    }
    long t0 = System.nanoTime();
    SpillStore s = SpillStore.create(keyFields, valueFields);
    release.spill = s;
    java.util.function.Function<UnsafeRow, UnsafeRow> prefixer =
        prefixIndex == null ? null : this::prefixOf;
    ConcurrentHashMap<UnsafeRow, UnsafeRow> rows = map;
    // the keys go into the filter as the rows go to the store (an overlay's sized for the
    // batch before's keys, a version's for twice its own: either grows when full, and is
    // not kept past filterCap)
    long cap = filterCap();
    long first = filterFor > 0 ? Math.max(filterFor, 4L * rows.size()) : 2L * rows.size();
    KeyFilter[] keys = {new KeyFilter(Math.min(first, KeyFilter.keysFor(cap)))};
    // a fresh store: nothing to read first
    s.load(seeing(rows.entrySet().iterator(), e -> {
      KeyFilter was = keys[0];
      if (was != null) {
        KeyFilter now = was.add(e.getKey());
        keys[0] = now == was || now.bytes() <= cap ? now : null;
      }
    }), prefixer);
    spilledRows.set(rows.size());
    KeyFilter f = keys[0];
    if (f != null && !takeFilterRoom(f.bytes())) {
      f = null; // the JVM's filters are at their total: reads ask the store
    }
    filter = f; // before the spill store: a read that finds one finds the other
    spill = s;
    // let go of the map whole, its table with it (a clear walks every bin and keeps the
    // table); a read that saw no spill store yet still finds its rows there
    map = new ConcurrentHashMap<>();
    if (prefixIndex != null) {
      prefixIndex = new ConcurrentHashMap<>();
    }
    // the filter stays on the heap, counted in the cache until the map is let go
    long kept = f == null ? 0 : f.bytes();
    synchronized (release) {
      if (!release.done) {
        StateBudget.add(kept - release.heapBytes.getAndSet(kept));
        release.filterBytes.addAndGet(kept);
      } else {
        FILTER_BYTES.addAndGet(-kept); // let go meanwhile: not counted
      }
    }
    SPILLS.incrementAndGet();
    if (Trace.ON) {
      Trace.log("spill v%d rows=%d bytes=%d %.1fms cache=%d/%d", version, spilledRows.get(),
          bytes.get(), (System.nanoTime() - t0) / 1e6, StateBudget.used(), StateBudget.limit());
    }
    org.slf4j.LoggerFactory.getLogger(StateData.class).info(
        "version {}: {} rows, {} bytes moved to the spill store in {} ms (cache {} of {} bytes)",
        version, spilledRows.get(), bytes.get(), (System.nanoTime() - t0) / 1_000_000,
        StateBudget.used(), StateBudget.limit());
  }

  /**
   * Add {@code key} to the filter of the keys in the spill store, before the row is written
   * there; a filter grown a stage counts its new bytes in the cache.
   */
  private void remember(UnsafeRow key) {
    KeyFilter f = filter;
    if (f == null) {
      return;
    }
    KeyFilter g = f.add(key);
    if (g != f) {
      keep(f, g);
    }
  }

  /**
   * The most bytes a map's filter may take: an eighth of the cache (at least 1 MiB). A
   * larger one is let go, and reads ask the spill store: the filters are counted in the
   * cache, on the heap for as long as their maps are held, and cannot spill.
   */
  static long filterCap() {
    long set = filterCapForTests;
    return set > 0 ? set : Math.max(StateBudget.limit() / 8, 1L << 20);
  }

  /** A cap in place of {@link #filterCap}'s rule when above 0 (tests). */
  static volatile long filterCapForTests;

  /**
   * {@code after} in place of the filter {@code before}, its bytes counted in the cache in
   * place of the other's; none past {@link #filterCap}.
   */
  private boolean keep(KeyFilter before, KeyFilter after) {
    boolean wanted = after != null;
    if (after != null && after.bytes() > filterCap()) {
      after = null;
    }
    long had = before == null ? 0 : before.bytes();
    long more = (after == null ? 0 : after.bytes()) - had;
    synchronized (release) {
      if (!release.done) {
        if (more > 0 && !takeFilterRoom(more)) {
          after = null; // the JVM's filters are at their total: reads ask the store
          more = -had;
          FILTER_BYTES.addAndGet(more);
        } else if (more <= 0) {
          FILTER_BYTES.addAndGet(more);
        }
        release.heapBytes.addAndGet(more);
        release.filterBytes.addAndGet(more);
        StateBudget.add(more);
      }
      filter = after;
    }
    return !wanted || after != null;
  }

  /**
   * Let go of its key filter (its reads then ask its spill store): an overlay's, once its
   * commit is sent, so that the version it is applied to has the room.
   */
  void letFilterGo() {
    KeyFilter f = filter;
    if (f != null) {
      keep(f, null);
    }
  }

  /**
   * Bytes of the key filters that the versions and overlays of this JVM hold: at most
   * {@link #filterTotal}, so that however many partitions an executor holds spilled, their
   * filters stay within a share of the cache (each is also at most {@link #filterCap}).
   */
  static final AtomicLong FILTER_BYTES = new AtomicLong();

  /**
   * The most bytes the JVM's key filters take together: a quarter of the cache, at least one
   * filter's cap ({@link #filterCap}, itself at least 1 MiB).
   */
  static long filterTotal() {
    long set = filterTotalForTests;
    return set > 0 ? set : Math.max(StateBudget.limit() / 4, filterCap());
  }

  /** A total in place of {@link #filterTotal}'s rule when above 0 (tests). */
  static volatile long filterTotalForTests;

  /** Count {@code bytes} more of filters if the total has room for them; whether it had. */
  private static boolean takeFilterRoom(long bytes) {
    while (true) {
      long now = FILTER_BYTES.get();
      if (now + bytes > filterTotal()) {
        return false;
      }
      if (FILTER_BYTES.compareAndSet(now, now + bytes)) {
        return true;
      }
    }
  }

  /**
   * Build the filter again from the spill store's keys once the keys it was given are over
   * 4x those the map holds (a state whose keys come and go: a removed key keeps its bits, and
   * a filter would grow with every key ever put): one walk of the store each time as many
   * new keys as 3x those it holds went in. A filter let go at the cap is made again once one
   * for twice the keys held takes at most half the cap (a state that shrank): it is let go
   * again only after as many new keys as those it holds, so each walk is paid for by that
   * many puts. A walk whose filter passes the cap stops there, the filter let go. Under the
   * version's lock (its writers hold it).
   */
  private void refilter(SpillStore s) {
    KeyFilter f = filter;
    long live = spilledRows.get();
    long cap = filterCap();
    if (f == null) {
      if (KeyFilter.chainBytesFor(2 * live) > cap / 2 || (retryBelow >= 0 && live > retryBelow)) {
        return; // still too many keys: reads ask the store
      }
      if (FILTER_BYTES.get() + KeyFilter.chainBytesFor(2 * live) > filterTotal()) {
        return; // no room among the JVM's filters: no walk (its filter would be let go)
      }
    } else if (f.added() <= 4 * Math.max(live, 4096)) {
      return;
    } else if (KeyFilter.chainBytesFor(2 * live) > cap) {
      keep(f, null); // one for the keys held would be past the cap: reads ask the store
      return;
    }
    KeyFilter g = new KeyFilter(2 * live);
    FILTER_WALKS.incrementAndGet();
    try (SpillStore.CloseableIterator<Map.Entry<UnsafeRow, UnsafeRow>> it = s.entries()) {
      while (it.hasNext()) {
        g = g.add(it.next().getKey());
        if (g.bytes() > cap) {
          // more keys than counted: none kept (reads ask the store), and no walk again
          // until the version holds half the keys it was counted to hold now
          keep(f, null);
          retryBelow = live / 2;
          return;
        }
      }
    } catch (RuntimeException e) {
      // the version is committed already: the filter it has still holds every key
      org.slf4j.LoggerFactory.getLogger(StateData.class).warn(
          "version {}: its key filter was not built again: {}", version, e.toString());
      return;
    }
    if (!keep(f, g)) {
      // the JVM's filters took the room meanwhile (the check above passed): none kept; the
      // next commit walks again only if they have room by then
      return;
    }
    retryBelow = -1;
    REFILTERS.incrementAndGet();
  }

  /**
   * After a rebuild stopped at the cap, the key count a filter let go waits for before it is
   * built again (-1: none; the version's lock).
   */
  private long retryBelow = -1;

  /** The bytes of its filter of the spill store's keys (0: none kept; tests). */
  long filterBytes() {
    KeyFilter f = filter;
    return f == null ? 0 : f.bytes();
  }

  /** Walks of spill stores to build a filter again, kept or not (tests). */
  static final AtomicLong FILTER_WALKS = new AtomicLong();

  /** Filters built again from their stores in this JVM (tests). */
  static final AtomicLong REFILTERS = new AtomicLong();

  /** {@code rows}, each key {@link #remember}ed as it is taken (a tombstone's is not). */
  private Iterator<Map.Entry<UnsafeRow, UnsafeRow>> remembering(
      Iterator<Map.Entry<UnsafeRow, UnsafeRow>> rows) {
    return seeing(rows, e -> {
      if (e.getValue() != TOMBSTONE) {
        remember(e.getKey());
      }
    });
  }

  /** {@code rows}, each shown to {@code see} as it is taken. */
  private static Iterator<Map.Entry<UnsafeRow, UnsafeRow>> seeing(
      Iterator<Map.Entry<UnsafeRow, UnsafeRow>> rows,
      java.util.function.Consumer<Map.Entry<UnsafeRow, UnsafeRow>> see) {
    return new Iterator<Map.Entry<UnsafeRow, UnsafeRow>>() {
      @Override
      public boolean hasNext() {
        return rows.hasNext();
      }

      @Override
      public Map.Entry<UnsafeRow, UnsafeRow> next() {
        Map.Entry<UnsafeRow, UnsafeRow> e = rows.next();
        see.accept(e);
        return e;
      }
    };
  }

  /** How many versions moved to a spill store in this JVM (tests). */
  static final AtomicLong SPILLS = new AtomicLong();

  boolean spilled() {
    return spill != null;
  }

  /** Bytes of this version on the heap (in the cache). */
  long heapBytes() {
    return spill != null ? 0 : bytes.get();
  }

  /** What this map counts in the cache now: rows, table, filter (0 once let go; tests). */
  long cachedBytes() {
    return release.heapBytes.get();
  }

  /** Iterators open on this version's spill store (0 when it has none). */
  int openIterators() {
    SpillStore s = spill;
    return s != null ? s.openIterators() : 0;
  }

  /** Bytes of this version in its spill store (rows as counted on the heap). */
  long spillBytes() {
    return spill != null ? bytes.get() : 0;
  }

  /**
   * No store holds this version and the provider does not cache it: its bytes leave the
   * cache and its spill store is deleted. Nothing reads it afterwards. Under the version's
   * lock: a prefetch's merge under way finishes first, and none starts after.
   */
  synchronized void retire() {
    cleanable.clean();
    filter = null; // its bytes left the cache with the version's
  }

  boolean unheld() {
    return holders.isEmpty();
  }

  // -- reads -----------------------------------------------------------------------------

  /** The value under {@code key} (an overlay's may be {@link #TOMBSTONE}), else null. */
  UnsafeRow get(UnsafeRow key) {
    while (true) {
      // the base before the rows here: a version seen whole has every merged row in place,
      // and a base seen still set is checked again after its answer (a merge that made the
      // version whole meanwhile may have taken the key in, or let go of the keys removed)
      LazyBase base = remote;
      UnsafeRow v = localGet(key);
      if (v != null || base == null) {
        return v;
      }
      byte[] b = null;
      if (!removed.contains(key)) {
        try {
          b = base.lookup(key);
        } catch (LazyBase.Unreadable e) {
          rebase(base, e); // made whole or over a newer base: asked again
          continue;
        }
      }
      if (remote != base) {
        continue; // made whole or rebased while it read: the rows here decide now
      }
      if (b == null) {
        return null;
      }
      UnsafeRow value = new UnsafeRow(valueFields);
      value.pointTo(b, b.length);
      return value;
    }
  }

  /**
   * Bring what the lazy base holds under those of {@code keys} this version's own rows do
   * not decide ({@link LazyBase#readAhead}): a batch's keys, before it asks for them one by
   * one ({@code minKeys}: the fewest of a chunk asked in a lookup). Nothing for a whole
   * version. Returns the keys brought.
   */
  int readAhead(List<UnsafeRow> keys, int minKeys) {
    LazyBase base = remote;
    if (base == null) {
      return 0;
    }
    List<UnsafeRow> wanted = new ArrayList<>(keys.size());
    for (UnsafeRow key : keys) {
      if (!removed.contains(key) && localGet(key) == null) {
        wanted.add(key);
      }
    }
    return wanted.isEmpty() ? 0 : base.readAhead(wanted, minKeys);
  }

  private UnsafeRow localGet(UnsafeRow key) {
    ConcurrentHashMap<UnsafeRow, UnsafeRow> m = map; // before the spill store ({@link #map})
    SpillStore s = spill;
    if (s == null) {
      return m.get(key);
    }
    KeyFilter f = filter;
    return f != null && !f.mightHold(key) ? null : s.get(key);
  }

  /**
   * {@link #get}, and for a version in a spill store or on the ring, the answer kept a short
   * while for this thread's {@link #recall} of the same key: an operator that gets a key from
   * its write store and then puts or removes it (deduplication, a join's state,
   * flatMapGroupsWithState) would ask the version again (to count the batch's keys and
   * bytes). A streaming aggregation reads all its batch's keys before it puts any: its puts
   * miss. A version's answer does not change while stores read it (the batch's writes go to
   * its overlay).
   */
  UnsafeRow getRemembered(UnsafeRow key) {
    UnsafeRow v = get(key);
    if ((spill != null || remote != null)
        && (v == null || v.getSizeInBytes() <= Recent.MAX_VALUE)) {
      RECENT.get().keep(uid, version, key.copy(), v);
    }
    return v;
  }

  /** What {@link #getRemembered} answered this thread for {@code key}, else {@link #get}. */
  UnsafeRow recall(UnsafeRow key) {
    if (spill == null && remote == null) {
      return get(key); // on the heap: nothing remembered, a map look-up
    }
    Recent r = RECENT.get();
    int i = r.find(uid, version, key);
    if (i < 0) {
      RECALL_MISSES.increment();
      return get(key);
    }
    RECALLED.increment();
    return r.take(i);
  }

  /** Let go of this thread's remembered answers (a store's commit or abort). */
  static void forgetRecent() {
    RECENT.get().clear();
  }

  /** Puts that took a read's answer, and those that read the version again (tests, bench). */
  static final java.util.concurrent.atomic.LongAdder RECALLED =
      new java.util.concurrent.atomic.LongAdder();
  static final java.util.concurrent.atomic.LongAdder RECALL_MISSES =
      new java.util.concurrent.atomic.LongAdder();

  /**
   * A thread's last few {@link #getRemembered} answers, by instance, version and key (an
   * instance takes the next version in place when its task commits: a key's answer of the
   * version before is not the next one's).
   */
  private static final class Recent {
    private static final int SIZE = 4;
    /** Larger answers are not kept (a thread holds at most 4 of them). */
    static final int MAX_VALUE = 4096;
    private final long[] owners = new long[SIZE];
    private final long[] versions = new long[SIZE];
    private final UnsafeRow[] keys = new UnsafeRow[SIZE];
    private final UnsafeRow[] values = new UnsafeRow[SIZE];
    private int next;

    void keep(long owner, long version, UnsafeRow key, UnsafeRow value) {
      owners[next] = owner;
      versions[next] = version;
      keys[next] = key;
      values[next] = value;
      next = (next + 1) % SIZE;
    }

    int find(long owner, long version, UnsafeRow key) {
      for (int i = 0; i < SIZE; i++) {
        if (owners[i] == owner && versions[i] == version && keys[i] != null
            && keys[i].equals(key)) {
          return i;
        }
      }
      return -1;
    }

    void clear() {
      for (int i = 0; i < SIZE; i++) {
        owners[i] = 0;
        keys[i] = null;
        values[i] = null;
      }
    }

    UnsafeRow take(int i) {
      UnsafeRow v = values[i];
      owners[i] = 0;
      keys[i] = null;
      values[i] = null;
      return v;
    }
  }

  private static final ThreadLocal<Recent> RECENT = ThreadLocal.withInitial(Recent::new);

  boolean containsKey(UnsafeRow key) {
    if (remote != null) {
      return get(key) != null;
    }
    ConcurrentHashMap<UnsafeRow, UnsafeRow> m = map;
    SpillStore s = spill;
    if (s == null) {
      return m.containsKey(key);
    }
    KeyFilter f = filter;
    return (f == null || f.mightHold(key)) && s.containsKey(key);
  }

  long size() {
    if (remote != null) {
      return lazyCount.get();
    }
    ConcurrentHashMap<UnsafeRow, UnsafeRow> m = map;
    return spill != null ? spilledRows.get() : m.size();
  }

  /** Every entry (an overlay's values may be {@link #TOMBSTONE}). */
  Iterator<Map.Entry<UnsafeRow, UnsafeRow>> entries() {
    materialize();
    ConcurrentHashMap<UnsafeRow, UnsafeRow> m = map;
    SpillStore s = spill;
    return s != null ? s.entries() : m.entrySet().iterator();
  }

  /** The keys with {@code prefix} (null or empty when none). */
  Collection<UnsafeRow> keysWithPrefix(UnsafeRow prefix) {
    materialize();
    ConcurrentHashMap<UnsafeRow, Set<UnsafeRow>> index = prefixIndex;
    SpillStore s = spill;
    return s != null ? s.keysWithPrefix(prefix) : index.get(prefix);
  }

  void hold(long task) {
    holders.add(task);
  }

  void release(long task) {
    holders.remove(Long.valueOf(task));
  }

  /** Whether only stores of {@code task} hold this version. */
  boolean onlyHeldBy(long task) {
    for (long t : holders) {
      if (t != task) {
        return false;
      }
    }
    return true;
  }

  UnsafeRow prefixOf(UnsafeRow key) {
    synchronized (prefixProjection) {
      return prefixProjection.apply(key).copy();
    }
  }

  UnsafeRow put(UnsafeRow key, UnsafeRow value) {
    if (remote == null) {
      return localPut(key, value);
    }
    UnsafeRow prev = get(key);
    removed.remove(key);
    localPut(key, value);
    if (prev == null) {
      lazyCount.incrementAndGet();
    }
    return prev;
  }

  /**
   * {@link #put} for this map's only writer, which read {@code prev} (what {@link #get} gave
   * under {@code key}) just before: a spilled map writes the row without reading it again.
   * For a map read through no lazy base (an overlay).
   */
  void putOver(UnsafeRow key, UnsafeRow value, UnsafeRow prev) {
    SpillStore s = spill;
    if (s == null || remote != null) {
      put(key, value);
      return;
    }
    remember(key);
    s.putOver(key, value, prev == null, prefixIndex == null ? null : this::prefixOf);
    if (prev == null) {
      spilledRows.incrementAndGet();
      bytes.addAndGet(key.getSizeInBytes() + value.getSizeInBytes() + StateBudget.ROW_COST);
    } else {
      bytes.addAndGet(value.getSizeInBytes() - prev.getSizeInBytes());
    }
  }

  /**
   * {@link #put} for this map's only writer (an overlay, read through no lazy base),
   * returning what was under {@code key} (perhaps {@link #TOMBSTONE}), else null: on the
   * heap one map operation, where a {@link #get} then a {@link #putOver} made two; spilled,
   * the row is read only where the filter cannot rule it out, then written once.
   */
  UnsafeRow swap(UnsafeRow key, UnsafeRow value) {
    if (spill == null && remote == null) {
      return localPut(key, value); // a spill it sets off takes the row with the map
    }
    UnsafeRow prev = localGet(key);
    putOver(key, value, prev);
    return prev;
  }

  UnsafeRow remove(UnsafeRow key) {
    if (remote == null) {
      return localRemove(key);
    }
    UnsafeRow prev = get(key);
    localRemove(key);
    if (prev != null) {
      removed.add(key);
      lazyCount.decrementAndGet();
    }
    return prev;
  }

  private UnsafeRow localPut(UnsafeRow key, UnsafeRow value) {
    SpillStore s = spill;
    if (s != null) {
      remember(key);
      UnsafeRow prev = s.put(key, value, prefixIndex == null ? null : this::prefixOf);
      if (prev == null) {
        spilledRows.incrementAndGet();
        bytes.addAndGet(key.getSizeInBytes() + value.getSizeInBytes() + StateBudget.ROW_COST);
      } else {
        bytes.addAndGet(value.getSizeInBytes() - prev.getSizeInBytes());
      }
      return prev;
    }
    UnsafeRow prev = map.put(key, value);
    long delta;
    if (prev == null) {
      delta = key.getSizeInBytes() + value.getSizeInBytes() + StateBudget.ROW_COST;
      bytes.addAndGet(delta);
      if (prefixIndex != null) {
        prefixIndex.computeIfAbsent(prefixOf(key), p -> ConcurrentHashMap.newKeySet()).add(key);
      }
    } else {
      delta = value.getSizeInBytes() - prev.getSizeInBytes();
      bytes.addAndGet(delta);
    }
    account(delta);
    return prev;
  }

  private UnsafeRow localRemove(UnsafeRow key) {
    SpillStore s = spill;
    if (s != null) {
      UnsafeRow prev = s.remove(key, prefixIndex == null ? null : this::prefixOf);
      if (prev != null) {
        spilledRows.decrementAndGet();
        bytes.addAndGet(-(key.getSizeInBytes() + prev.getSizeInBytes() + StateBudget.ROW_COST));
      }
      return prev;
    }
    UnsafeRow prev = map.remove(key);
    if (prev != null) {
      long delta = -(key.getSizeInBytes() + prev.getSizeInBytes() + StateBudget.ROW_COST);
      bytes.addAndGet(delta);
      account(delta);
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
    Iterator<Map.Entry<UnsafeRow, UnsafeRow>> it = entries(); // whole first, if lazy
    return wrap(it, new Iterator<UnsafeRowPair>() {
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
    Collection<UnsafeRow> keys = keysWithPrefix(prefixKey);
    if (keys == null) {
      return wrap(Collections.emptyIterator());
    }
    Iterator<UnsafeRow> it = new ArrayList<>(keys).iterator();
    return wrap(new Lookahead<UnsafeRowPair>() {
      @Override
      protected UnsafeRowPair advance() {
        while (it.hasNext()) {
          UnsafeRow k = it.next();
          UnsafeRow v = get(k);
          if (v != null) {
            return new UnsafeRowPair(k, v);
          }
        }
        return null;
      }
    });
  }

  static StateStoreIterator<UnsafeRowPair> wrap(Iterator<UnsafeRowPair> it) {
    return new StateStoreIterator<>(CollectionConverters.asScala(it), () -> BoxedUnit.UNIT);
  }

  /** {@link #wrap} that closes {@code source} (a spill store's iterator) when Spark does. */
  static StateStoreIterator<UnsafeRowPair> wrap(Object source, Iterator<UnsafeRowPair> it) {
    if (!(source instanceof SpillStore.CloseableIterator<?> c)) {
      return wrap(it);
    }
    return new StateStoreIterator<>(CollectionConverters.asScala(it), () -> {
      c.close();
      return BoxedUnit.UNIT;
    });
  }
}
