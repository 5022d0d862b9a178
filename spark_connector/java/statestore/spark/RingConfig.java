package statestore.spark;

import java.util.ArrayList;
import java.util.List;
import java.util.Locale;

import org.apache.hadoop.conf.Configuration;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.apache.spark.sql.execution.streaming.state.StateStoreConf;

/**
 * The provider's options. Each is read, first found wins, from the session's Hadoop
 * configuration (which carries every SQL conf, so {@code spark.conf.set} works), the
 * executor's SparkConf ({@code --conf} of spark-submit), then the state store conf as
 * {@code spark.sql.streaming.stateStore.ring.<name>}.
 */
final class RingConfig {
  static final String PREFIX = "spark.statestore.";
  /** The ring's recovery plans (statestore/core/plan.py). */
  static final List<String> PLANS = List.of("star", "line", "tree", "auto");

  final List<String> seeds;
  final String restorePlan;
  final int snapshotInterval;
  final long connectTimeoutMs;
  final long requestTimeoutMs;
  final int maxAttempts;
  final long retryBudgetMs;
  final long readTimeoutMs;
  final long restoreTimeoutMs;
  final long maxCommitBytes;
  /** {@code direct} (the JVM writes and reads chunks, {@link RingDirect}) or {@code coordinator}. */
  final boolean direct;
  /** The token and TLS of every request ({@code token}, {@code tokenFile}, {@code tlsCa}). */
  final RingAccess access;
  /** The executor's heap cache of state ({@link StateBudget}); the rest spills to disk. */
  long cacheBytes = StateBudget.defaultLimit();
  /** Load a version's base lazily, key by key ({@link LazyBase}): {@code lazyRestore}. */
  boolean lazyRestore;
  /**
   * Hand a batch's keys to a lazily loaded version before its restore reads them one by one
   * ({@code ReadAheadExec}): {@code readAhead}, on by default.
   */
  boolean readAhead = true;
  /**
   * The fewest keys a read-ahead asks of one chunk in a lookup; fewer are read block by
   * block ({@link LazyBase#LOOKUP_MIN_KEYS}): {@code readAheadMinKeys}.
   */
  int readAheadMinKeys = LazyBase.LOOKUP_MIN_KEYS;
  /** Bytes a second the JVM reads to make lazy versions whole ({@link Prefetcher}; 0: off). */
  long prefetchBytesPerSec = DEFAULT_PREFETCH;
  static final long DEFAULT_PREFETCH = 32L << 20;

  private RingConfig(
      List<String> seeds,
      String restorePlan,
      int snapshotInterval,
      long connectTimeoutMs,
      long requestTimeoutMs,
      int maxAttempts,
      long retryBudgetMs,
      long readTimeoutMs,
      long restoreTimeoutMs,
      long maxCommitBytes,
      boolean direct,
      RingAccess access) {
    this.seeds = seeds;
    this.restorePlan = restorePlan;
    this.snapshotInterval = snapshotInterval;
    this.connectTimeoutMs = connectTimeoutMs;
    this.requestTimeoutMs = requestTimeoutMs;
    this.maxAttempts = maxAttempts;
    this.retryBudgetMs = retryBudgetMs;
    this.readTimeoutMs = readTimeoutMs;
    this.restoreTimeoutMs = restoreTimeoutMs;
    this.maxCommitBytes = maxCommitBytes;
    this.direct = direct;
    this.access = access;
  }

  /**
   * Whether a direct-path restore goes through the nodes' relay: a {@code line} or
   * {@code tree} plan (folded by the hops, streamed to the JVM as framed rows by one node).
   * {@code star} and {@code auto} are read by the JVM from the chunks' holders.
   */
  boolean relayed() {
    return restorePlan.equals("line") || restorePlan.equals("tree");
  }

  static RingConfig from(Configuration hadoopConf, StateStoreConf storeConf) {
    String seedText = get(hadoopConf, storeConf, "seeds", "");
    List<String> seeds = new ArrayList<>();
    for (String part : seedText.split(",")) {
      String s = part.trim();
      if (s.isEmpty()) {
        continue;
      }
      int colon = s.lastIndexOf(':');
      if (colon <= 0 || colon == s.length() - 1 || !s.substring(colon + 1).matches("[0-9]{1,5}")) {
        throw new IllegalArgumentException(
            "RingStateStoreProvider: seed '" + s + "' in " + PREFIX + "seeds is not HOST:PORT, "
                + "e.g. 127.0.0.1:7400");
      }
      seeds.add(s);
    }
    if (seeds.isEmpty()) {
      throw new IllegalArgumentException(
          "RingStateStoreProvider: no ring seeds: set " + PREFIX + "seeds to HOST:PORT[,HOST:PORT...]"
              + " (spark_connector.configure(builder, seeds=[...]) does it for you)");
    }
    String plan = get(hadoopConf, storeConf, "restorePlan", "auto").toLowerCase(Locale.ROOT);
    if (!PLANS.contains(plan)) {
      throw new IllegalArgumentException("RingStateStoreProvider: " + PREFIX + "restorePlan '"
          + plan + "' is not a plan name: star, line, tree or auto");
    }
    String path = get(hadoopConf, storeConf, "dataPath", "direct").trim().toLowerCase(Locale.ROOT);
    if (!path.equals("direct") && !path.equals("coordinator")) {
      throw new IllegalArgumentException(
          "RingStateStoreProvider: " + PREFIX + "dataPath '" + path + "' is not direct or coordinator");
    }
    RingConfig out = new RingConfig(
        List.copyOf(seeds),
        plan,
        (int) number(hadoopConf, storeConf, "snapshotInterval", 0, 0, 1_000_000),
        number(hadoopConf, storeConf, "connectTimeoutMs", 5_000, 1, 3_600_000),
        number(hadoopConf, storeConf, "requestTimeoutMs", 60_000, 1, 24 * 3_600_000L),
        (int) number(hadoopConf, storeConf, "maxAttempts", 50, 1, 10_000),
        number(hadoopConf, storeConf, "retryBudgetMs", 60_000, 0, 24 * 3_600_000L),
        number(hadoopConf, storeConf, "readTimeoutMs", 30_000, 1, 24 * 3_600_000L),
        number(hadoopConf, storeConf, "restoreTimeoutMs", 300_000, 1, 24 * 3_600_000L),
        number(hadoopConf, storeConf, "maxCommitBytes", 64L << 20, 1L << 10, 1L << 30),
        path.equals("direct"),
        RingAccess.of(
            get(hadoopConf, storeConf, "token", ""),
            get(hadoopConf, storeConf, "tokenFile", ""),
            get(hadoopConf, storeConf, "tlsCa", "")));
    out.cacheBytes = number(hadoopConf, storeConf, "cacheBytes", StateBudget.defaultLimit(), 0,
        Long.MAX_VALUE);
    // off by default: measured slower than a whole restore (docs/spark.md, "Lazy restore")
    String lazy = get(hadoopConf, storeConf, "lazyRestore", "false").trim().toLowerCase(Locale.ROOT);
    if (!lazy.equals("true") && !lazy.equals("false")) {
      throw new IllegalArgumentException(
          "RingStateStoreProvider: " + PREFIX + "lazyRestore '" + lazy + "' is not true or false");
    }
    out.lazyRestore = lazy.equals("true");
    String ahead = get(hadoopConf, storeConf, "readAhead", "true").trim().toLowerCase(Locale.ROOT);
    if (!ahead.equals("true") && !ahead.equals("false")) {
      throw new IllegalArgumentException(
          "RingStateStoreProvider: " + PREFIX + "readAhead '" + ahead + "' is not true or false");
    }
    out.readAhead = ahead.equals("true");
    out.readAheadMinKeys = (int) number(hadoopConf, storeConf, "readAheadMinKeys",
        LazyBase.LOOKUP_MIN_KEYS, 1, 1_000_000);
    out.prefetchBytesPerSec = number(hadoopConf, storeConf, "prefetchBytesPerSec",
        DEFAULT_PREFETCH, 0, Long.MAX_VALUE);
    return out;
  }

  private static long number(
      Configuration hadoopConf, StateStoreConf storeConf, String name, long dflt, long lo, long hi) {
    String text = get(hadoopConf, storeConf, name, Long.toString(dflt)).trim();
    long value;
    try {
      value = Long.parseLong(text);
    } catch (NumberFormatException e) {
      throw new IllegalArgumentException(
          "RingStateStoreProvider: " + PREFIX + name + " '" + text + "' is not an integer");
    }
    if (value < lo || value > hi) {
      throw new IllegalArgumentException(
          "RingStateStoreProvider: " + PREFIX + name + " " + value + " is out of range "
              + lo + ".." + hi);
    }
    return value;
  }

  private static String get(
      Configuration hadoopConf, StateStoreConf storeConf, String name, String dflt) {
    String key = PREFIX + name;
    if (hadoopConf != null) {
      String v = hadoopConf.get(key);
      if (v != null) {
        return v;
      }
    }
    SparkEnv env = SparkEnv.get();
    if (env != null) {
      SparkConf conf = env.conf();
      if (conf.contains(key)) {
        return conf.get(key);
      }
    }
    if (storeConf != null) {
      scala.Option<String> v = storeConf.sqlConfs().get("spark.sql.streaming.stateStore.ring." + name);
      if (v.isDefined()) {
        return v.get();
      }
    }
    return dflt;
  }
}
