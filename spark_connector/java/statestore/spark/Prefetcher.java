package statestore.spark;

import java.lang.ref.WeakReference;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Makes lazily loaded versions whole in the background ({@code spark.statestore.prefetchBytesPerSec}):
 * one daemon thread per JVM reads their bases' chunks one after another, at most that many
 * bytes a second over all of them, and merges each into its version ({@link StateData#mergeNext})
 * while batches run. Until a chunk is merged, a key of it is read by its block as before
 * ({@link LazyBase}); once every chunk is, the version reads nothing more from the ring, so
 * the batches after a restart cost what a whole restore's would, without the first one
 * waiting for it.
 *
 * <p>Versions are queued by weak reference: a version dropped by its provider is skipped.
 * A chunk that cannot be read is left: the version stays lazy (its keys are read by block,
 * a scan makes it whole or fails as it would have).
 */
public final class Prefetcher {
  private static final Logger LOG = LoggerFactory.getLogger(Prefetcher.class);
  private static final LinkedBlockingQueue<WeakReference<StateData>> QUEUE =
      new LinkedBlockingQueue<>();
  private static volatile long rate;
  private static Thread thread;
  /** Chunks this JVM's prefetch merged. */
  private static final AtomicLong MERGED = new AtomicLong();
  /** Versions queued and not yet finished. */
  private static final AtomicLong PENDING = new AtomicLong();

  private Prefetcher() {}

  /** Queue {@code data} to be made whole at {@code bytesPerSec} (0: no prefetch). */
  static synchronized void schedule(StateData data, long bytesPerSec) {
    if (bytesPerSec <= 0 || data.remote == null) {
      return;
    }
    rate = bytesPerSec;
    PENDING.incrementAndGet();
    QUEUE.add(new WeakReference<>(data));
    if (thread == null || !thread.isAlive()) {
      thread = new Thread(Prefetcher::run, "statestore-prefetch");
      thread.setDaemon(true);
      thread.start();
    }
  }

  /** Whether every queued version was made whole (or dropped, or failed): for tests. */
  public static boolean idle() {
    return PENDING.get() == 0;
  }

  /** Chunks of lazy versions' bases this JVM's prefetch read and merged: for tests. */
  public static long merged() {
    return MERGED.get();
  }

  private static void run() {
    while (true) {
      StateData data;
      try {
        data = QUEUE.take().get();
      } catch (InterruptedException e) {
        return;
      }
      try {
        if (data != null) {
          prefetch(data);
        }
      } catch (InterruptedException e) {
        return;
      } catch (Exception e) {
        LOG.warn("prefetch of version {} stopped, its keys are read by block: {}",
            data.version, e.toString());
      } finally {
        PENDING.decrementAndGet();
      }
    }
  }

  private static void prefetch(StateData data) throws Exception {
    long started = System.nanoTime();
    long read = 0;
    while (!data.retired()) {
      LazyBase base = data.remote;
      if (base == null) {
        return;
      }
      long before = base.reads.fetched.get();
      boolean whole = data.mergeNext();
      long got = base.reads.fetched.get() - before;
      if (got > 0) {
        MERGED.incrementAndGet();
      }
      if (whole) {
        return;
      }
      read += got;
      // at most `rate` bytes a second: wait until the bytes read so far are due
      long due = started + (long) (read * 1e9 / rate);
      long wait = due - System.nanoTime();
      if (wait > 0) {
        TimeUnit.NANOSECONDS.sleep(wait);
      }
    }
  }
}
