package statestore.spark;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;

/**
 * A Bloom filter of the keys put into a spilled overlay ({@link StateData}): a key it has
 * not seen is answered absent without a read of the spill store. A streaming aggregation
 * puts each of its batch's keys once, and each put first asks the overlay for the key: every
 * such read misses, and on a spill store each costs a RocksDB read (its memtables and
 * files). 12 bits and 6 probes a key sized for {@code expected} keys, at most 4M keys (6
 * MiB): about 0.4% false positives at that count, 6% at twice it, 42% at four times; a
 * false positive only costs the read the filter would have saved. Not thread-safe: an overlay has one writer, its
 * task.
 */
final class KeyFilter {
  private static final int PROBES = 6;
  private static final int BITS_PER_KEY = 12;
  private final long[] words;
  private final long bits;

  KeyFilter(long expected) {
    long n = Math.max(1L << 12, Math.min(expected, 1L << 22)) * BITS_PER_KEY;
    this.words = new long[(int) ((n + 63) >>> 6)];
    this.bits = (long) words.length << 6;
  }

  /** The bytes it holds on the heap. */
  long bytes() {
    return 16L + 8L * words.length;
  }

  void add(UnsafeRow key) {
    long h = mix(key.hashCode());
    long step = (h >>> 32) | 1;
    for (int i = 0; i < PROBES; i++, h += step) {
      long bit = Long.remainderUnsigned(h, bits);
      words[(int) (bit >>> 6)] |= 1L << bit;
    }
  }

  /** False: {@code key} was never added. True: it may have been. */
  boolean mightHold(UnsafeRow key) {
    long h = mix(key.hashCode());
    long step = (h >>> 32) | 1;
    for (int i = 0; i < PROBES; i++, h += step) {
      long bit = Long.remainderUnsigned(h, bits);
      if ((words[(int) (bit >>> 6)] & (1L << bit)) == 0) {
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
