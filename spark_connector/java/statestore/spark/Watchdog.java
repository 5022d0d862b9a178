package statestore.spark;

import java.io.IOException;
import java.io.InputStream;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

/**
 * Bounds a response body read: java.net.http's request timeout stops at the headers, so a
 * member that stalls mid-body would block its reader for ever. A guarded stream records
 * when it last delivered bytes; one daemon thread checks every guard four times a second
 * and closes the body of any guard past its deadline or silent for longer than its stall
 * limit, which ends the blocked read. {@link Guard#check} then turns that end into an
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

  static {
    TIMER.scheduleWithFixedDelay(Watchdog::sweep, 250, 250, TimeUnit.MILLISECONDS);
  }

  private static void sweep() {
    long now = System.nanoTime();
    for (Guard g : GUARDS) {
      String why = null;
      if (now - g.deadline >= 0) {
        why = "the restore deadline passed";
      } else if (now - g.lastProgress > g.stallNanos) {
        why = "no byte for " + g.stallNanos / 1_000_000L + " ms";
      }
      if (why != null) {
        g.trip(why);
      }
    }
  }

  /** Guard {@code body}: cut it at {@code deadline} (System.nanoTime) or after a stall. */
  static Guard watch(InputStream body, long deadline, long stallMs) {
    return watch(body, body::close, deadline, stallMs);
  }

  /**
   * Guard {@code body} as above, ending a cut read with {@code cut} (for a pooled
   * connection: abort the exchange, where closing its body would read the rest first).
   */
  static Guard watch(InputStream body, Cut cut, long deadline, long stallMs) {
    Guard g = new Guard(body, cut, deadline, stallMs * 1_000_000L);
    GUARDS.add(g);
    return g;
  }

  /** How a guard ends a read it cuts. */
  interface Cut {
    void run() throws IOException;
  }

  /** One guarded body; close it to stop watching. */
  static final class Guard implements AutoCloseable {
    private final InputStream body;
    private final Cut cut;
    private final long deadline;
    private final long stallNanos;
    private volatile long lastProgress = System.nanoTime();
    private volatile String tripped;

    private Guard(InputStream body, Cut cut, long deadline, long stallNanos) {
      this.body = body;
      this.cut = cut;
      this.deadline = deadline;
      this.stallNanos = stallNanos;
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

    /** Throw if the watchdog cut the body. */
    void check() throws IOException {
      String why = tripped;
      if (why != null) {
        throw new IOException("restore body cut: " + why);
      }
    }

    /** The body, recording progress on every read. */
    InputStream stream() {
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
