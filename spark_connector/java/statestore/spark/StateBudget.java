package statestore.spark;

import java.util.concurrent.atomic.AtomicLong;

/**
 * The executor's cache of state on the heap ({@code spark.statestore.cacheBytes}): the bytes
 * of every version and overlay held in memory by this JVM's stores, counted as
 * {@code memoryUsedBytes} counts them (key + value + {@link #ROW_COST} per row). A
 * {@link StateData} whose put takes the total past the limit moves its rows to a
 * {@link SpillStore} (unless it is small: under {@link #minSpill}), so the heap holds at most
 * about {@code cacheBytes} of state however big a partition is.
 *
 * <p>The default is 20% of the heap ({@code Runtime.maxMemory()}), at least 16 MiB: state
 * lives outside Spark's memory manager, in what Spark leaves as "user memory", 40% of the
 * heap above Spark's 300 MiB reserve with the default {@code spark.memory.fraction} (290 MiB
 * on a 1 GiB executor), so 20% (205 MiB) fits that share with the commit buffers
 * ({@code maxCommitBytes}) left over for the rest.
 */
final class StateBudget {
  /**
   * What a row costs on the heap besides its key's and value's bytes: two {@code UnsafeRow}
   * objects (40 bytes each), their arrays' headers (16 each), the map's node (32) and its
   * share of the map's table. Measured by {@code bench/spark_heap.py} (a class histogram of
   * 400,000 rows of 240 bytes: 157 bytes a row besides them); it was 64, which undercounted
   * 200-byte rows' heap by 1.3-1.4x.
   */
  static final long ROW_COST = 160;

  static final double DEFAULT_FRACTION = 0.20;
  static final long DEFAULT_MIN = 16L << 20;
  private static final AtomicLong USED = new AtomicLong();
  private static volatile long limit = defaultLimit();

  private StateBudget() {}

  static long defaultLimit() {
    return Math.max(DEFAULT_MIN, (long) (Runtime.getRuntime().maxMemory() * DEFAULT_FRACTION));
  }

  /** Set from the provider's conf (the last provider initialized wins; one value per JVM). */
  static void setLimit(long bytes) {
    limit = bytes;
  }

  static long limit() {
    return limit;
  }

  static long used() {
    return USED.get();
  }

  /** Count {@code delta} bytes; whether the cache is now over its limit. */
  static boolean add(long delta) {
    return USED.addAndGet(delta) > limit;
  }

  /**
   * Below this a version stays on the heap even when the cache is full (1/64 of the cache:
   * a spill store per tiny version costs more than it saves; {@code cacheBytes=0} spills
   * every version and overlay).
   */
  static long minSpill() {
    return limit / 64;
  }
}
