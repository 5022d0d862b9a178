package statestore.spark;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Callable;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;

/**
 * The part of a lazily loaded version that is still on the ring: the first manifest of each
 * shard's chain (its snapshot, or version 1), whose chunks are blocked ({@link ChunkCodec}:
 * blocks of ~4 KiB in a snapshot, each compressed and checksummed on its own, with an
 * index). Loading it read nothing of them: a batch's keys read ahead go to the nodes, which
 * read the indexes and blocks they hold, where a chunk has many of them, and are read from
 * their blocks where it has a few ({@link #readAhead}); a key read alone reads its chunk's
 * index when a read needs it (verified against the manifest, kept in a per-JVM LRU of
 * indexes, 1/4 of the cache), then the one block that can hold it, by range, verified
 * against the index ({@link #lookup}). So a restart reads what its batch touches, not
 * indexes that grow with the state. The deltas above the base were folded into the
 * version's own map when it was loaded ({@link StateData}), so a key costs at most one block
 * fetch per chunk of the base that covers its key group (one, unless a group spans
 * chunks). Its chunks are read whole, one at a time ({@link #chunk}), when the version is
 * made whole (a scan, the {@link Prefetcher}).
 *
 * <p>Decoded blocks are kept in an LRU shared by every lazily loaded version of the JVM
 * ({@link #cacheBytes}: 1/8 of {@code spark.statestore.cacheBytes}), so neighbouring keys and
 * repeated reads fetch nothing; blocks never change (a chunk's name carries its checksum).
 * The LRUs of blocks and of indexes and the memo below count in the executor's cache
 * ({@link StateBudget}), so the heap holds at most about {@code cacheBytes} of state, lazy or
 * not. Nothing here is written:
 * a version's changes stay in its map, and a copy of the version shares its base.
 *
 * <p>A batch reads a key of the base more than once: the read store's {@code get}, then
 * the write store's {@code get} before its {@code put} (after the whole partition was read,
 * so its block may have left the LRU). The answers read from a block are kept in a memo of
 * looked-up rows ({@link #memoBytes}, 1/16 of {@code cacheBytes}, least recently used
 * dropped first; a key the indexes rule out costs nothing to ask again): a row costs a few
 * hundred bytes where its block costs several KiB, so a key's block is fetched once a
 * batch. The commit's apply reads nothing (the write store counted the keys it added and
 * removed).
 */
final class LazyBase {
  /** Neither the LRU nor the memo is smaller than this, whatever {@code cacheBytes} says. */
  static final long MIN_BYTES = 256L << 10;

  /**
   * One chunk of a shard's base: its key, the key groups it covers, its version and its
   * manifest entry, and its index while the JVM holds it ({@link #index(Part)}). Equal only to
   * itself.
   */
  static final class Part {
    final String key;
    final int lo;
    final int hi;
    private final long version;
    private final ManifestCodec.ChunkRef ref;
    /** The parsed index, while the LRU of indexes holds it (null before it is read and after). */
    private volatile ChunkCodec.Index index;

    Part(String key, long version, ManifestCodec.ChunkRef ref) {
      this.key = key;
      this.lo = ref.lo();
      this.hi = ref.hi();
      this.version = version;
      this.ref = ref;
    }

    long version() {
      return version;
    }

    ManifestCodec.ChunkRef ref() {
      return ref;
    }

    /** Whether the index is held. */
    boolean indexed() {
      return index != null;
    }
  }

  /** Indexes the lazy bases of this JVM read (tests, the bench). */
  static final AtomicLong INDEXES_READ = new AtomicLong();

  private record Block(Map<ByteBuffer, byte[]> rows, long bytes) {}

  /** Decoded blocks, by chunk key and block ({@link #cacheBytes}). */
  private static final ByteLru<String, Block> BLOCKS =
      new ByteLru<>(64, LazyBase::cacheBytes, (name, b) -> b.bytes());
  /**
   * The chunks whose indexes are held, with their heap bytes ({@link #indexBytes}): a chunk
   * pushed out drops its index, read again when a read needs it. Its lock is taken after a
   * Part's, never before.
   */
  private static final ByteLru<Part, Long> INDEXES =
      new ByteLru<>(64, LazyBase::indexBytes, (p, bytes) -> bytes, (p, bytes) -> p.index = null);

  private final RingDirect direct;
  private final long timeoutMs;
  /** The base manifest of each shard. */
  final List<ManifestCodec.Manifest> bases;
  private final List<List<Part>> parts;
  /** The memo's mark for a key the base does not hold (compared by identity). */
  private static final byte[] ABSENT = new byte[0];
  /** A key of one base (its {@link Held}), in the memo. */
  private record Looked(Held owner, ByteBuffer key) {}

  /**
   * Rows looked up lately, of every base of the JVM (value, or {@link #ABSENT}; key + value +
   * {@link StateBudget#ROW_COST} a row, {@link #memoBytes}).
   */
  private static final ByteLru<Looked, byte[]> MEMO = new ByteLru<>(256, LazyBase::memoBytes,
      (mk, v) -> mk.key().remaining() + v.length + StateBudget.ROW_COST);
  /**
   * Bytes a base's reads took from the ring, for {@code ringBytesFetched}: kept by the version
   * after it is whole ({@link StateData#reads}), so what a prefetch read is reported too.
   */
  static final class Reads {
    /** Bytes read (blocks, and chunks read whole). */
    final AtomicLong fetched = new AtomicLong();
    /** Of {@link #fetched}, what write stores have reported already (one batch after another). */
    final AtomicLong reported = new AtomicLong();
  }

  /** What this base's reads took from the ring (shared with the bases that replace it). */
  final Reads reads;

  /**
   * A newer base of a version whose reads of this one failed: the provider's
   * ({@code RingStateStoreProvider.newerBase}).
   */
  interface Rebaser {
    /**
     * The base {@code version}'s chains start at now, when not {@code stale} (the nodes
     * folded a newer snapshot, and thinning may have dropped the old one's chunks); null when
     * they still start at {@code stale} (its chunks should be there: the failure was the
     * ring's) or the newer base cannot be read lazily.
     */
    LazyBase newerBase(long version, LazyBase stale);
  }

  /** Where a newer base comes from when this one's chunks cannot be read (null: nowhere). */
  final Rebaser rebaser;
  /** What the JVM holds of this base, and the versions reading it. */
  final Held held;

  LazyBase(RingDirect direct, long timeoutMs, List<ManifestCodec.Manifest> bases,
      List<List<Part>> parts, Reads reads, Rebaser rebaser) {
    this.direct = direct;
    this.timeoutMs = timeoutMs;
    this.bases = List.copyOf(bases);
    this.parts = List.copyOf(parts);
    this.reads = reads == null ? new Reads() : reads;
    this.rebaser = rebaser;
    this.held = new Held(this.parts);
    this.confirmed = oldest();
  }

  /** A block of the base could not be read from the ring ({@link #lookup}). */
  static final class Unreadable extends IllegalStateException {
    Unreadable(String message, Throwable cause) {
      super(message, cause);
    }
  }

  /** The first row of the first block of the base holding one ({key, value}), or null. */
  byte[][] firstRow() {
    for (List<Part> shard : parts) {
      for (Part p : shard) {
        ChunkCodec.Index ix = index(p);
        if (ix.offsets().length > 0) {
          byte[] first = ix.firstKeys()[0];
          byte[] v = block(p, 0).rows.get(ByteBuffer.wrap(first));
          if (v != null) {
            return new byte[][] {first, v};
          }
        }
      }
    }
    return null;
  }

  /**
   * The newest version whose chains, read from the ring, still started at this base (the
   * oldest base version at first): the provider reads them again {@code lazyHorizon} versions
   * later ({@code RingStateStoreProvider.rebased}).
   */
  volatile long confirmed;

  /** Whether every shard's chain in {@code chains} starts at this base's manifest. */
  boolean startsEvery(List<List<ManifestCodec.Manifest>> chains) {
    if (chains.size() != bases.size()) {
      return false;
    }
    for (int shard = 0; shard < chains.size(); shard++) {
      ManifestCodec.Manifest mine = bases.get(shard);
      ManifestCodec.Manifest theirs = chains.get(shard).get(0);
      if (mine.version() != theirs.version() || mine.epoch() != theirs.epoch()
          || !mine.store().equals(theirs.store()) || !mine.chunks().equals(theirs.chunks())) {
        return false;
      }
    }
    return true;
  }

  /** The oldest version among the shards' bases. */
  long oldest() {
    long out = Long.MAX_VALUE;
    for (ManifestCodec.Manifest m : bases) {
      out = Math.min(out, m.version());
    }
    return out;
  }

  /**
   * Decoded blocks kept per JVM (raw key and value bytes plus {@link StateBudget#ROW_COST} a
   * row): 1/8 of the cache.
   */
  static long cacheBytes() {
    return Math.max(MIN_BYTES, StateBudget.limit() / 8);
  }

  /**
   * Bytes of the memo of looked-up rows (key + value + {@link StateBudget#ROW_COST} a row):
   * 1/16 of the cache.
   */
  static long memoBytes() {
    return Math.max(MIN_BYTES, StateBudget.limit() / 16);
  }

  /** The least the index LRU holds, whatever {@code cacheBytes} says. */
  static final long MIN_INDEX_BYTES = 16L << 10;

  /**
   * Bytes of parsed indexes kept per JVM ({@link #heapBytes}): 1/4 of the cache, counted in
   * it. The indexes a JVM reads grow with the chunks its batches touch, so with the state (a
   * windowed count at 2 GiB reads ~50 MiB of them, under a 205 MiB cache's quarter); past
   * this the least recently used is dropped, and read again when a read needs it.
   */
  static long indexBytes() {
    return Math.max(MIN_INDEX_BYTES, StateBudget.limit() / 4);
  }

  /**
   * Whether the LRU of indexes agrees with itself (tests): its bytes are its entries' sum,
   * and every chunk in it holds its index.
   */
  static boolean indexesConsistent() {
    return INDEXES.consistent((p, bytes) -> p.index != null);
  }

  /** The parsed indexes' bytes the JVM holds now (tests). */
  static long indexesHeld() {
    return INDEXES.held();
  }

  /** The bytes of decoded blocks the JVM holds now (tests). */
  static long blocksHeld() {
    return BLOCKS.held();
  }

  /** The bytes of the memo of looked-up rows the JVM holds now (tests). */
  static long memoHeld() {
    return MEMO.held();
  }

  /**
   * What the JVM holds of one base, and the versions that read it now
   * ({@link StateData#readFrom}). It refers to the base's chunks only, not to the base or its
   * provider: a version's cleanup holds it, and must not keep the version reachable.
   */
  static final class Held {
    /** The bases some version reads now: their chunks' blocks are not dropped. */
    private static final java.util.Set<Held> LIVE = ConcurrentHashMap.newKeySet();
    private final List<List<Part>> parts;
    /** Versions reading the base now (changed under this object's lock, read without it). */
    private volatile int users;

    Held(List<List<Part>> parts) {
      this.parts = parts;
    }

    /** A version reads the base now. */
    synchronized void use() {
      if (users++ == 0) {
        LIVE.add(this);
      }
    }

    /**
     * A version no longer reads the base (it is whole, reads a newer base, or was let go):
     * when none does, what the JVM holds of it goes ({@link #forget}).
     */
    void unuse() {
      synchronized (this) {
        if (--users > 0) {
          return;
        }
        if (users < 0) {
          users = 0; // let go more often than used: a bug, said once and not compounded
          org.slf4j.LoggerFactory.getLogger(LazyBase.class).error(
              "a lazy base let go by more versions than read it");
          return;
        }
        LIVE.remove(this);
      }
      forget();
    }

    /**
     * Whether a version reads the base: what a read of it brings is kept only then (a read
     * under way when the last version let go, a read-ahead or a task's get, would otherwise
     * leave entries no {@link #forget} drops).
     */
    boolean live() {
      return users > 0;
    }

    /**
     * Drop what the JVM holds of the base: its chunks' indexes, its decoded blocks and its
     * rows in the memo, and their bytes from the cache, where they stayed until newer entries
     * pushed them out (a version the prefetch made whole reads no more: up to 7/16 of
     * {@code cacheBytes} held for nothing, and versions spilled that could stay on the
     * heap). A block of a chunk that a base still read shares (the same version loaded
     * lazily again, by this provider or another of the JVM) stays.
     */
    void forget() {
      java.util.Set<Part> mine =
          java.util.Collections.newSetFromMap(new java.util.IdentityHashMap<>());
      java.util.Set<String> chunks = new java.util.HashSet<>();
      for (List<Part> shard : parts) {
        for (Part p : shard) {
          mine.add(p);
          chunks.add(p.key);
        }
      }
      for (Held other : LIVE) {
        for (List<Part> shard : other.parts) {
          for (Part p : shard) {
            chunks.remove(p.key);
          }
        }
      }
      INDEXES.removeIf((p, bytes) -> mine.contains(p));
      BLOCKS.removeIf((name, b) -> chunks.contains(name.substring(0, name.lastIndexOf('#'))));
      MEMO.removeIf((mk, v) -> mk.owner() == this);
    }
  }

  /**
   * What a parsed index takes on the heap: its arrays (a block's group, first key, offset,
   * length, checksum and row count, with the first key's array header) and its Bloom filter.
   */
  static long heapBytes(ChunkCodec.Index ix) {
    long out = 256 + 52L * ix.offsets().length + (ix.keys() == null ? 0 : ix.keys().length);
    for (byte[] k : ix.firstKeys()) {
      out += k.length;
    }
    return out;
  }

  /**
   * The value of {@code key} in the base, or null if the base does not hold it;
   * {@link Unreadable} when the block that may hold it cannot be read.
   */
  byte[] lookup(UnsafeRow key) {
    // a copy: getBytes() may answer the row's own buffer, which its caller reuses
    byte[] k = key.getBytes().clone();
    Looked mk = new Looked(held, ByteBuffer.wrap(k));
    byte[] seen = MEMO.get(mk);
    if (seen != null) {
      return seen == ABSENT ? null : seen;
    }
    byte[] v = find(shardOf(key), k);
    if (v == null) {
      return null; // ruled out by the indexes: nothing to remember
    }
    MEMO.putIf(mk, v, held::live);
    return v == ABSENT ? null : v;
  }

  /**
   * The fewest keys of one chunk a read-ahead asks in a lookup, by default
   * ({@code readAheadMinKeys}): fewer are read from their blocks in the read-ahead, the
   * chunk's index read first when the JVM lacks it. A lookup costs its node a request (about
   * 0.7 ms of its CPU) and, unless its cache holds it, the chunk's index (30-80 KiB read and
   * parsed), then ~0.04 ms a key; a block read ~0.3 ms a key, and the index once a JVM.
   * Below a handful of keys a lookup saves nothing: a windowed count at 2 GiB, whose batches
   * touch ~5 keys of each of hundreds of chunks, sent 1,200 lookups a batch, a lookup a chunk,
   * and its next batch took 1.23x the time of block reads with the indexes held
   * (docs/benchmarks.md). The count query's windows hold 50-100 keys a chunk.
   */
  static final int LOOKUP_MIN_KEYS = 8;
  /** The most keys of one read-ahead lookup (the node takes up to 1,000). */
  static final int LOOKUP_KEYS = 500;
  /** The most key bytes of one read-ahead lookup (the node takes up to 256 KiB). */
  static final int LOOKUP_KEY_BYTES = 64 << 10;
  /**
   * Keys a read-ahead takes at once ({@code ReadAheadExec}): what a quarter of the memo holds
   * at about 512 bytes a row, between 64 and 4,096, so that two tasks' windows stay in the
   * memo until their rows are read.
   */
  static int readAheadRows() {
    return (int) Math.max(64, Math.min(4096, memoBytes() / 4 / 512));
  }

  /** Keys whose base values a read-ahead brought (tests, the bench). */
  static final AtomicLong READ_AHEAD_KEYS = new AtomicLong();
  /** Lookups the read-aheads sent (tests, the bench). */
  static final AtomicLong READ_AHEAD_LOOKUPS = new AtomicLong();
  /** Of {@link #READ_AHEAD_KEYS}, the keys a read-ahead read from blocks (tests, the bench). */
  static final AtomicLong READ_AHEAD_BLOCK_KEYS = new AtomicLong();
  /** Read-ahead lookups and block reads that failed (their keys read when asked for). */
  static final AtomicLong READ_AHEAD_FAILED = new AtomicLong();

  /**
   * Bring what the base holds under {@code keys} into the memo of looked-up rows, up to 8
   * requests at a time: the keys the memo lacks and whose blocks are not cached, grouped by
   * the chunks that can hold them. A chunk covering fewer than {@code minKeys} of them has
   * its index read (all such at once, up to half the LRU of indexes, and the whole of it
   * among the read-aheads running at once, {@link #AHEAD_ROOM}) if the JVM lacks it.
   * Then the keys of chunks whose indexes are read are grouped by the chunks whose indexes
   * and Bloom filters do not rule them out; the other keys by each chunk covering their
   * group that no index held rules out (a key of a group split over two chunks asked of
   * both: a lookup a chunk, whose node reads that chunk's index only). A group of at least
   * {@code minKeys} keys, or whose indexes are not read, is asked of one holder of its chunk
   * in lookups ({@code POST .../lookup}, node/lookup.py) of up to {@link #LOOKUP_KEYS} keys:
   * the node reads and verifies the blocks against the index checksums the manifest names
   * and answers each key's value or nil, so a batch that touches many keys of a chunk costs
   * one request per chunk and window of keys, not one block read per key. A smaller group is
   * read from its blocks here, as {@link #lookup} would. Best effort: a lookup or block read
   * that fails leaves its keys to {@link #lookup}, which reads their blocks. Returns the keys
   * brought.
   */
  int readAhead(List<UnsafeRow> keys, int minKeys) {
    // the keys to ask: each once (the node refuses a key twice in a lookup), not in the memo,
    // with a chunk covering its group
    List<Want> wants = new ArrayList<>();
    java.util.Set<ByteBuffer> seen = new java.util.HashSet<>();
    // of the chunks whose indexes are not read, how many of the keys each covers
    Map<Part, Integer> unindexed = new LinkedHashMap<>();
    for (UnsafeRow key : keys) {
      byte[] k = key.getBytes().clone();
      if (!seen.add(ByteBuffer.wrap(k))) {
        continue;
      }
      if (MEMO.contains(new Looked(held, ByteBuffer.wrap(k)))) {
        continue;
      }
      int shard = shardOf(key);
      List<Part> covering = covering(shard, k);
      if (covering.isEmpty()) {
        continue;
      }
      wants.add(new Want(k, shard, covering));
      for (Part p : covering) {
        if (!p.indexed()) {
          unindexed.merge(p, 1, Integer::sum);
        }
      }
    }
    // a chunk with fewer than minKeys of them: its index read here (all such at once), its
    // keys then read block by block below, as a chunk's whose index was read already (a
    // lookup of a few keys costs its node the index too, and a request: a windowed count at
    // 2 GiB touches ~5 keys of each of hundreds of chunks a batch); up to half the LRU of
    // indexes a read-ahead and the whole LRU among the read-aheads running at once (a parsed
    // index takes about twice its bytes as stored; each task of an executor reads ahead its
    // own batch), so that those they read stay until their keys are read: the others' keys
    // go in lookups
    List<Callable<Integer>> indexes = new ArrayList<>();
    long taken = 0; // of the room the read-aheads running at once share
    try {
      for (Map.Entry<Part, Integer> e : unindexed.entrySet()) {
        long cost = 2L * e.getKey().ref.indexLen();
        if (e.getValue() < minKeys && taken + cost <= indexBytes() / 2
            && takeAheadRoom(cost)) {
          taken += cost;
          Part p = e.getKey();
          indexes.add(() -> {
            try {
              index(p);
              return 1;
            } catch (RuntimeException x) {
              return 0; // best effort: its keys go in a lookup
            }
          });
        }
      }
      return readAhead(wants, indexes, minKeys);
    } finally {
      AHEAD_ROOM.addAndGet(-taken); // its keys are read: its indexes may go
    }
  }

  /**
   * Bytes of indexes the read-aheads running now read, together ({@link #readAhead}): at
   * most the LRU of indexes, so that what each reads stays until its keys are read however
   * many tasks read ahead at once (each reads up to half of it: two tasks, as on 2 cores,
   * the whole, and more share it).
   */
  private static final AtomicLong AHEAD_ROOM = new AtomicLong();

  /** Take {@code bytes} of {@link #AHEAD_ROOM} if there is that much left (tests: negative). */
  static boolean takeAheadRoom(long bytes) {
    while (true) {
      long now = AHEAD_ROOM.get();
      if (bytes > 0 && now + bytes > indexBytes()) {
        return false;
      }
      if (AHEAD_ROOM.compareAndSet(now, now + bytes)) {
        return true;
      }
    }
  }

  /** {@link #readAhead}, once its indexes to read are chosen. */
  private int readAhead(List<Want> wants, List<Callable<Integer>> indexes, int minKeys) {
    // the indexes get half the read-ahead's time, the lookups and block reads the rest
    long start = System.nanoTime();
    long deadline = start + timeoutMs * 1_000_000L;
    try {
      RingDirect.together(indexes, start + timeoutMs * 500_000L, "reading indexes ahead");
    } catch (IOException | RuntimeException e) {
      // best effort: the keys of a chunk whose index was not read go in a lookup
    }
    // keys whose chunks' indexes are read: by the blocks' chunks (the exact path)
    Map<List<Part>, Ahead> byPath = new LinkedHashMap<>();
    // keys of chunks whose indexes are not: by chunk, each asked of every chunk covering its
    // group (a group split over two chunks: of both, in their own lookups, so that a node
    // reads the indexes of the chunks it is asked about only; the key is in one of them)
    Map<Part, Ahead> byChunk = new LinkedHashMap<>();
    // of those, the keys asked of several chunks: how many have not answered nil yet
    Map<ByteBuffer, AtomicInteger> split = new HashMap<>();
    for (Want want : wants) {
      byte[] k = want.key;
      int shard = want.shard;
      List<Part> covering = want.covering;
      int g = ChunkCodec.keyGroup(k, bases.get(shard).keyGroups());
      // the covering chunks' indexes held now: one the LRU drops meanwhile is not read here
      ChunkCodec.Index[] known = new ChunkCodec.Index[covering.size()];
      boolean all = true;
      for (int i = 0; i < known.length; i++) {
        known[i] = covering.get(i).index;
        all &= known[i] != null;
      }
      if (!all) { // the node reads the indexes
        List<Part> asked = new ArrayList<>(covering.size());
        for (int i = 0; i < known.length; i++) {
          if (known[i] == null || known[i].find(g, k) >= 0) { // not ruled out by its index
            asked.add(covering.get(i));
          }
        }
        for (Part p : asked) {
          Ahead a = byChunk.computeIfAbsent(p, x -> new Ahead(shard, false));
          if (a.path.isEmpty()) {
            a.path.add(p);
          }
          a.keys.add(k);
        }
        if (asked.size() > 1) {
          split.put(ByteBuffer.wrap(k), new AtomicInteger(asked.size()));
        }
        continue;
      }
      List<Part> path = new ArrayList<>(2);
      boolean fetch = false;
      for (int i = 0; i < known.length; i++) { // the blocks that may hold it, as spots() finds
        int block = known[i].find(g, k);
        if (block >= 0) {
          Part p = covering.get(i);
          path.add(p);
          fetch |= !BLOCKS.contains(p.key + "#" + block);
        }
      }
      if (fetch) { // else ruled out by the indexes, or its blocks are here: nothing to send
        Ahead a = byPath.computeIfAbsent(path, x -> new Ahead(shard, true));
        if (a.path.isEmpty()) {
          a.path.addAll(path);
        }
        a.keys.add(k);
      }
    }
    List<Callable<Integer>> calls = new ArrayList<>();
    List<Ahead> all = new ArrayList<>(byPath.values());
    all.addAll(byChunk.values());
    for (Ahead a : all) {
      if (a.indexed && a.keys.size() < minKeys) { // cheaper block by block, the indexes here
        calls.add(() -> readBlocks(a.shard, a.keys));
        continue;
      }
      int from = 0;
      while (from < a.keys.size()) {
        int to = from;
        int bytes = 0;
        while (to < a.keys.size() && to - from < LOOKUP_KEYS
            && (to == from || bytes + a.keys.get(to).length <= LOOKUP_KEY_BYTES)) {
          bytes += a.keys.get(to).length;
          to++;
        }
        List<byte[]> batch = a.keys.subList(from, to);
        ManifestCodec.Manifest base = bases.get(a.shard);
        calls.add(() -> lookupAhead(base.store(), base.keyGroups(), a.path, batch, split));
        from = to;
      }
    }
    if (calls.isEmpty() || System.nanoTime() >= deadline) {
      return 0; // nothing to ask, or no time left: the keys are read when asked for
    }
    int brought = 0;
    try {
      for (int n : RingDirect.together(calls, deadline, "reading ahead")) {
        brought += n;
      }
    } catch (IOException | RuntimeException e) {
      // best effort: what was not brought is read block by block when it is asked for
    }
    READ_AHEAD_KEYS.addAndGet(brought);
    return brought;
  }

  /** A key a read-ahead asks: its shard and the chunks covering its key group. */
  private record Want(byte[] key, int shard, List<Part> covering) {}

  /**
   * The keys of {@code shard} whose chunks' indexes are read, each read from its blocks as
   * {@link #lookup} does and kept in the memo; the keys brought. Best effort: a block that
   * cannot be read leaves its key and those after it to {@link #lookup}.
   */
  private int readBlocks(int shard, List<byte[]> batch) {
    int brought = 0;
    try {
      for (byte[] k : batch) {
        byte[] v = find(shard, k);
        if (v != null) { // else ruled out by the indexes: nothing to remember
          MEMO.putIf(new Looked(held, ByteBuffer.wrap(k)), v, held::live);
          brought++;
        }
      }
    } catch (RuntimeException e) {
      READ_AHEAD_FAILED.incrementAndGet();
    }
    READ_AHEAD_BLOCK_KEYS.addAndGet(brought);
    return brought;
  }

  /** The keys of one shard a read-ahead asks along one path (see {@link #readAhead}). */
  private static final class Ahead {
    final int shard;
    /** Whether the path's indexes were read (it names the blocks' chunks only). */
    final boolean indexed;
    final List<Part> path = new ArrayList<>(2);
    final List<byte[]> keys = new ArrayList<>();

    Ahead(int shard, boolean indexed) {
      this.shard = shard;
      this.indexed = indexed;
    }
  }

  /**
   * One read-ahead lookup of {@code batch} along {@code path}, sent to a holder of its last
   * chunk first; the keys it brought. A key of {@code split} was asked of other chunks too
   * (it is in one of them at most): a nil from this one is the base's answer only once every
   * one of them said nil.
   */
  private int lookupAhead(String storePath, int groups, List<Part> path, List<byte[]> batch,
      Map<ByteBuffer, AtomicInteger> split) {
    Part anchor = path.get(path.size() - 1);
    List<byte[]> values;
    try {
      values = direct.lookup(storePath, anchor.key, groups, batch, path,
          System.nanoTime() + timeoutMs * 1_000_000L);
    } catch (IOException | RuntimeException e) {
      READ_AHEAD_FAILED.incrementAndGet();
      return 0; // its keys are read block by block when asked for
    }
    long bytes = 0;
    int brought = 0;
    for (int i = 0; i < batch.size(); i++) {
      byte[] v = values.get(i);
      ByteBuffer k = ByteBuffer.wrap(batch.get(i));
      AtomicInteger others = split.get(k);
      bytes += batch.get(i).length + (v == null ? 1 : v.length);
      if (others != null) {
        if (v != null) {
          others.set(Integer.MIN_VALUE / 2); // found: the other chunks' nils say nothing
        } else if (others.decrementAndGet() != 0) {
          continue; // another chunk may hold it, or did
        }
      }
      MEMO.putIf(new Looked(held, k), v == null ? ABSENT : v, held::live);
      brought++;
    }
    reads.fetched.addAndGet(bytes);
    READ_AHEAD_LOOKUPS.incrementAndGet();
    return brought;
  }

  /**
   * The value of {@code key} in the base; {@link #ABSENT} if a block that could hold it does
   * not, null if no block can (the indexes and Bloom filters rule it out: nothing read).
   */
  private byte[] find(int shard, byte[] k) {
    byte[] out = null;
    for (Spot s : spots(shard, k)) {
      byte[] v = block(s.part, s.block).rows.get(ByteBuffer.wrap(k));
      if (v != null) {
        return v;
      }
      out = ABSENT;
    }
    return out;
  }

  /** A block of the base that may hold a key: its chunk and its number there. */
  private record Spot(Part part, int block) {}

  private int shardOf(UnsafeRow key) {
    return parts.size() == 1 ? 0 : StateCommit.shardOf(key, parts.size());
  }

  /**
   * The blocks of shard {@code shard}'s base that may hold the key {@code k}: of each chunk
   * covering its key group, the one its index and Bloom filter do not rule out (one, unless
   * a group spans chunks); none for a key the indexes rule out.
   */
  private List<Spot> spots(int shard, byte[] k) {
    int g = ChunkCodec.keyGroup(k, bases.get(shard).keyGroups());
    List<Spot> out = new ArrayList<>(2);
    for (Part p : covering(shard, k)) {
      int i = index(p).find(g, k);
      if (i >= 0) {
        out.add(new Spot(p, i));
      }
    }
    return out;
  }

  /** The chunks of the base covering {@code key}'s group, one or two (tests). */
  List<Part> coveringOf(UnsafeRow key) {
    return covering(shardOf(key), key.getBytes().clone());
  }

  /** The chunks of shard {@code shard}'s base covering the key group of {@code k}, in order. */
  private List<Part> covering(int shard, byte[] k) {
    int g = ChunkCodec.keyGroup(k, bases.get(shard).keyGroups());
    List<Part> out = new ArrayList<>(2);
    for (Part p : parts.get(shard)) {
      if (g >= p.lo && g <= p.hi) {
        out.add(p);
      }
    }
    return out;
  }

  /**
   * The index of {@code p}, read from the ring and verified against its manifest entry when a
   * read needs it (a block read, {@link #firstRow}) and the JVM does not hold it, then held in
   * the LRU of indexes ({@link #INDEXES}); {@link Unreadable} when it cannot be read. A lazy
   * load reads none: a batch's keys read ahead go to the nodes, which hold the indexes
   * ({@link #readAhead}).
   */
  ChunkCodec.Index index(Part p) {
    ChunkCodec.Index ix = p.index;
    if (ix != null) {
      INDEXES.get(p); // the most recently used now
      return ix;
    }
    synchronized (p) {
      ix = p.index;
      if (ix != null) {
        return ix;
      }
      ManifestCodec.ChunkRef ref = p.ref;
      long at = ref.size() - 4 - ref.indexLen();
      byte[] raw;
      try {
        raw = direct.fetchPart(p.key, at, ref.indexLen(), ref.indexChecksum(),
            System.nanoTime() + timeoutMs * 1_000_000L);
      } catch (IOException e) {
        throw new Unreadable("RingStateStoreProvider: cannot read the index of " + p.key
            + " from the ring: " + e.getMessage(), e);
      }
      try {
        ix = ChunkCodec.parseIndex(raw, 0, raw.length, at - 1, p.key);
      } catch (ChunkCodec.CorruptChunkException e) {
        throw new Unreadable("RingStateStoreProvider: the index of " + p.key
            + " read from the ring is corrupt: " + e.getMessage(), e);
      }
      reads.fetched.addAndGet(raw.length);
      INDEXES_READ.incrementAndGet();
      p.index = ix;
      // held in the LRU of indexes, counted in the cache: the least recently used go past its
      // bytes (their chunks' indexes read again when a read needs them), never p's own; not
      // held when no version reads the base any more
      if (!INDEXES.putIf(p, heapBytes(ix), held::live)) {
        p.index = null;
      }
      return ix; // p.index may be dropped already: this read has its own
    }
  }

  private Block block(Part p, int i) {
    String name = p.key + "#" + i;
    Block hit = BLOCKS.get(name);
    if (hit != null) {
      return hit;
    }
    ChunkCodec.Index ix = index(p);
    byte[] frame;
    try {
      frame = direct.fetchPart(p.key, ix.offsets()[i], ix.lengths()[i], ix.checksums()[i],
          System.nanoTime() + timeoutMs * 1_000_000L);
    } catch (IOException e) {
      throw new Unreadable("RingStateStoreProvider: cannot read block " + i + " of "
          + p.key + " from the ring: " + e.getMessage(), e);
    }
    reads.fetched.addAndGet(frame.length);
    List<ChunkCodec.Row> rows = ChunkCodec.decodeBlock(frame, 0, ix, i, ChunkCodec.MAX_CHUNK_RAW,
        p.key);
    Map<ByteBuffer, byte[]> map = new HashMap<>(rows.size() * 2);
    long bytes = 0;
    for (ChunkCodec.Row r : rows) {
      if (r.value() != null) {
        map.put(ByteBuffer.wrap(r.key()), r.value());
        bytes += r.key().length + r.value().length + StateBudget.ROW_COST;
      }
    }
    Block out = new Block(map, bytes);
    BLOCKS.putIf(name, out, held::live);
    return out;
  }

  /** Chunks of the bases whose indexes the JVM holds now (tests). */
  int indexed() {
    int n = 0;
    for (List<Part> shard : parts) {
      for (Part p : shard) {
        n += p.indexed() ? 1 : 0;
      }
    }
    return n;
  }

  /** Chunks of the bases, every shard's in order: what {@link #chunk} numbers. */
  int chunks() {
    int n = 0;
    for (ManifestCodec.Manifest base : bases) {
      n += base.chunks().size();
    }
    return n;
  }

  /**
   * The rows of chunk {@code i} of the bases ({@link #chunks}), read whole and verified:
   * what a version needs to become whole on this JVM, one chunk at a time
   * ({@link StateData#mergeNext}). A row with a null value is a delete (version 1 may hold
   * one: it deletes nothing).
   */
  List<ChunkCodec.Row> chunk(int i) throws IOException {
    for (ManifestCodec.Manifest base : bases) {
      if (i < base.chunks().size()) {
        ManifestCodec.ChunkRef ref = base.chunks().get(i);
        List<ChunkCodec.Row> rows =
            direct.chunkRows(base, ref, System.nanoTime() + timeoutMs * 1_000_000L);
        reads.fetched.addAndGet(ref.size());
        return rows;
      }
      i -= base.chunks().size();
    }
    throw new IndexOutOfBoundsException("chunk " + i + " past the bases' chunks");
  }
}
