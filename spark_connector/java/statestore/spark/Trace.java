package statestore.spark;

import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;

/** Timing traces for profiling, on stderr when {@code -Dstatestore.trace=true}. */
final class Trace {
  private Trace() {}

  static final boolean ON = Boolean.getBoolean("statestore.trace");
  private static final ThreadMXBean THREADS = ManagementFactory.getThreadMXBean();

  /** This thread's CPU time in ns (0 when tracing is off). */
  static long cpu() {
    return ON ? THREADS.getCurrentThreadCpuTime() : 0;
  }

  static void log(String format, Object... args) {
    if (ON) {
      System.err.println("[statestore-trace " + Thread.currentThread().getName() + "] "
          + String.format(format, args));
    }
  }
}
