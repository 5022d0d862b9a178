package statestore.spark;

import java.io.IOException;
import java.io.InputStream;
import java.io.InterruptedIOException;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

/**
 * Bounds a response read: java.net.http's request timeout stops at the headers, so a member
 * that stalls mid-body would block its reader for ever; a pooled exchange
 * ({@link PooledGets}) has only per-read socket timeouts, which a member sending a byte now
 * and then never trips, and a read that Spark's task interrupt does not end. A guard records
 * when its stream last delivered bytes; one daemon thread checks every guard four times a
 * second and cuts any guard past its deadline, silent for longer than its stall limit, or
 * (when it watches a thread) whose thread was interrupted: it closes the body, or aborts the
 * exchange, which ends the blocked read. {@link Guard#check} then turns that end into an
 * {@link IOException} naming the cause (a closed body may look like a clean end of stream).
 */
final class Watchdog {
  private Watchdog() {}

  private static final Set<Guard> GUARDS = ConcurrentHashMap.newKeySet();
  private static final ScheduledExecutorService TIMER =
      Executors.newSingleThreadScheduledExecutor(r -> {
        Thread t = new Thread(r, "statestore-restore-watchdog");
        t.setDaemon(true);
        return t;
      });

  /** The reason a guard gives when its thread was interrupted. */
  static final String INTERRUPTED = "the task was interrupted";

  static {
    TIMER.scheduleWithFixedDelay(Watchdog::sweep, 250, 250, TimeUnit.MILLISECONDS);
  }

  private static void sweep() {
    long now = System.nanoTime();
    for (Guard g : GUARDS) {
      Rules r = g.rules; // read once: a phase switch is one write
      String why = null;
      if (g.thread != null && g.thread.isInterrupted()) {
        why = INTERRUPTED;
      } else if (now - r.deadline >= 0) {
        why = r.late;
      } else if (now - Math.max(g.lastProgress, r.start) > r.stallNanos) {
        why = "no byte for " + r.stallNanos / 1_000_000L + " ms";
      }
      if (why != null) {
        g.trip(why);
      }
    }
  }

  /**
   * One phase of a guarded read: cut at {@code deadline} (System.nanoTime; {@code late} says
   * why) or after {@code stallNanos} without a byte, counted from {@code start} at the
   * earliest. Immutable: the sweep never pairs one phase's limit with another's progress.
   */
  private record Rules(long deadline, String late, long stallNanos, long start) {}

  private static final String DEADLINE = "the restore deadline passed";

  /** Guard {@code body}: cut it at {@code deadline} (System.nanoTime) or after a stall. */
  static Guard watch(InputStream body, long deadline, long stallMs) {
    Guard g = new Guard(body::close, null,
        new Rules(deadline, DEADLINE, stallMs * 1_000_000L, System.nanoTime()));
    GUARDS.add(g);
    return g;
  }

  /**
   * Guard a whole exchange of the calling thread, from before its request is sent: end it
   * with {@code cut} (abort the exchange) at {@code deadline} (System.nanoTime), after
   * {@code stallMs} without progress (the first phase: the wait for the answer's headers),
   * or when the thread is interrupted; {@code late} says why a cut at the deadline was.
   * {@link Guard#phase} sets the rules of the body.
   */
  static Guard watchExchange(Cut cut, long deadline, String late, long stallMs) {
    Guard g = new Guard(cut, Thread.currentThread(),
        new Rules(deadline, late, stallMs * 1_000_000L, System.nanoTime()));
    GUARDS.add(g);
    return g;
  }

  /** How a guard ends a read it cuts. */
  interface Cut {
    void run() throws IOException;
  }

  /** One guarded read; close it to stop watching. */
  static final class Guard implements AutoCloseable {
    private final Cut cut;
    private final Thread thread;
    private volatile Rules rules;
    private volatile long lastProgress = System.nanoTime();
    private volatile String tripped;

    private Guard(Cut cut, Thread thread, Rules rules) {
      this.cut = cut;
      this.thread = thread;
      this.rules = rules;
    }

    private void trip(String why) {
      tripped = why;
      GUARDS.remove(this);
      try {
        cut.run();
      } catch (IOException | RuntimeException e) {
        // the reader sees the stream end either way
      }
    }

    /**
     * From now on: cut at {@code deadline} (the restore's), or after {@code stallMs} without a
     * byte from now on.
     */
    void phase(long deadline, long stallMs) {
      this.rules = new Rules(deadline, DEADLINE, stallMs * 1_000_000L, System.nanoTime());
    }

    /** Why the watchdog cut the read, or null. */
    String reason() {
      return tripped;
    }

    /**
     * Throw if the watchdog cut the read: an InterruptedIOException when it was for the
     * thread's interrupt, else an IOException naming the cause.
     */
    void check() throws IOException {
      String why = tripped;
      if (INTERRUPTED.equals(why)) {
        throw new InterruptedIOException("the read was cut: " + why);
      }
      if (why != null) {
        throw new IOException("restore body cut: " + why);
      }
    }

    /** {@code body}, recording progress on every read. */
    InputStream stream(InputStream body) {
      return new InputStream() {
        @Override
        public int read() throws IOException {
          int b = body.read();
          lastProgress = System.nanoTime();
          return b;
        }

        @Override
        public int read(byte[] buf, int off, int len) throws IOException {
          int n = body.read(buf, off, len);
          lastProgress = System.nanoTime();
          return n;
        }
      };
    }

    @Override
    public void close() {
      GUARDS.remove(this);
    }
  }
}
