package statestore.spark;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import org.apache.hadoop.conf.Configuration;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.KeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.NoPrefixKeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.PrefixKeyScanStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.ReadStateStore;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreConf;
import org.apache.spark.sql.execution.streaming.state.StateStoreId;
import org.apache.spark.sql.execution.streaming.state.StateStoreIterator;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

import scala.Option;

/**
 * Drives RingStateStoreProvider outside Spark's scheduler against real ring nodes, for the
 * scenarios a local-mode query cannot stage (two attempts of one partition in one JVM, two
 * executors, loadEmpty, a very large delta). Usage:
 * {@code ProviderHarness SCENARIO CHECKPOINT_ROOT [key=value ...]}; the keys are the
 * provider's confs without the {@code spark.statestore.} prefix plus scenario arguments.
 * Prints one JSON object of observations; the pytest side asserts on them.
 */
public final class ProviderHarness {
  static final StructType KEY = new StructType().add("k", DataTypes.IntegerType);
  static final StructType VALUE =
      new StructType().add("v", DataTypes.LongType).add("pad", DataTypes.StringType);
  static final UnsafeProjection KEY_PROJ = UnsafeProjection.create(KEY);
  static final UnsafeProjection VALUE_PROJ = UnsafeProjection.create(VALUE);

  private final String root;
  private final Map<String, String> args;
  private final Map<String, Object> out = new LinkedHashMap<>();

  private ProviderHarness(String root, Map<String, String> args) {
    this.root = root;
    this.args = args;
  }

  static UnsafeRow key(int k) {
    return KEY_PROJ.apply(new GenericInternalRow(new Object[] {k})).copy();
  }

  static UnsafeRow value(long v, int padBytes) {
    String pad = "x".repeat(padBytes);
    return VALUE_PROJ.apply(new GenericInternalRow(new Object[] {v, UTF8String.fromString(pad)}))
        .copy();
  }

  static Long valueOf(UnsafeRow row) {
    return row == null ? null : row.getLong(0);
  }

  /** What {@code store} answers for each of {@code keys} ({@link #valueOf}). */
  static List<Object> values(StateStore store, List<UnsafeRow> keys) {
    List<Object> out = new ArrayList<>(keys.size());
    for (UnsafeRow k : keys) {
      out.add(valueOf(store.get(k, null)));
    }
    return out;
  }

  RingStateStoreProvider provider() {
    return provider(KEY, VALUE);
  }

  RingStateStoreProvider provider(StructType keySchema, StructType valueSchema) {
    return provider(keySchema, valueSchema, new NoPrefixKeyStateEncoderSpec(keySchema));
  }

  RingStateStoreProvider provider(
      StructType keySchema, StructType valueSchema, KeyStateEncoderSpec encoder) {
    Configuration conf = new Configuration(false);
    for (Map.Entry<String, String> e : args.entrySet()) {
      conf.set(RingConfig.PREFIX + e.getKey(), e.getValue());
    }
    SQLConf sql = new SQLConf();
    sql.setConfString("spark.sql.streaming.stateStore.commitValidation.enabled", "false");
    for (Map.Entry<String, String> e : args.entrySet()) {
      if (e.getKey().startsWith("spark.sql.")) {
        sql.setConfString(e.getKey(), e.getValue());
      }
    }
    StateStoreConf storeConf =
        new StateStoreConf(sql, scala.collection.immutable.Map$.MODULE$.empty());
    RingStateStoreProvider p = new RingStateStoreProvider();
    p.init(new StateStoreId(root, 0, 0, "default"), keySchema, valueSchema,
        encoder, false, storeConf, conf, false, Option.empty());
    return p;
  }

  static WriteStore write(RingStateStoreProvider p, long version, boolean loadEmpty) {
    return (WriteStore) p.getStore(version, Option.empty(), false, loadEmpty);
  }

  static String attempt(Runnable r) {
    try {
      r.run();
      return "ok";
    } catch (RuntimeException e) {
      return String.valueOf(e.getMessage());
    }
  }

  /** Two attempts of one partition and a read store, in one JVM. */
  void isolation() {
    RingStateStoreProvider p = provider();
    StateStore w = write(p, 0, false);
    w.put(key(1), value(1, 4), null);
    w.commit();
    ReadStateStore r = p.getReadStore(1, Option.empty());
    WriteStore a = write(p, 1, false);
    WriteStore b = write(p, 1, false);
    a.put(key(1), value(100, 4), null);
    a.put(key(2), value(5, 4), null);
    out.put("read_sees_a", valueOf(r.get(key(1), null)));
    out.put("b_sees_a", valueOf(b.get(key(1), null)));
    out.put("b_sees_a_new_key", b.get(key(2), null) != null);
    out.put("epoch_a", a.epoch);
    out.put("epoch_b", b.epoch);
    b.put(key(1), value(2, 4), null);
    out.put("b_commit", attempt(b::commit));
    out.put("read_after_b_commit", valueOf(r.get(key(1), null)));
    out.put("a_sees_own", valueOf(a.get(key(1), null)));
    out.put("a_commit", attempt(a::commit));
    r.release();
    WriteStore next = write(p, 2, false);
    out.put("next_v2", valueOf(next.get(key(1), null)));
    out.put("next_v2_key2", valueOf(next.get(key(2), null)));
    next.abort();
    WriteStore fresh = write(provider(), 2, false);
    out.put("ring_v2", valueOf(fresh.get(key(1), null)));
    out.put("ring_v2_key2", valueOf(fresh.get(key(2), null)));
    fresh.abort();
  }

  /** memoryUsedBytes of a committed version: each row's key and value bytes and its cost. */
  void memory() {
    StateStore w = write(provider(), 0, false);
    long raw = 0;
    for (int i = 0; i < 100; i++) {
      UnsafeRow k = key(i);
      UnsafeRow v = value(i, 200);
      raw += k.getSizeInBytes() + v.getSizeInBytes();
      w.put(k, v, null);
    }
    w.commit();
    out.put("raw", raw);
    out.put("memory", w.metrics().memoryUsedBytes());
  }

  /** A version re-committed by another executor: the cache must not be trusted. */
  void cache() {
    RingStateStoreProvider p1 = provider();
    StateStore w = write(p1, 0, false);
    w.put(key(1), value(1, 4), null);
    w.commit();
    w = write(p1, 1, false);
    w.put(key(1), value(2, 4), null);
    w.commit();
    RingStateStoreProvider p2 = provider();
    w = write(p2, 1, false);
    w.put(key(1), value(50, 4), null);
    out.put("p2_commit", attempt(w::commit));
    WriteStore again = write(p1, 2, false);
    out.put("p1_v2", valueOf(again.get(key(1), null)));
    out.put("p1_hit", again.metrics().customMetrics().get(RingMetrics.CACHE_HITS).get());
    again.abort();
  }

  /**
   * Lineage: each commit names the epoch of the version it was loaded from (cached after a
   * commit, or restored by another provider), none when loaded empty.
   */
  void lineage() {
    RingStateStoreProvider p1 = provider();
    List<Object> epochs = new ArrayList<>();
    for (int v = 0; v < 2; v++) { // v1 from empty, v2 from p1's cached v1
      WriteStore w = write(p1, v, false);
      w.put(key(v), value(v, 4), null);
      w.commit();
      epochs.add(w.epoch);
    }
    RingStateStoreProvider p2 = provider(); // another executor: v2 restored from the ring
    WriteStore w = write(p2, 2, false);
    w.put(key(2), value(2, 4), null);
    w.commit();
    epochs.add(w.epoch);
    w = write(p2, 3, true); // loadEmpty: v4 builds on nothing of the ring's v3
    w.put(key(3), value(3, 4), null);
    w.commit();
    epochs.add(w.epoch);
    out.put("store", p1.storePath());
    out.put("epochs", epochs);
  }

  /** loadEmpty: nothing of the old version, and it stays gone after a restore. */
  void empty() {
    RingStateStoreProvider p = provider();
    StateStore w = write(p, 0, false);
    w.put(key(1), value(1, 4), null);
    w.commit();
    w = write(p, 1, false); // cached version 1
    w.abort();
    w = write(p, 1, true);
    out.put("empty_sees_old", valueOf(w.get(key(1), null)));
    out.put("empty_rows", countRows(w));
    w.put(key(2), value(2, 4), null);
    w.commit();
    WriteStore c = write(p, 2, false);
    out.put("cached_v2_old", valueOf(c.get(key(1), null)));
    out.put("cached_v2_new", valueOf(c.get(key(2), null)));
    c.abort();
    WriteStore r = write(provider(), 2, false);
    out.put("ring_v2_old", valueOf(r.get(key(1), null)));
    out.put("ring_v2_new", valueOf(r.get(key(2), null)));
    r.abort();
  }

  /** A query whose state was written before store names carried the query id. */
  void legacy() throws java.io.IOException {
    RingStateStoreProvider old = provider(); // no <checkpoint>/metadata yet: the path alone
    for (int v = 0; v < 2; v++) {
      StateStore w = write(old, v, false);
      w.put(key(v + 1), value(v + 1, 4), null);
      w.commit();
    }
    java.nio.file.Path metadata = java.nio.file.Paths.get(root).getParent().resolve("metadata");
    java.nio.file.Files.writeString(metadata, "{\"id\":\"0d5c7bc4-5a4e-4c55-9f5e-3f0f2a8b7c11\"}");
    RingStateStoreProvider upgraded = provider();
    out.put("renamed", !upgraded.storePath().equals(old.storePath()));
    WriteStore w = write(upgraded, 2, false);
    out.put("upgraded_rows", countRows(w));
    w.put(key(3), value(3, 4), null);
    out.put("upgraded_commit", attempt(w::commit));
    out.put("upgraded_snapshot", w.metrics().customMetrics().get(RingMetrics.SNAPSHOTS).get());
    WriteStore r = write(provider(), 3, false);
    out.put("ring_v3_rows", countRows(r));
    r.abort();
  }

  /**
   * Rows written under one schema, restored by a provider whose operator has another (three
   * long key columns: an int key row is too short for it).
   */
  void schema() {
    RingStateStoreProvider p = provider();
    StateStore w = write(p, 0, false);
    for (int i = 0; i < 10; i++) {
      w.put(key(i), value(i, 4), null);
    }
    out.put("commit", attempt(w::commit));
    StructType other = new StructType().add("a", DataTypes.LongType).add("b", DataTypes.LongType)
        .add("c", DataTypes.LongType);
    try {
      WriteStore r = write(provider(other, VALUE), 1, false);
      out.put("restored_rows", countRows(r));
      r.abort();
    } catch (RuntimeException e) {
      out.put("restore_error", String.valueOf(e.getMessage()));
      Throwable c = e;
      while (c.getCause() != null) {
        c = c.getCause();
      }
      out.put("cause", c.getClass().getSimpleName());
    }
  }

  static long countRows(StateStore s) {
    long n = 0;
    scala.collection.Iterator<UnsafeRowPair> it = s.iterator(null);
    while (it.hasNext()) {
      it.next();
      n++;
    }
    return n;
  }

  /** Commit {@code versions} versions of {@code rows} fresh rows each, then restore. */
  void bulk() {
    int rows = Integer.parseInt(args.getOrDefault("rows", "1000"));
    int pad = Integer.parseInt(args.getOrDefault("pad", "16"));
    int versions = Integer.parseInt(args.getOrDefault("versions", "1"));
    RingStateStoreProvider p = provider();
    List<Object> commits = new ArrayList<>();
    long dirsBefore = shardDirsLeft();
    long started = System.nanoTime();
    for (int v = 0; v < versions; v++) {
      WriteStore w = write(p, v, false);
      for (int i = 0; i < rows; i++) {
        w.put(key(v * rows + i), value(v * rows + i, pad), null);
      }
      if (v > 0) {
        w.remove(key(0), null);
      }
      String result = attempt(w::commit);
      commits.add(result.equals("ok") ? "ok" : result);
      out.put("shards", w.shardsCommitted);
      if (!result.equals("ok")) {
        break;
      }
    }
    out.put("commits", commits);
    out.put("commit_ms", (System.nanoTime() - started) / 1_000_000);
    out.put("shard_dirs_left", shardDirsLeft() - dirsBefore);
    restore((long) versions);
  }

  /** Directories {@link ShardFiles} made in this JVM and left (each commit deletes its own). */
  static long shardDirsLeft() {
    try {
      java.nio.file.Path parent = SpillStore.newDir("statestore-shards").getParent();
      String mine = ProcessHandle.current().pid() + "-";
      try (var dirs = java.nio.file.Files.list(parent)) {
        return dirs.filter(d -> d.getFileName().toString().startsWith(mine)).count();
      }
    } catch (java.io.IOException e) {
      throw new java.io.UncheckedIOException(e);
    }
  }

  /**
   * A write store's rows (its version under its overlay) against a model, on keys whose bytes
   * sort one way signed and another unsigned (any int, negative ones too): with {@code
   * cacheBytes=0} the version and the overlay are both in spill stores and merge in key
   * order ({@link WriteStore#sortedMerge}); then the version committed (a snapshot with {@code
   * snapshotInterval=2}) and restored in a fresh provider.
   */
  void merged() {
    RingStateStoreProvider p = provider();
    java.util.Random rnd = new java.util.Random(7);
    int[] keys = new int[2000];
    for (int i = 0; i < keys.length; i++) {
      keys[i] = rnd.nextInt();
    }
    Map<Integer, Long> model = new java.util.HashMap<>();
    WriteStore w = write(p, 0, false);
    for (int i = 0; i < 1000; i++) {
      w.put(key(keys[i]), value(i, 8), null);
      model.put(keys[i], (long) i);
    }
    w.commit();
    java.util.Set<Integer> first = new java.util.HashSet<>(model.keySet());
    java.util.Set<Integer> touched = new java.util.HashSet<>();
    WriteStore u = write(p, 1, false);
    for (int i = 0; i < 2000; i++) {
      int k = keys[rnd.nextInt(keys.length)];
      touched.add(k);
      if (rnd.nextInt(4) == 0) {
        u.remove(key(k), null);
        model.remove(k);
      } else {
        u.put(key(k), value(10_000 + i, 8), null);
        model.put(k, 10_000L + i);
      }
    }
    out.put("spilled", u.data.spilled() && u.overlay.spilled());
    out.put("merged_equal", model.equals(rows(u)));
    // the spilled overlay's own counts, kept as rows went in without being read back
    // (StateData.putOver): a row per key touched, a tombstone for one the version held
    long keyCost = key(0).getSizeInBytes() + StateBudget.ROW_COST;
    long rows = 0;
    long bytes = 0;
    for (int k : touched) {
      if (model.containsKey(k) || first.contains(k)) {
        rows++;
        bytes += keyCost + (model.containsKey(k) ? value(0, 8).getSizeInBytes() : 0);
      }
    }
    out.put("overlay_rows", u.overlay.size());
    out.put("overlay_rows_expected", rows);
    out.put("overlay_bytes", u.overlay.spillBytes());
    out.put("overlay_bytes_expected", bytes);
    // an iterator stopped early and closed (as Spark closes one) closes the spill stores'
    try (StateStoreIterator<UnsafeRowPair> some = u.iterator(null)) {
      for (int i = 0; i < 3 && some.hasNext(); i++) {
        some.next();
      }
      out.put("iterators_while_reading", u.data.openIterators() + u.overlay.openIterators());
    }
    out.put("iterators_after_close", u.data.openIterators() + u.overlay.openIterators());
    StateStoreIterator<UnsafeRowPair> left = u.iterator(null); // stopped early, never closed
    left.next();
    out.put("iterators_left_open", u.data.openIterators() + u.overlay.openIterators());
    u.commit();
    out.put("iterators_after_commit", u.data.openIterators());
    committedAgainst(p, 2, model);
  }

  /**
   * Version {@code version} as {@code p} kept it, its count and bytes as its stores counted
   * them (no read-back): keys_after, bytes_after against keys_expected, bytes_expected (rows
   * of values of 8 padding bytes); then restored in a fresh provider against the model
   * (restored_equal).
   */
  void committedAgainst(RingStateStoreProvider p, long version, Map<Integer, Long> model) {
    WriteStore next = write(p, version, false); // the version the provider kept: no restore
    out.put("keys_after", next.data.size());
    out.put("keys_expected", model.size());
    long row = key(0).getSizeInBytes() + value(0, 8).getSizeInBytes() + StateBudget.ROW_COST;
    out.put("bytes_after", next.data.spillBytes());
    out.put("bytes_expected", model.size() * row);
    next.abort();
    WriteStore r = write(provider(), version, false);
    out.put("restored_equal", model.equals(rows(r)));
    r.abort();
  }

  /**
   * The point reads a batch makes of the spill stores, the version and the overlay both
   * spilled ({@code cacheBytes=0}), each with a filter of its keys: each key read, then put
   * a key later (as an operator's get then put): a key the version holds is read from it
   * once (the put recalls the read's answer), a new key not at all (reads); every key read
   * before any is put, as a streaming aggregation does, all new (reads_hashed); a remove of
   * a key the version answered (reads_remove); the rows (rows_equal) against a model; a key
   * the version answered before a batch removed it, put again in the next batch, counts as
   * new (the answer of the version before is not recalled for the next one, the same
   * instance committed in place); then 20,000 keys more, past the version filter's first
   * stage: every key read back one by one (gets_equal), keys never put (reads_absent), the
   * counts the store kept (keys_after, bytes_after), and a restore.
   */
  void spillReads() {
    RingStateStoreProvider p = provider();
    Map<Integer, Long> model = new java.util.HashMap<>();
    WriteStore w = write(p, 0, false);
    for (int k = 0; k < 1000; k++) {
      w.put(key(k), value(k, 8), null);
      model.put(k, (long) k);
    }
    w.commit();
    ReadStateStore r = p.getReadStore(1, Option.empty());
    WriteStore u = write(p, 1, false);
    out.put("spilled", u.data.spilled());
    long before = SpillStore.READS.sum();
    for (int i = 0; i <= 1000; i++) { // keys 500..1499: half the version's, half new
      if (i < 1000) {
        r.get(key(500 + i), null);
      }
      if (i > 0) {
        int k = 500 + i - 1;
        u.put(key(k), value(10_000 + k, 8), null);
        model.put(k, 10_000L + k);
      }
    }
    out.put("reads", SpillStore.READS.sum() - before);
    out.put("overlay_spilled", u.overlay.spilled());
    // every key of a batch read before any is put (a streaming aggregation: its restore's
    // rows are all taken before its save): the put reads the version again, the overlay
    // still not (1500..1599)
    before = SpillStore.READS.sum();
    for (int k = 1500; k < 1600; k++) {
      r.get(key(k), null);
    }
    for (int k = 1500; k < 1600; k++) {
      u.put(key(k), value(k, 8), null);
      model.put(k, (long) k);
    }
    out.put("reads_hashed", SpillStore.READS.sum() - before);
    before = SpillStore.READS.sum();
    r.get(key(0), null); // the version answers key 0; the batch then removes it
    u.remove(key(0), null);
    model.remove(0);
    out.put("reads_remove", SpillStore.READS.sum() - before);
    r.abort();
    u.commit();
    WriteStore again = write(p, 2, false);
    out.put("same_instance", again.data == u.data);
    again.put(key(0), value(7, 8), null); // new in version 3
    model.put(0, 7L);
    out.put("rows_equal", model.equals(rows(again)));
    again.commit();
    // 20,000 new keys into the spilled version (its filter's first stage is sized for 4,096
    // at least: it grows by stages), then every key asked for one by one: a key the filter
    // lost would read as absent
    WriteStore grow = write(p, 3, false);
    for (int k = 2000; k < 22_000; k++) {
      grow.put(key(k), value(k, 8), null);
      model.put(k, (long) k);
    }
    grow.commit();
    WriteStore check = write(p, 4, false);
    out.put("grown_spilled", check.data.spilled());
    boolean gets = true;
    for (Map.Entry<Integer, Long> e : model.entrySet()) {
      UnsafeRow v = check.get(key(e.getKey()), null);
      gets &= v != null && v.getLong(0) == e.getValue();
    }
    before = SpillStore.READS.sum();
    for (int k = 22_000; k < 32_000; k++) { // never put: the filter answers most
      gets &= check.get(key(k), null) == null;
    }
    out.put("reads_absent", SpillStore.READS.sum() - before);
    out.put("gets_equal", gets);
    check.abort();
    committedAgainst(p, 4, model);
    p.close();
  }

  /**
   * A spilled version's filter of its keys stays bounded ({@code cacheBytes=0}): batches that
   * put the same keys again leave its bytes as they were (same_bytes_before, _after); batches
   * whose keys come and go (each removes the last batch's 5,000 keys and puts 5,000 new ones)
   * make it build itself again from the store (refilters) at a size for the keys held
   * (churn_bytes); every key held reads back and every key removed reads absent
   * (gets_equal), against a model, and a restore matches it.
   */
  void filterBounds() {
    RingStateStoreProvider p = provider();
    Map<Integer, Long> model = new java.util.HashMap<>();
    long v = 0;
    for (int round = 0; round < 4; round++) { // the same 5,000 keys, four times
      WriteStore w = write(p, v, false);
      for (int k = 0; k < 5000; k++) {
        w.put(key(k), value(round * 10_000L + k, 8), null);
        model.put(k, round * 10_000L + k);
      }
      w.commit();
      v++;
      if (round == 1) {
        WriteStore r = write(p, v, false);
        out.put("spilled", r.data.spilled());
        out.put("same_bytes_before", r.data.filterBytes());
        r.abort();
      }
    }
    WriteStore r = write(p, v, false);
    out.put("same_bytes_after", r.data.filterBytes());
    r.abort();
    long refilters = StateData.REFILTERS.get();
    for (int round = 1; round <= 8; round++) { // keys 5000 * round .. +5000 in, the last out
      WriteStore w = write(p, v, false);
      for (int k = 5000 * (round - 1); k < 5000 * round; k++) {
        w.remove(key(k), null);
        model.remove(k);
      }
      for (int k = 5000 * round; k < 5000 * (round + 1); k++) {
        w.put(key(k), value(k, 8), null);
        model.put(k, (long) k);
      }
      w.commit();
      v++;
    }
    out.put("refilters", StateData.REFILTERS.get() - refilters);
    WriteStore check = write(p, v, false);
    out.put("churn_bytes", check.data.filterBytes());
    boolean gets = true;
    for (int k = 0; k < 5000 * 9; k++) {
      UnsafeRow got = check.get(key(k), null);
      Long want = model.get(k);
      gets &= want == null ? got == null : got != null && got.getLong(0) == want;
    }
    out.put("gets_equal", gets);
    check.abort();
    committedAgainst(p, v, model);
    p.close();
  }

  /**
   * An overlay made for the batch before's rows counts its map's table in the cache from the
   * start, and gives it back when it is let go (here an abort with no put).
   */
  void tableCounted() {
    RingStateStoreProvider p = provider();
    WriteStore w = write(p, 0, false);
    for (int k = 0; k < 50_000; k++) {
      w.put(key(k), value(k, 8), null);
    }
    w.commit();
    long before = StateBudget.used();
    WriteStore next = write(p, 1, false);
    long opened = StateBudget.used();
    out.put("counted", opened - before);
    out.put("table", StateData.tableBytes(50_000));
    next.abort();
    out.put("given_back", opened - StateBudget.used());
    // a commit refused (fenced by a later attempt's) lets its overlay go: rows and table
    WriteStore a = write(p, 1, false);
    WriteStore b = write(p, 1, false);
    a.put(key(1), value(7, 8), null);
    b.put(key(1), value(8, 8), null);
    b.commit();
    out.put("fenced_held_before", a.overlay.cachedBytes());
    out.put("fenced_commit", attempt(a::commit));
    out.put("fenced_held_after", a.overlay.cachedBytes());
    p.close();
  }

  /**
   * A commit the ring acknowledged whose apply in this JVM fails part way (a test hook: as a
   * spill store's write or a full disk would): the version applied in place is not kept as
   * the version it was, the overlay lets go of what it counted, and the task's retry reads
   * the version before from the ring and commits again, exactly.
   */
  void applyFails() {
    RingStateStoreProvider p = provider();
    WriteStore w = write(p, 0, false);
    for (int k = 0; k < 1_000; k++) {
      w.put(key(k), value(k, 8), null);
    }
    w.commit();
    WriteStore a = write(p, 1, false);
    out.put("in_place", a.data == p.cachedForTests());
    for (int k = 0; k < 1_000; k++) {
      a.put(key(k), value(k + 1_000_000, 8), null);
    }
    StateData.failApplyAfterForTests = 500;
    try {
      out.put("commit", attempt(a::commit));
    } finally {
      StateData.failApplyAfterForTests = -1;
    }
    out.put("has_committed", a.hasCommitted());
    out.put("overlay_held_after", a.overlay.cachedBytes());
    StateData kept = p.cachedForTests();
    out.put("cached_after", kept == null ? "none" : "version " + kept.version);
    a.abort(); // as Spark's task end does
    // the retry: the version before, then the same puts, committed again
    WriteStore b = write(p, 1, false);
    boolean before = true;
    for (int k = 0; k < 1_000; k++) {
      UnsafeRow got = b.get(key(k), null);
      before &= got != null && got.getLong(0) == k;
    }
    out.put("retry_reads_version_1", before);
    for (int k = 0; k < 1_000; k++) {
      b.put(key(k), value(k + 1_000_000, 8), null);
    }
    out.put("retry_commit", attempt(b::commit));
    RingStateStoreProvider fresh = provider(); // another JVM's view: from the ring only
    StateStore r = fresh.getStore(2, Option.empty(), false, false);
    boolean after = true;
    for (int k = 0; k < 1_000; k++) {
      UnsafeRow got = r.get(key(k), null);
      after &= got != null && got.getLong(0) == k + 1_000_000;
    }
    out.put("version_2_equal", after);
    r.abort();
    fresh.close();
    p.close();
  }

  /**
   * The JVM's key filters held to a total (a tiny one here, 20 KiB: one version's filter of
   * ~15 KiB fits, two do not): a copy of a spilled version made while a reader holds it gets
   * none, and its reads ask its spill store, exact; every filter's bytes are given back.
   */
  void filterTotal() {
    StateData.filterCapForTests = 64 << 10; // half of it holds a filter for twice 5,100 keys
    StateData.filterTotalForTests = 20 << 10;
    try {
      RingStateStoreProvider p = provider();
      WriteStore w = write(p, 0, false);
      for (int k = 0; k < 5_000; k++) {
        w.put(key(k), value(k, 8), null);
      }
      out.put("overlay_filter", w.overlay.filterBytes());
      out.put("total_before_commit", StateData.FILTER_BYTES.get());
      w.commit();
      StateData v1 = p.cachedForTests();
      out.put("total_after_commit", StateData.FILTER_BYTES.get());
      out.put("spilled", v1.spilled());
      out.put("v1_filter", v1.filterBytes());
      ReadStateStore r = p.getReadStore(1, Option.empty()); // holds version 1: a copy follows
      long walks = StateData.FILTER_WALKS.get();
      WriteStore a = write(p, 1, false);
      for (int k = 5_000; k < 5_100; k++) {
        a.put(key(k), value(k, 8), null);
      }
      a.commit();
      StateData v2 = p.cachedForTests();
      out.put("copied", v2 != v1);
      out.put("copy_filter", v2.filterBytes());
      out.put("total", StateData.FILTER_BYTES.get());
      // the copy's commit and the next one: the version's keys would take a filter again,
      // but the JVM's filters have no room: no walk of its store (a first build of the total
      // walked it at every commit, and let the filter go each time)
      WriteStore d = write(p, 2, false);
      d.put(key(200_000), value(200_000, 8), null);
      d.commit();
      out.put("walks_while_full", StateData.FILTER_WALKS.get() - walks);
      out.put("in_place", p.cachedForTests() == v2);
      WriteStore c = write(p, 3, false);
      boolean gets = true;
      for (int k = 0; k < 5_100; k++) {
        UnsafeRow got = c.get(key(k), null);
        gets &= got != null && got.getLong(0) == k;
      }
      for (int k = 100_000; k < 100_500; k++) { // never put
        gets &= c.get(key(k), null) == null;
      }
      out.put("gets_equal", gets);
      c.abort();
      r.abort();
      p.close();
      out.put("total_after_close", StateData.FILTER_BYTES.get());
    } finally {
      StateData.filterCapForTests = 0;
      StateData.filterTotalForTests = 0;
    }
  }

  /**
   * A spilled version's key filter past its cap (a tiny one here): let go, the store asked
   * for every key (and no key lost); once the version shrinks to keys whose filter takes
   * half the cap, made again at the commit.
   */
  void filterCap() {
    StateData.filterCapForTests = 16 << 10; // ~10,900 keys at 12 bits a key
    try {
      RingStateStoreProvider p = provider();
      Map<Integer, Long> model = new java.util.HashMap<>();
      WriteStore w = write(p, 0, false);
      for (int k = 0; k < 20_000; k++) {
        w.put(key(k), value(k, 8), null);
        model.put(k, (long) k);
      }
      w.commit();
      WriteStore r = write(p, 1, false);
      out.put("spilled", r.data.spilled());
      out.put("capped_bytes", r.data.filterBytes());
      long before = SpillStore.READS.sum();
      for (int k = 100_000; k < 101_000; k++) { // never put
        r.get(key(k), null);
      }
      out.put("capped_reads_absent", SpillStore.READS.sum() - before);
      boolean gets = true;
      for (int k = 0; k < 20_000; k++) {
        UnsafeRow got = r.get(key(k), null);
        gets &= got != null && got.getLong(0) == k;
      }
      out.put("capped_gets_equal", gets);
      for (int k = 0; k < 19_000; k++) { // 1,000 keys left
        r.remove(key(k), null);
        model.remove(k);
      }
      r.commit();
      WriteStore c = write(p, 2, false);
      out.put("same_instance", c.data == r.data);
      out.put("remade_bytes", c.data.filterBytes());
      before = SpillStore.READS.sum();
      for (int k = 100_000; k < 101_000; k++) {
        c.get(key(k), null);
      }
      out.put("remade_reads_absent", SpillStore.READS.sum() - before);
      gets = true;
      for (int k = 0; k < 20_000; k++) {
        UnsafeRow got = c.get(key(k), null);
        Long want = model.get(k);
        gets &= want == null ? got == null : got != null && got.getLong(0) == want;
      }
      out.put("remade_gets_equal", gets);
      c.abort();
      committedAgainst(p, 2, model);
      p.close();
      // the size the rule counts: every stage, where one stage's stops at 4M keys
      out.put("chain_small", KeyFilter.chainBytesFor(1000) == KeyFilter.bytesFor(1000));
      out.put("chain_two_stages",
          KeyFilter.chainBytesFor(2L << 22) == 2 * KeyFilter.bytesFor(1L << 22));
      out.put("one_stage_stops", KeyFilter.bytesFor(2L << 22) == KeyFilter.bytesFor(1L << 22));
    } finally {
      StateData.filterCapForTests = 0;
    }
  }

  /**
   * Prefix scans of a spilled version after a committed batch went into it in write batches
   * ({@link SpillStore#writeAll}: the prefix index's entries put again and removed with their
   * rows), against a model; keys (group, k) scanned by group.
   */
  void prefixMerged() {
    StructType keySchema =
        new StructType().add("g", DataTypes.IntegerType).add("k", DataTypes.IntegerType);
    UnsafeProjection keyProj = UnsafeProjection.create(keySchema);
    UnsafeProjection prefixProj =
        UnsafeProjection.create(new StructType().add("g", DataTypes.IntegerType));
    RingStateStoreProvider p =
        provider(keySchema, VALUE, new PrefixKeyScanStateEncoderSpec(keySchema, 1));
    java.util.Random rnd = new java.util.Random(11);
    Map<List<Integer>, Long> model = new java.util.HashMap<>();
    List<int[]> keys = new ArrayList<>();
    for (int i = 0; i < 1200; i++) {
      keys.add(new int[] {rnd.nextInt(6), rnd.nextInt()});
    }
    boolean spilled = true;
    for (int v = 0; v < 3; v++) {
      WriteStore w = write(p, v, false);
      for (int i = 0; i < 800; i++) {
        int[] k = keys.get(rnd.nextInt(keys.size()));
        UnsafeRow key = keyProj.apply(new GenericInternalRow(new Object[] {k[0], k[1]})).copy();
        if (v > 0 && rnd.nextInt(3) == 0) {
          w.remove(key, null);
          model.remove(List.of(k[0], k[1]));
        } else {
          w.put(key, value(100L * v + i, 8), null);
          model.put(List.of(k[0], k[1]), 100L * v + i);
        }
      }
      spilled &= w.data.spilled() || v == 0;
      w.commit();
    }
    WriteStore r = write(p, 3, false); // the version the provider kept, spilled
    spilled &= r.data.spilled();
    Map<List<Integer>, Long> seen = new java.util.HashMap<>();
    for (int g = 0; g < 6; g++) {
      UnsafeRow prefix = prefixProj.apply(new GenericInternalRow(new Object[] {g})).copy();
      scala.collection.Iterator<UnsafeRowPair> it = r.prefixScan(prefix, null);
      while (it.hasNext()) {
        UnsafeRowPair pair = it.next();
        List<Integer> k = List.of(pair.key().getInt(0), pair.key().getInt(1));
        if (k.get(0) != g || seen.put(k, pair.value().getLong(0)) != null) {
          throw new IllegalStateException("prefix scan of " + g + " gave " + k);
        }
      }
    }
    r.abort();
    out.put("spilled", spilled);
    out.put("prefix_equal", model.equals(seen));
    out.put("rows", model.size());
  }

  /** Every row a store iterates, by key (a key given twice fails). */
  private static Map<Integer, Long> rows(WriteStore store) {
    Map<Integer, Long> seen = new java.util.HashMap<>();
    scala.collection.Iterator<UnsafeRowPair> it = store.iterator(null);
    while (it.hasNext()) {
      UnsafeRowPair pair = it.next();
      if (seen.put(pair.key().getInt(0), pair.value().getLong(0)) != null) {
        throw new IllegalStateException("key " + pair.key().getInt(0) + " iterated twice");
      }
    }
    return seen;
  }

  /** Restore {@code version} in a fresh provider and count and sum its rows. */
  void restore(long version) {
    long started = System.nanoTime();
    try {
      WriteStore r = write(provider(), version, false);
      long n = 0;
      long sum = 0;
      scala.collection.Iterator<UnsafeRowPair> it = r.iterator(null);
      while (it.hasNext()) {
        UnsafeRowPair pair = it.next();
        n++;
        sum += pair.value().getLong(0);
      }
      out.put("restored_rows", n);
      out.put("restored_sum", sum);
      r.abort();
    } catch (RuntimeException e) {
      out.put("restore_error", String.valueOf(e.getMessage()));
    }
    out.put("restore_ms", (System.nanoTime() - started) / 1_000_000);
  }

  /** Every row of a store as "key=value", sorted. */
  static List<String> rows(scala.collection.Iterator<UnsafeRowPair> it) {
    List<String> out = new ArrayList<>();
    while (it.hasNext()) {
      UnsafeRowPair pair = it.next();
      out.add(pair.key().getInt(0) + "=" + pair.value().getLong(0));
    }
    java.util.Collections.sort(out);
    return out;
  }

  /**
   * Spark's fine-grained replay on the provider: the change feed of versions holding a
   * changed key, a key put twice, a removed key, a key added and removed in one version and
   * a removal of an absent key; a version sent whole ({@code loadEmpty}); a version re-split
   * into shards and a delta over them; the replay from each version to the last, as a read
   * store and as a store to update.
   */
  void changes() {
    int bulk = Integer.parseInt(args.getOrDefault("rows", "3000"));
    RingStateStoreProvider p = provider();
    WriteStore w = write(p, 0, false);
    for (int i = 0; i < 10; i++) {
      w.put(key(i), value(i, 4), null);
    }
    w.commit();
    w = write(p, 1, false);
    w.put(key(0), value(100, 4), null);
    w.put(key(1), value(1001, 4), null);
    w.put(key(1), value(1002, 4), null);
    w.remove(key(2), null);
    w.put(key(10), value(10, 4), null);
    w.remove(key(10), null);
    w.remove(key(99), null);
    w.commit();
    w = write(p, 2, true); // loadEmpty: version 3 goes whole
    w.put(key(5), value(5, 4), null);
    w.put(key(20), value(20, 4), null);
    w.commit();
    w = write(p, 3, false); // grows past maxCommitBytes: re-split, sent whole
    for (int i = 0; i < bulk; i++) {
      w.put(key(1000 + i), value(1000 + i, 100), null);
    }
    w.commit();
    out.put("shards_v4", w.shardsCommitted);
    w = write(p, 4, false); // a delta over every shard
    w.put(key(1000), value(7, 100), null);
    w.remove(key(1001), null);
    w.put(key(5), value(55, 4), null);
    w.commit();
    out.put("shards_v5", w.shardsCommitted);

    RingStateStoreProvider reader = provider();
    scala.collection.Iterator<scala.Tuple4<scala.Enumeration.Value, UnsafeRow, UnsafeRow, Object>>
        it = reader.getStateStoreChangeDataReader(1, 5, Option.empty(), Option.empty());
    Map<Long, List<String>> byBatch = new LinkedHashMap<>();
    while (it.hasNext()) {
      scala.Tuple4<scala.Enumeration.Value, UnsafeRow, UnsafeRow, Object> c = it.next();
      boolean put = c._1() == org.apache.spark.sql.execution.streaming.state.RecordType$.MODULE$
          .PUT_RECORD();
      String row = c._2().getInt(0) + (put ? "=" + c._3().getLong(0) : " deleted");
      byBatch.computeIfAbsent((Long) c._4(), b -> new ArrayList<>()).add(row);
    }
    for (Map.Entry<Long, List<String>> e : byBatch.entrySet()) {
      java.util.Collections.sort(e.getValue());
      boolean big = e.getValue().size() > 20;
      out.put("batch" + e.getKey(), big ? (Object) e.getValue().size() : e.getValue());
    }
    List<String> v5 = rows(reader.getReadStore(5, Option.empty()).iterator(null));
    out.put("rows_v5", v5.size());
    for (long start = 1; start <= 5; start++) {
      ReadStateStore r = provider().replayReadStateFromSnapshot(start, 5, Option.empty(),
          Option.empty());
      out.put("replay_from_" + start + "_equal", rows(r.iterator(null)).equals(v5));
    }
    ReadStateStore r2 = provider().replayReadStateFromSnapshot(1, 2, Option.empty(),
        Option.empty());
    out.put("replay_1_2", rows(r2.iterator(null)));
    StateStore u = provider().replayStateFromSnapshot(2, 5, false, Option.empty(),
        Option.empty());
    u.put(key(7), value(77, 4), null);
    out.put("replay_commit", attempt(u::commit));
    List<String> v6 = rows(provider().getReadStore(6, Option.empty()).iterator(null));
    out.put("rows_v6", v6.size());
    out.put("v6_has_replayed_put", v6.contains("7=77") && v6.containsAll(v5));
    out.put("read_only_replay", attempt(() -> provider().replayStateFromSnapshot(2, 5, true,
        Option.empty(), Option.empty())));
    out.put("missing_version", attempt(() -> provider().getStateStoreChangeDataReader(9, 9,
        Option.empty(), Option.empty()).hasNext()));
  }

  /**
   * One GET of the direct read path ({@code RingTransport.get}) to {@code address}, with the
   * token and CA of the arguments: its status, or the error it failed with.
   */
  void get() {
    RingAccess access = RingAccess.of(args.getOrDefault("token", ""), "",
        args.getOrDefault("tlsCa", ""));
    RingTransport t = new RingTransport(access, java.time.Duration.ofSeconds(5));
    try {
      RingTransport.Answer a = t.get(args.get("address"), "/v1/chunks/x", 5000,
          System.nanoTime() + 20_000_000_000L, 5000, 1 << 16);
      out.put("status", a.status());
    } catch (Exception e) {
      out.put("error", e.toString());
    }
  }

  /**
   * A GET of the direct read path (10 minutes to answer) from a thread interrupted half a
   * second in, as Spark interrupts a killed task's thread: what it ended with, and whether it
   * ended within a minute of the interrupt (a read that ignored it would wait its 10 minutes).
   */
  void interruptedGet() throws InterruptedException {
    RingTransport t = new RingTransport(RingAccess.NONE, java.time.Duration.ofSeconds(5));
    Map<String, Object> got = new java.util.concurrent.ConcurrentHashMap<>();
    Thread reader = new Thread(() -> {
      try {
        got.put("status", t.get(args.get("address"), "/v1/chunks/x", 600_000,
            System.nanoTime() + 900_000_000_000L, 600_000, 1 << 16).status());
      } catch (Exception e) {
        got.put("error", e.getClass().getSimpleName());
      }
    });
    reader.start();
    Thread.sleep(500);
    reader.interrupt();
    reader.join(60_000);
    out.put("ended", !reader.isAlive());
    out.putAll(got);
  }

  /**
   * A version loaded lazily and kept 6 versions past its base on a ring that folds no newer
   * snapshot meanwhile: at the horizon its chains, read again, still start at its base, so
   * it stays lazy (the build before read the whole base then). Per version: the loads that
   * missed the cache, what the version holds itself (heap and spill), and a row of the base
   * and the row the version before wrote, read through it.
   */
  void horizon() {
    RingStateStoreProvider writer = provider();
    StateStore w = write(writer, 0, false); // version 1: a snapshot, the lazy loads' base
    for (int k = 0; k < 2000; k++) {
      w.put(key(k), value(k, 100), null);
    }
    w.commit();
    RingStateStoreProvider lazy = provider(); // another executor's: version 1 loaded lazily
    List<Object> misses = new ArrayList<>();
    List<Object> held = new ArrayList<>();
    List<Object> base = new ArrayList<>();
    List<Object> last = new ArrayList<>();
    for (int v = 1; v <= 7; v++) {
      WriteStore s = write(lazy, v, false);
      base.add(valueOf(s.get(key(1500), null)));
      last.add(valueOf(s.get(key(v - 1), null)));
      s.put(key(v), value(1000L * v, 100), null);
      s.commit();
      var custom = s.metrics().customMetrics();
      misses.add(custom.get(RingMetrics.CACHE_MISSES).get());
      held.add((Long) custom.get(RingMetrics.CACHE_BYTES).get()
          + (Long) custom.get(RingMetrics.SPILL_BYTES).get());
    }
    out.put("misses", misses);
    out.put("held", held);
    out.put("base", base);
    out.put("last", last);
  }

  /**
   * A batch's keys read ahead ({@link RingStateStoreProvider#readAhead}) into a version
   * loaded lazily by one provider, while a second provider of the same store (Spark's state
   * reader, in the same JVM) is opened and closed: the keys the read-ahead brought, then
   * what the lazy version answers for them.
   */
  void readAhead() {
    RingStateStoreProvider writer = provider();
    StateStore w = write(writer, 0, false); // version 1: a snapshot, the lazy load's base
    for (int k = 0; k < 2000; k++) {
      w.put(key(k), value(k, 100), null);
    }
    w.commit();
    RingStateStoreProvider lazy = provider(); // another executor's: version 1 loaded lazily
    WriteStore s = write(lazy, 1, false);
    out.put("lazy", s.data.remote != null);
    RingStateStoreProvider reader = provider(); // the state reader's, of the same store
    reader.close();
    List<UnsafeRow> keys = new ArrayList<>();
    for (int k = 0; k < 2000; k += 20) {
      keys.add(key(k));
    }
    long before = RingStateStoreProvider.readAheadKeys();
    RingStateStoreProvider.readAhead(lazy.stateStoreId(), 1, keys);
    out.put("brought", RingStateStoreProvider.readAheadKeys() - before);
    out.put("failed", RingStateStoreProvider.readAheadFailed());
    out.put("values", values(s, keys));
    // a few keys of a chunk: read from their blocks in the read-ahead, no lookup
    List<UnsafeRow> few = new ArrayList<>();
    for (int k = 1; k < 2000; k += 400) {
      few.add(key(k));
    }
    readAheadOf("few", lazy, s, few);
    // a batch's rows go through a read-ahead while a provider of the store holds the
    // version lazily; once none does (the lazy one closed), as they come
    out.put("reads_ahead_lazy", RingStateStoreProvider.readsAhead(lazy.stateStoreId(), 1));
    out.put("reads_ahead_other", RingStateStoreProvider.readsAhead(lazy.stateStoreId(), 7));
    out.put("reads_ahead_first", RingStateStoreProvider.readsAhead(lazy.stateStoreId(), 0));
    s.abort();
    lazy.close();
    out.put("reads_ahead_whole", RingStateStoreProvider.readsAhead(writer.stateStoreId(), 1));
    writer.close();
  }

  /**
   * A read-ahead of {@code keys} into version 1 of {@code lazy}'s store, then what {@code s}
   * answers for them: {@code name}_brought, _lookups, _from_blocks (the keys read from their
   * blocks) and _values.
   */
  void readAheadOf(String name, RingStateStoreProvider lazy, StateStore s, List<UnsafeRow> keys) {
    long brought = RingStateStoreProvider.readAheadKeys();
    long lookups = RingStateStoreProvider.readAheadLookups();
    long fromBlocks = RingStateStoreProvider.readAheadBlockKeys();
    RingStateStoreProvider.readAhead(lazy.stateStoreId(), 1, keys);
    out.put(name + "_brought", RingStateStoreProvider.readAheadKeys() - brought);
    out.put(name + "_lookups", RingStateStoreProvider.readAheadLookups() - lookups);
    out.put(name + "_from_blocks", RingStateStoreProvider.readAheadBlockKeys() - fromBlocks);
    out.put(name + "_values", values(s, keys));
  }

  /**
   * A provider that committed version 1 as a snapshot of {@code n} keys of ~300 bytes:
   * several chunks (4 at 40,000 keys).
   */
  RingStateStoreProvider severalChunks(int n) {
    RingStateStoreProvider writer = provider();
    StateStore w = write(writer, 0, false);
    for (int k = 0; k < n; k++) {
      w.put(key(k), value(k, 300), null);
    }
    w.commit();
    return writer;
  }

  /**
   * A version loaded lazily over a base of several chunks reads none of their indexes: a
   * read-ahead of keys from every chunk goes to the nodes, which hold them; a key asked for
   * without a read-ahead then reads its chunk's index, once, and one block. Per step: the indexes
   * the JVM read, and the values.
   */
  void lazyIndexes() {
    int n = 40_000;
    RingStateStoreProvider writer = severalChunks(n);
    RingStateStoreProvider lazy = provider(); // another executor's: version 1 loaded lazily
    long indexes = LazyBase.INDEXES_READ.get();
    WriteStore s = write(lazy, 1, false);
    LazyBase base = s.data.remote;
    out.put("lazy", base != null);
    out.put("chunks", base.chunks());
    out.put("loaded_indexes", LazyBase.INDEXES_READ.get() - indexes);
    List<UnsafeRow> keys = new ArrayList<>();
    for (int k = 3; k < n; k += 400) { // 100 keys over every chunk
      keys.add(key(k));
    }
    for (int k = n; k < n + 200; k++) { // and 200 the base lacks: asked of every chunk too
      keys.add(key(k));
    }
    long lookups = RingStateStoreProvider.readAheadLookups();
    RingStateStoreProvider.readAhead(lazy.stateStoreId(), 1, keys);
    out.put("ahead_lookups", RingStateStoreProvider.readAheadLookups() - lookups);
    out.put("values", values(s, keys));
    out.put("ahead_indexes", LazyBase.INDEXES_READ.get() - indexes);
    out.put("failed", RingStateStoreProvider.readAheadFailed());
    // 3 keys of the chunks the next step reads, fewer than readAheadMinKeys of any, while
    // other read-aheads hold all the room for indexes: no index read, the keys in lookups
    long room = LazyBase.indexBytes();
    if (!LazyBase.takeAheadRoom(room)) {
      throw new IllegalStateException("the read-aheads' room is taken already");
    }
    out.put("crowded_indexed_before", base.indexed());
    long crowded = LazyBase.INDEXES_READ.get();
    try {
      readAheadOf("crowded", lazy, s, List.of(key(6), key(20_006), key(39_006)));
    } finally {
      LazyBase.takeAheadRoom(-room);
    }
    out.put("crowded_indexes", LazyBase.INDEXES_READ.get() - crowded);
    // 3 keys not asked yet, fewer than readAheadMinKeys of any chunk: read from their blocks
    // in the read-ahead, their chunks' indexes read first, and no lookup sent
    List<UnsafeRow> sparse = List.of(key(5), key(20_005), key(39_005));
    readAheadOf("sparse", lazy, s, sparse);
    // 50 keys not read ahead, over every chunk: each chunk's index once, and a block a key
    List<Object> later = new ArrayList<>();
    for (int k = 1; k < n; k += 800) {
      later.add(valueOf(s.get(key(k), null)));
    }
    out.put("later", later);
    out.put("later_indexes", LazyBase.INDEXES_READ.get() - indexes);
    s.abort();
    lazy.close();
    writer.close();
  }

  /**
   * What the JVM holds of a lazy base (its indexes, blocks and memo rows) while versions read
   * it and once none does: a version and a copy of it read keys, the version is made whole
   * (the copy still reads the base); another provider loads the same version lazily (its own
   * base over the same chunks); the copy is made whole; the other provider's version reads
   * keys, then the provider is closed (its version let go, not made whole).
   */
  void forget() {
    int n = 40_000;
    RingStateStoreProvider writer = severalChunks(n);
    RingStateStoreProvider lazy = provider();
    WriteStore s = write(lazy, 1, false);
    out.put("lazy", s.data.remote != null);
    List<UnsafeRow> keys = new ArrayList<>();
    for (int k = 1; k < n; k += 800) {
      keys.add(key(k));
    }
    out.put("values", values(s, keys));
    out.put("read", held());
    StateData copy = s.data.copy(); // the next version in the making reads the base too
    s.data.materialize();
    out.put("one_whole", held());
    RingStateStoreProvider other = provider();
    WriteStore o = write(other, 1, false); // the same version, over the same chunks
    out.put("other_lazy", o.data.remote != null);
    out.put("with_other", LazyBase.indexesHeld()); // the load reads one index (a format check)
    LazyBase first = copy.remote;
    copy.materialize();
    out.put("both_whole", held());
    out.put("first_indexed", first.indexed()); // its chunks hold no index: dropped, not lost
    out.put("consistent", LazyBase.indexesConsistent());
    // a read through the base no version reads (as a read-ahead under way when the last
    // version let go): answered, and nothing it read is kept
    out.put("late_read", first.lookup(key(7)) != null);
    out.put("after_late", held());
    out.put("values_whole", values(s, keys));
    s.abort();
    copy.retire();
    lazy.close();
    out.put("other_values", values(o, keys));
    out.put("other_indexes", LazyBase.indexesHeld());
    o.abort();
    other.close(); // its version let go while it reads the base
    out.put("closed", held());
    out.put("closed_consistent", LazyBase.indexesConsistent());
    // a version let go without being retired (a copy no store holds, collected): its Cleaner
    // lets the base go
    RingStateStoreProvider last = provider();
    WriteStore w = write(last, 1, false);
    out.put("last_values", values(w, keys));
    StateData orphan = w.data.copy();
    w.abort();
    last.close(); // what the provider holds is retired; the copy reads the base still
    out.put("orphan_reads", held());
    orphan = null;
    for (int i = 0; i < 200 && !held().equals(List.of(0L, 0L, 0L)); i++) {
      System.gc();
      try {
        Thread.sleep(50);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        break;
      }
    }
    out.put("collected", held());
    // a version retired, then made whole (a prefetch's merge that lost the race): it reads
    // nothing more into the cache, and counts nothing
    RingStateStoreProvider again = provider();
    WriteStore r = write(again, 1, false);
    out.put("again_values", values(r, keys));
    StateData retired = r.data.copy();
    r.abort();
    again.close();
    retired.retire();
    out.put("retired_held", held());
    long used = StateBudget.used();
    out.put("retired_whole", attempt(retired::materialize));
    out.put("retired_after", List.of(held(), StateBudget.used() - used, retired.heapBytes()));
    writer.close();
  }

  /** The bytes of the lazy bases' indexes, decoded blocks and memo rows the JVM holds. */
  static List<Long> held() {
    return List.of(LazyBase.indexesHeld(), LazyBase.blocksHeld(), LazyBase.memoHeld());
  }

  /**
   * A read-ahead of keys of a key group split over two chunks, A and B, all of them in B:
   * with A's index held (read first) and B's not, the keys A's index rules out are asked of
   * B alone, in one lookup, B's index not read here; the keys brought, the lookups, and the
   * values.
   */
  void splitGroup() {
    int n = 40_000;
    RingStateStoreProvider writer = severalChunks(n);
    RingStateStoreProvider lazy = provider();
    WriteStore s = write(lazy, 1, false);
    LazyBase base = s.data.remote;
    out.put("lazy", base != null);
    // the chunk pairs sharing a group, in order (A of a pair is B of the one before)
    Map<List<LazyBase.Part>, List<UnsafeRow>> pairs = new LinkedHashMap<>();
    for (int k = 0; k < n; k++) {
      UnsafeRow key = key(k);
      List<LazyBase.Part> covering = base.coveringOf(key);
      if (covering.size() == 2) {
        pairs.computeIfAbsent(covering, c -> new ArrayList<>()).add(key);
      }
    }
    out.put("pairs", pairs.size());
    // the first pair whose group A's index (read now) rules 8 keys or more out of: B holds
    // them (a group may end A and start B without being split)
    int groups = base.bases.get(0).keyGroups();
    List<LazyBase.Part> pair = null;
    List<UnsafeRow> inB = new ArrayList<>();
    List<Integer> ids = new ArrayList<>();
    for (Map.Entry<List<LazyBase.Part>, List<UnsafeRow>> e : pairs.entrySet()) {
      ChunkCodec.Index first = base.index(e.getKey().get(0));
      for (UnsafeRow key : e.getValue()) {
        byte[] k = key.getBytes();
        if (first.find(ChunkCodec.keyGroup(k, groups), k) < 0 && inB.size() < 40) {
          inB.add(key);
          ids.add(key.getInt(0));
        }
      }
      if (inB.size() >= 8) {
        pair = e.getKey();
        break;
      }
      inB.clear();
      ids.clear();
    }
    out.put("split", pair != null);
    out.put("in_b", inB.size());
    if (pair == null) {
      return;
    }
    out.put("b_indexed", pair.get(1).indexed());
    long indexes = LazyBase.INDEXES_READ.get();
    readAheadOf("split", lazy, s, inB);
    out.put("split_indexes", LazyBase.INDEXES_READ.get() - indexes);
    List<Object> want = new ArrayList<>();
    for (int id : ids) {
      want.add(id);
    }
    out.put("split_want", want);
    s.abort();
    lazy.close();
    writer.close();
  }

  /**
   * Keys read alone from every chunk of a lazy base under a cache whose quarter, the LRU of
   * indexes, holds fewer than the chunks' indexes: the indexes read, the bytes held against
   * the LRU's, how many of the base's chunks hold one; the values, then the same keys'
   * values again; then keys read by 4 threads at once: those answered wrong, and whether the
   * LRU agrees with itself.
   */
  void indexBound() {
    int n = 40_000;
    RingStateStoreProvider writer = severalChunks(n);
    RingStateStoreProvider lazy = provider();
    long indexes = LazyBase.INDEXES_READ.get();
    WriteStore s = write(lazy, 1, false);
    LazyBase base = s.data.remote;
    out.put("lazy", base != null);
    out.put("chunks", base.chunks());
    List<UnsafeRow> keys = new ArrayList<>();
    for (int k = 1; k < n; k += 800) { // 50 keys over every chunk, read alone
      keys.add(key(k));
    }
    out.put("values", values(s, keys));
    out.put("indexes_read", LazyBase.INDEXES_READ.get() - indexes);
    out.put("held", LazyBase.indexesHeld());
    out.put("limit", LazyBase.indexBytes());
    out.put("chunks_indexed", base.indexed());
    out.put("again", values(s, keys)); // from the memo of rows
    out.put("held_again", LazyBase.indexesHeld());
    // 4 tasks at once, each its own provider's lazy version of the store (as Spark's tasks of
    // a JVM), reading keys alone: each chunk's index dropped and read again by one while the
    // others use theirs; every value exact, the LRU consistent. The keys are made here: a
    // projection is not for two threads at once
    List<Thread> threads = new ArrayList<>();
    List<RingStateStoreProvider> providers = new ArrayList<>();
    List<WriteStore> stores = new ArrayList<>();
    java.util.concurrent.ConcurrentHashMap<Integer, Object> wrong =
        new java.util.concurrent.ConcurrentHashMap<>();
    for (int t = 0; t < 4; t++) {
      RingStateStoreProvider task = provider();
      WriteStore store = write(task, 1, false);
      providers.add(task);
      stores.add(store);
      List<Integer> ks = new ArrayList<>();
      List<UnsafeRow> rows = new ArrayList<>();
      for (int k = 2 + t; k < n; k += 397) {
        ks.add(k);
        rows.add(key(k));
      }
      threads.add(new Thread(() -> {
        for (int i = 0; i < ks.size(); i++) {
          Long v = valueOf(store.get(rows.get(i), null));
          if (v == null || v.longValue() != ks.get(i)) {
            wrong.put(ks.get(i), v == null ? "none" : v);
          }
        }
      }));
    }
    threads.forEach(Thread::start);
    for (Thread th : threads) {
      try {
        th.join();
      } catch (InterruptedException e) {
        throw new IllegalStateException(e);
      }
    }
    out.put("threads_held", LazyBase.indexesHeld());
    out.put("consistent", LazyBase.indexesConsistent());
    stores.forEach(WriteStore::abort);
    providers.forEach(RingStateStoreProvider::close); // their bases' indexes go with them
    List<String> wrongs = new ArrayList<>();
    wrong.forEach((k, v) -> wrongs.add(k + "=" + v));
    out.put("threads_wrong", wrongs);
    out.put("closed_held", LazyBase.indexesHeld());
    out.put("closed_consistent", LazyBase.indexesConsistent());
    s.abort();
    lazy.close();
    writer.close();
  }

  /**
   * A version loaded lazily whose base the ring drops before the provider's check at the
   * horizon (nodes folding a snapshot every delta and thinning them): once the nodes folded
   * version 3 into a snapshot, another provider loads it lazily over that snapshot and
   * commits versions 4 (a put and a remove) and 5; once a read of the snapshot's chunk fails
   * (the nodes folded 4 and 5 and dropped 3's), version 5, still cached and lazy, is read:
   * rows of its old base, its own rows and a removed key; then version 6 is committed
   * through it and read by a fresh provider.
   */
  void vanished() throws Exception {
    RingStateStoreProvider writer = provider();
    for (int v = 0; v < 3; v++) {
      StateStore w = write(writer, v, false);
      if (v == 0) {
        for (int k = 0; k < 2000; k++) {
          w.put(key(k), value(k, 100), null);
        }
      } else {
        w.put(key(5000 + v), value(v, 10), null);
      }
      w.commit();
    }
    long until = System.nanoTime() + 150_000_000_000L;
    RingStateStoreProvider lazy = provider();
    WriteStore s = write(lazy, 3, false);
    while (s.data.remote != null && s.data.remote.oldest() < 3 && System.nanoTime() < until) {
      s.abort(); // not folded yet: another executor's provider loads it again
      Thread.sleep(500);
      lazy = provider();
      s = write(lazy, 3, false);
    }
    LazyBase first = s.data.remote;
    out.put("lazy", first != null);
    out.put("base", first == null ? null : first.oldest());
    s.put(key(3), value(3000, 100), null);
    s.remove(key(7), null);
    s.commit();
    s = write(lazy, 4, false);
    s.put(key(4), value(4000, 100), null);
    s.commit();
    boolean gone = false;
    while (!gone && System.nanoTime() < until) {
      try {
        first.chunk(0);
        Thread.sleep(500);
      } catch (java.io.IOException e) {
        gone = true;
      }
    }
    out.put("gone", gone);
    long reading = System.nanoTime();
    WriteStore at5 = write(lazy, 5, false);
    List<Object> read = new ArrayList<>();
    for (int k : new int[] {1500, 1999, 3, 4, 5001, 7}) {
      try {
        read.add(valueOf(at5.get(key(k), null)));
      } catch (RuntimeException e) {
        read.add("error: " + e.getMessage());
      }
    }
    out.put("read", read);
    out.put("read_ms", (System.nanoTime() - reading) / 1_000_000);
    LazyBase now = at5.data.remote;
    out.put("rebased", now != null && now != first);
    out.put("new_base", now == null ? null : now.oldest());
    // no version reads the old base now: what the JVM held of it went (LazyBase.Held)
    out.put("first_indexed", first.indexed());
    out.put("consistent", LazyBase.indexesConsistent());
    out.put("commit", attempt(() -> {
      at5.put(key(6), value(6000, 100), null);
      at5.commit();
    }));
    if ("ok".equals(out.get("commit"))) {
      WriteStore fresh = write(provider(), 6, false);
      List<Object> after = new ArrayList<>();
      for (int k : new int[] {1500, 3, 6, 7}) {
        after.add(valueOf(fresh.get(key(k), null)));
      }
      out.put("after", after);
    }
  }

  /**
   * {@link ByteLru} (no ring): a limit of 100 bytes, an entry costing its value's length; the
   * order entries are dropped in, the entry just put kept whatever it costs, a replaced
   * entry's bytes, and the executor's count moving with the bytes held; then 4 threads
   * putting and getting at once.
   */
  void byteLru() throws Exception {
    List<String> dropped = java.util.Collections.synchronizedList(new ArrayList<>());
    ByteLru<String, byte[]> lru = new ByteLru<>(4, () -> 100, (k, v) -> v.length,
        (k, v) -> dropped.add(k));
    long counted = StateBudget.used();
    lru.put("a", new byte[40]);
    lru.put("b", new byte[40]);
    lru.get("a"); // a is the most recently used now: b goes first
    lru.put("c", new byte[40]);
    out.put("dropped", new ArrayList<>(dropped));
    out.put("held", lru.held());
    out.put("has", List.of(lru.contains("a"), lru.contains("b"), lru.contains("c")));
    lru.put("big", new byte[250]); // over the limit alone: kept, every other dropped
    out.put("big_held", lru.held());
    out.put("big_size", lru.size());
    lru.put("big", new byte[10]); // replaced: its bytes are the new value's
    out.put("replaced_held", lru.held());
    out.put("counted", StateBudget.used() - counted);
    out.put("consistent", lru.consistent((k, v) -> true));
    out.put("all_dropped", new ArrayList<>(dropped));
    // a replaced entry in the middle of the order becomes the newest: the oldest goes first
    lru.put("x", new byte[30]);
    lru.put("y", new byte[30]);
    lru.put("x", new byte[40]); // x: 40 bytes, the newest; y the oldest after big
    lru.put("z", new byte[40]); // 10 + 30 + 40 + 40 > 100: big then y go
    out.put("replaced_order", List.of(lru.contains("big"), lru.contains("y"),
        lru.contains("x"), lru.contains("z")));
    out.put("replaced_order_held", lru.held());
    // removeIf: its entries told to dropped, their bytes out of the map's and the executor's
    dropped.clear();
    long beforeRemove = StateBudget.used();
    out.put("removed", lru.removeIf((k, v) -> k.equals("x")));
    out.put("removed_dropped", new ArrayList<>(dropped));
    out.put("removed_held", lru.held());
    out.put("removed_counted", StateBudget.used() - beforeRemove);
    out.put("refused", List.of(lru.putIf("w", new byte[5], () -> false), lru.contains("w"),
        lru.held()));
    // 4 threads at once over 64 keys of 1-30 bytes
    ByteLru<Integer, byte[]> shared = new ByteLru<>(16, () -> 200, (k, v) -> v.length);
    long before = StateBudget.used();
    List<Thread> threads = new ArrayList<>();
    java.util.concurrent.atomic.AtomicLong most = new java.util.concurrent.atomic.AtomicLong();
    for (int t = 0; t < 4; t++) {
      long seed = t;
      threads.add(new Thread(() -> {
        java.util.Random rnd = new java.util.Random(seed);
        for (int i = 0; i < 20_000; i++) {
          int k = rnd.nextInt(64);
          if (rnd.nextBoolean()) {
            shared.put(k, new byte[1 + rnd.nextInt(30)]);
          } else {
            shared.get(k);
          }
          most.accumulateAndGet(shared.held(), Math::max);
        }
      }));
    }
    for (Thread t : threads) {
      t.start();
    }
    for (Thread t : threads) {
      t.join();
    }
    out.put("threads_consistent", shared.consistent((k, v) -> true));
    out.put("threads_most", most.get());
    out.put("threads_counted", StateBudget.used() - before == shared.held());
  }

  /**
   * {@link RingDirect#together} (no ring): six calls finishing in reverse order; a call that
   * fails while another hangs; a deadline that passes just before a call fails.
   */
  void together() throws Exception {
    long far = System.nanoTime() + 600_000_000_000L;
    List<java.util.concurrent.Callable<Object>> ordered = new ArrayList<>();
    for (int i = 0; i < 6; i++) {
      int at = i;
      ordered.add(() -> {
        Thread.sleep(40L * (6 - at));
        return at;
      });
    }
    out.put("order", RingDirect.together(ordered, far, "ordered"));
    // three rounds of 20 calls: at most FETCH_THREADS at once, on threads the rounds share
    java.util.concurrent.atomic.AtomicInteger running = new java.util.concurrent.atomic.AtomicInteger();
    java.util.concurrent.atomic.AtomicInteger most = new java.util.concurrent.atomic.AtomicInteger();
    java.util.Set<String> threads = java.util.concurrent.ConcurrentHashMap.newKeySet();
    List<Object> rounds = new ArrayList<>();
    for (int round = 0; round < 3; round++) {
      List<java.util.concurrent.Callable<Object>> many = new ArrayList<>();
      for (int i = 0; i < 20; i++) {
        int at = i;
        many.add(() -> {
          most.accumulateAndGet(running.incrementAndGet(), Math::max);
          threads.add(Thread.currentThread().getName());
          Thread.sleep(20);
          running.decrementAndGet();
          return at;
        });
      }
      rounds.add(RingDirect.together(many, far, "many"));
    }
    out.put("rounds", rounds);
    out.put("most_at_once", most.get());
    out.put("threads", threads.size());
    // the hanging call outlasts the harness's own timeout: only failing fast ends it
    List<java.util.concurrent.Callable<Object>> failing = List.of(
        () -> {
          Thread.sleep(600_000);
          return 0;
        },
        () -> {
          throw new java.io.IOException("chunk x could not be read");
        });
    try {
      RingDirect.together(failing, far, "failing");
    } catch (java.io.IOException e) {
      out.put("failed", e.getMessage());
    }
    List<java.util.concurrent.Callable<Object>> late = List.of(
        () -> {
          Thread.sleep(600_000);
          return 0;
        },
        () -> {
          Thread.sleep(500);
          throw new java.io.IOException("node y: read cut");
        });
    try {
      RingDirect.together(late, System.nanoTime() + 200_000_000L, "late");
    } catch (java.io.IOException e) {
      out.put("late", e.getMessage());
      out.put("late_cause", e.getCause() == null ? null : e.getCause().getMessage());
    }
  }

  public static void main(String[] argv) throws Exception {
    Map<String, String> args = new LinkedHashMap<>();
    for (int i = 2; i < argv.length; i++) {
      int eq = argv[i].indexOf('=');
      args.put(argv[i].substring(0, eq), argv[i].substring(eq + 1));
    }
    ProviderHarness h = new ProviderHarness(argv[1], args);
    switch (argv[0]) {
      case "isolation" -> h.isolation();
      case "cache" -> h.cache();
      case "memory" -> h.memory();
      case "empty" -> h.empty();
      case "lineage" -> h.lineage();
      case "legacy" -> h.legacy();
      case "bulk" -> h.bulk();
      case "merged" -> h.merged();
      case "spill-reads" -> h.spillReads();
      case "filter-bounds" -> h.filterBounds();
      case "filter-cap" -> h.filterCap();
      case "table-counted" -> h.tableCounted();
      case "apply-fails" -> h.applyFails();
      case "filter-total" -> h.filterTotal();
      case "prefix-merged" -> h.prefixMerged();
      case "schema" -> h.schema();
      case "changes" -> h.changes();
      case "restore" -> h.restore(Long.parseLong(args.get("version")));
      case "get" -> h.get();
      case "interrupted-get" -> h.interruptedGet();
      case "together" -> h.together();
      case "byte-lru" -> h.byteLru();
      case "horizon" -> h.horizon();
      case "read-ahead" -> h.readAhead();
      case "lazy-indexes" -> h.lazyIndexes();
      case "index-bound" -> h.indexBound();
      case "split-group" -> h.splitGroup();
      case "forget" -> h.forget();
      case "vanished" -> h.vanished();
      default -> throw new IllegalArgumentException("unknown scenario " + argv[0]);
    }
    StringBuilder sb = new StringBuilder("{");
    for (Map.Entry<String, Object> e : h.out.entrySet()) {
      if (sb.length() > 1) {
        sb.append(", ");
      }
      sb.append('"').append(e.getKey()).append("\": ").append(json(e.getValue()));
    }
    System.out.println("RESULT " + sb.append('}'));
    System.exit(0);
  }

  static String json(Object v) {
    if (v == null) {
      return "null";
    }
    if (v instanceof Number || v instanceof Boolean) {
      return v.toString();
    }
    if (v instanceof List<?> list) {
      List<String> parts = new ArrayList<>();
      for (Object o : list) {
        parts.add(json(o));
      }
      return "[" + String.join(", ", parts) + "]";
    }
    String s = v.toString().replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", " ");
    return '"' + s + '"';
  }
}
