package statestore.spark;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;

/**
 * A Bloom filter of the keys put into a spill store ({@link StateData}): a key it has not
 * seen is answered absent without a read of the store. An overlay's: a streaming aggregation
 * puts each of its batch's keys once, and each put first asks the overlay for the key, which
 * misses for every new key. A version's: a batch's new keys miss in the version twice (the
 * read store's get, the write store's put), and a merge of a lazy base's chunk asks it for
 * every row. On a spill store each miss would cost a RocksDB read (its memtables and files).
 *
 * <p>12 bits and 6 probes a key, the probes in one 512-bit block (a cache line) chosen by the
 * key's hash: about 0.5% false positives while a stage holds at most the keys it was sized
 * for (at least 4,096), a little over the 0.4% of probes spread over the whole filter, for
 * one memory read a check where those made six. A stage that is full gets a newer one (a chain),
 * sized for as many keys as the chain has room for, at most 4M keys (6 MiB) a stage, so the
 * rate stays under about 0.5% for each stage a key is checked against. A key already held
 * takes no room; a removed key keeps its bits (its owner rebuilds or drops a filter whose
 * keys outgrew the map's: {@link StateData}). A false positive only costs the read the
 * filter would have saved; a key it was given is never answered absent.
 *
 * <p>Not thread-safe for writers: a map's writes are one thread's at a time (an overlay's
 * task; a version's writers hold its lock). A reader racing a write may not see the key, as
 * it would not see the row it is written with.
 */
final class KeyFilter {
  private static final int PROBES = 6;
  private static final int BITS_PER_KEY = 12;
  /** Words a key's probes fall in: 512 bits, one cache line (two when not aligned). */
  private static final int BLOCK_WORDS = 8;
  private static final long MIN_KEYS = 1L << 12;
  private static final long MAX_KEYS = 1L << 22;
  private final long[] words;
  /** Blocks of {@link #BLOCK_WORDS} words. */
  private final int blocks;
  /** The keys this stage is sized for. */
  private final long room;
  /** The keys added to this stage. */
  private long added;
  /** The stages before this one (null: the first). */
  private final KeyFilter older;

  KeyFilter(long expected) {
    this(expected, null);
  }

  private KeyFilter(long expected, KeyFilter older) {
    this.room = Math.max(MIN_KEYS, Math.min(expected, MAX_KEYS));
    this.blocks = blocksFor(room);
    this.words = new long[blocks * BLOCK_WORDS];
    this.older = older;
  }

  private KeyFilter(KeyFilter from, KeyFilter older) {
    this.room = from.room;
    this.words = from.words.clone();
    this.blocks = from.blocks;
    this.added = from.added;
    this.older = older;
  }

  /** The bytes of a one-stage filter made for {@code expected} keys. */
  static long bytesFor(long expected) {
    long room = Math.max(MIN_KEYS, Math.min(expected, MAX_KEYS));
    return 48L + 8L * BLOCK_WORDS * blocksFor(room);
  }

  /**
   * An estimate of the bytes a filter takes for {@code keys} distinct keys, however many
   * stages it needs: full stages of {@link #MAX_KEYS} and one for the rest ({@link #bytesFor}
   * is one stage's, which stops growing at that size). A chain grown stage by stage may take
   * more (its last stage is made whole); a filter made for {@code keys} and given them does not.
   */
  static long chainBytesFor(long keys) {
    long full = keys / MAX_KEYS;
    long rest = keys % MAX_KEYS;
    return full * bytesFor(MAX_KEYS) + (rest > 0 || full == 0 ? bytesFor(rest) : 0);
  }

  private static int blocksFor(long room) {
    return (int) ((room * BITS_PER_KEY + 64 * BLOCK_WORDS - 1) / (64 * BLOCK_WORDS));
  }

  /** The most keys a one-stage filter of at most {@code bytes} is made for. */
  static long keysFor(long bytes) {
    return Math.max(MIN_KEYS, (bytes - 48L) * 8 / BITS_PER_KEY);
  }

  /** An independent copy (a copied version's). */
  KeyFilter copy() {
    java.util.ArrayDeque<KeyFilter> stages = new java.util.ArrayDeque<>();
    for (KeyFilter f = this; f != null; f = f.older) {
      stages.push(f); // the oldest last in, first out
    }
    KeyFilter out = null;
    while (!stages.isEmpty()) {
      out = new KeyFilter(stages.pop(), out);
    }
    return out;
  }

  /** The bytes it holds on the heap, every stage's. */
  long bytes() {
    long b = 0;
    for (KeyFilter f = this; f != null; f = f.older) {
      b += 48L + 8L * f.words.length;
    }
    return b;
  }

  /** The keys its stages are sized for. */
  private long rooms() {
    long r = 0;
    for (KeyFilter f = this; f != null; f = f.older) {
      r += f.room;
    }
    return r;
  }

  /**
   * Add {@code key}; returns the filter to keep: this one, or a newer stage on top of it when
   * this one is full. A key it answers as held already is not added again (a version's
   * batches put the same keys over and over: only new ones take room).
   */
  KeyFilter add(UnsafeRow key) {
    long h = mix(key.hashCode());
    for (KeyFilter f = this; f != null; f = f.older) {
      if (f.has(h)) {
        return this;
      }
    }
    KeyFilter to = this;
    if (added >= room) {
      to = new KeyFilter(rooms(), this);
    }
    to.set(h);
    to.added++;
    return to;
  }

  /** The keys added to its stages (each counted once, but for false positives). */
  long added() {
    long n = 0;
    for (KeyFilter f = this; f != null; f = f.older) {
      n += f.added;
    }
    return n;
  }

  /** The first word of the block {@code h} falls in (the high 32 bits, scaled to blocks). */
  private int block(long h) {
    return (int) (((h >>> 32) * blocks) >>> 32) * BLOCK_WORDS;
  }

  /**
   * The probes' 9-bit positions in the block, from a second mix of {@code h} (6 x 9 of its
   * 64 bits): a key's probes all fall in one block, so a check or an add touches one cache
   * line where probes over the whole filter touched one each.
   */
  private static long positions(long h) {
    return h * 0xC2B2AE3D27D4EB4FL;
  }

  private void set(long h) {
    int at = block(h);
    long p = positions(h);
    for (int i = 0; i < PROBES; i++, p >>>= 9) {
      int bit = (int) (p & 511);
      words[at + (bit >>> 6)] |= 1L << bit;
    }
  }

  /** False: {@code key} was never added. True: it may have been. */
  boolean mightHold(UnsafeRow key) {
    long h = mix(key.hashCode());
    for (KeyFilter f = this; f != null; f = f.older) {
      if (f.has(h)) {
        return true;
      }
    }
    return false;
  }

  private boolean has(long h) {
    int at = block(h);
    long p = positions(h);
    for (int i = 0; i < PROBES; i++, p >>>= 9) {
      int bit = (int) (p & 511);
      if ((words[at + (bit >>> 6)] & (1L << bit)) == 0) {
        return false;
      }
    }
    return true;
  }

  /** The row's own 32-bit hash (Murmur3 of its bytes) spread over 64 bits. */
  private static long mix(int hash) {
    long z = (hash & 0xffffffffL) * 0x9E3779B97F4A7C15L;
    z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
    return z ^ (z >>> 31);
  }
}
