package statestore.spark;

import java.io.File;
import java.io.IOException;
import java.lang.ref.Cleaner;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.NoSuchElementException;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Function;
import java.util.stream.Stream;

import org.apache.spark.SparkEnv;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.unsafe.Platform;
import org.rocksdb.BlockBasedTableConfig;
import org.rocksdb.Checkpoint;
import org.rocksdb.CompressionType;
import org.rocksdb.LRUCache;
import org.rocksdb.Options;
import org.rocksdb.ReadOptions;
import org.rocksdb.RocksDB;
import org.rocksdb.RocksDBException;
import org.rocksdb.RocksIterator;
import org.rocksdb.WriteBatch;
import org.rocksdb.WriteOptions;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The local spill store of one version of a partition (or of a write store's overlay) that
 * did not fit the executor's cache ({@link StateBudget}): a RocksDB instance (Spark's own
 * {@code rocksdbjni}) in a directory of its own under Spark's local dir, without a WAL (the
 * ring is the durable copy; this is a cache that overflowed to disk), deleted when the
 * version is no longer reachable.
 *
 * <p>Layout, one key space: {@code 0x00 key} holds {@code tag value} ({@code tag} 0 a row,
 * 1 an overlay's tombstone); with a prefix key encoding, {@code 0x01 len(prefix) prefix key}
 * (empty value) indexes keys by prefix for {@code prefixScan}. Rows come back as
 * {@link UnsafeRow}s pointing into the bytes RocksDB returns (no second copy).
 *
 * <p>The native side (memtable, block cache) is off the heap and bounded: one block cache of
 * 32 MiB for the JVM, memtables of 8 MiB, at most two per instance.
 */
final class SpillStore {
  private static final Logger LOG = LoggerFactory.getLogger(SpillStore.class);
  private static final Cleaner CLEANER = Cleaner.create();
  private static final byte DATA = 0;
  private static final byte INDEX = 1;
  private static final byte ROW = 0;
  private static final byte TOMB = 1;
  private static final AtomicLong SEQ = new AtomicLong();
  /** Every open instance's directory, deleted at exit if still there. */
  private static final Set<Path> OPEN = ConcurrentHashMap.newKeySet();
  private static volatile LRUCache blockCache;
  /** Point reads of rows made on the JVM's spill stores (tests). */
  static final java.util.concurrent.atomic.LongAdder READS =
      new java.util.concurrent.atomic.LongAdder();

  static {
    RocksDB.loadLibrary();
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      for (Path p : OPEN) {
        deleteTree(p);
      }
    }, "statestore-spill-cleanup"));
  }

  /** Delete {@code dir} at JVM exit if it is still there ({@link #forget} when it is gone). */
  static void deleteAtExit(Path dir) {
    OPEN.add(dir);
  }

  static void forget(Path dir) {
    OPEN.remove(dir);
  }

  /** What the cleaner closes: never a reference back to the store. */
  private static final class Native implements Runnable {
    final Path dir;
    final Options options;
    final WriteOptions write;
    final RocksDB db;
    final Set<RocksIterator> iterators = ConcurrentHashMap.newKeySet();
    volatile boolean closed;

    Native(Path dir, Options options, WriteOptions write, RocksDB db) {
      this.dir = dir;
      this.options = options;
      this.write = write;
      this.db = db;
    }

    @Override
    public synchronized void run() {
      if (closed) {
        return;
      }
      closed = true;
      for (RocksIterator it : iterators) {
        it.close();
      }
      iterators.clear();
      db.close();
      write.close();
      options.close();
      deleteTree(dir);
      OPEN.remove(dir);
    }
  }

  private final Native nat;
  private final Cleaner.Cleanable cleanable;
  private final int keyFields;
  private final int valueFields;

  private SpillStore(Path dir, int keyFields, int valueFields) throws RocksDBException {
    Options options = options();
    RocksDB db = RocksDB.open(options, dir.toString());
    WriteOptions write = new WriteOptions().setDisableWAL(true);
    this.nat = new Native(dir, options, write, db);
    OPEN.add(dir);
    this.cleanable = CLEANER.register(this, nat);
    this.keyFields = keyFields;
    this.valueFields = valueFields;
  }

  private static synchronized LRUCache cache() {
    if (blockCache == null) {
      blockCache = new LRUCache(32L << 20);
    }
    return blockCache;
  }

  private static Options options() {
    BlockBasedTableConfig table = new BlockBasedTableConfig()
        .setBlockCache(cache())
        .setBlockSize(16 << 10)
        .setFilterPolicy(new org.rocksdb.BloomFilter(10, false));
    return new Options()
        .setCreateIfMissing(true)
        .setWriteBufferSize(8L << 20)
        .setMaxWriteBufferNumber(2)
        .setCompressionType(CompressionType.LZ4_COMPRESSION)
        .setMaxOpenFiles(256)
        .setTableFormatConfig(table);
  }

  /** A new directory's path under Spark's local dir (else {@code java.io.tmpdir}). */
  private static Path newDir() throws IOException {
    return newDir("statestore-spill");
  }

  /**
   * A new directory's path under {@code kind} in Spark's local dir (else {@code
   * java.io.tmpdir}), its parent made.
   */
  static Path newDir(String kind) throws IOException {
    String root = null;
    try {
      SparkEnv env = SparkEnv.get();
      if (env != null) {
        root = org.apache.spark.util.Utils.getLocalDir(env.conf());
      }
    } catch (RuntimeException e) {
      root = null;
    }
    if (root == null) {
      root = System.getProperty("java.io.tmpdir");
    }
    Path dir = Paths.get(root, kind,
        ProcessHandle.current().pid() + "-" + SEQ.incrementAndGet());
    Files.createDirectories(dir.getParent());
    return dir;
  }

  static SpillStore create(int keyFields, int valueFields) {
    try {
      Path dir = newDir();
      SpillStore s = new SpillStore(dir, keyFields, valueFields);
      LOG.info("spilling state to {}", dir);
      return s;
    } catch (IOException | RocksDBException e) {
      throw new IllegalStateException(
          "RingStateStoreProvider: cannot open a local spill store: " + e.getMessage(), e);
    }
  }

  /** An independent copy (a RocksDB checkpoint: hard links, then its own instance). */
  SpillStore copy() {
    try {
      Path dir = newDir();
      try (Checkpoint cp = Checkpoint.create(nat.db)) {
        cp.createCheckpoint(dir.toString());
      }
      return new SpillStore(dir, keyFields, valueFields);
    } catch (IOException | RocksDBException e) {
      throw new IllegalStateException(
          "RingStateStoreProvider: cannot copy a local spill store: " + e.getMessage(), e);
    }
  }

  /** Close and delete now (the store is unreachable to every reader). */
  void close() {
    cleanable.clean();
  }

  /** Bytes of the instance's files on disk (SST files, after compression). */
  long diskBytes() {
    try {
      return nat.closed ? 0 : nat.db.getLongProperty("rocksdb.total-sst-files-size")
          + nat.db.getLongProperty("rocksdb.cur-size-all-mem-tables");
    } catch (RocksDBException e) {
      return 0;
    }
  }

  private static byte[] dataKey(UnsafeRow key) {
    int n = key.getSizeInBytes();
    byte[] out = new byte[n + 1];
    out[0] = DATA;
    Platform.copyMemory(key.getBaseObject(), key.getBaseOffset(), out,
        Platform.BYTE_ARRAY_OFFSET + 1, n);
    return out;
  }

  private static byte[] indexPrefix(UnsafeRow prefix, int extra) {
    int n = prefix.getSizeInBytes();
    byte[] out = new byte[5 + n + extra];
    out[0] = INDEX;
    out[1] = (byte) (n >>> 24);
    out[2] = (byte) (n >>> 16);
    out[3] = (byte) (n >>> 8);
    out[4] = (byte) n;
    Platform.copyMemory(prefix.getBaseObject(), prefix.getBaseOffset(), out,
        Platform.BYTE_ARRAY_OFFSET + 5, n);
    return out;
  }

  private static byte[] indexKey(UnsafeRow prefix, UnsafeRow key) {
    int n = key.getSizeInBytes();
    byte[] out = indexPrefix(prefix, n);
    Platform.copyMemory(key.getBaseObject(), key.getBaseOffset(), out,
        Platform.BYTE_ARRAY_OFFSET + out.length - n, n);
    return out;
  }

  private static byte[] valueBytes(UnsafeRow value) {
    if (value == StateData.TOMBSTONE) {
      return new byte[] {TOMB};
    }
    int n = value.getSizeInBytes();
    byte[] out = new byte[n + 1];
    out[0] = ROW;
    Platform.copyMemory(value.getBaseObject(), value.getBaseOffset(), out,
        Platform.BYTE_ARRAY_OFFSET + 1, n);
    return out;
  }

  private UnsafeRow valueRow(byte[] stored) {
    if (stored[0] == TOMB) {
      return StateData.TOMBSTONE;
    }
    UnsafeRow v = new UnsafeRow(valueFields);
    v.pointTo(stored, Platform.BYTE_ARRAY_OFFSET + 1, stored.length - 1);
    return v;
  }

  private UnsafeRow keyRow(byte[] stored, int from) {
    UnsafeRow k = new UnsafeRow(keyFields);
    k.pointTo(stored, Platform.BYTE_ARRAY_OFFSET + from, stored.length - from);
    return k;
  }

  private static IllegalStateException failed(String what, RocksDBException e) {
    return new IllegalStateException(
        "RingStateStoreProvider: local spill store " + what + " failed: " + e.getMessage(), e);
  }

  /** The value (or {@link StateData#TOMBSTONE}) under {@code key}, else null. */
  UnsafeRow get(UnsafeRow key) {
    live();
    try {
      READS.increment();
      byte[] v = nat.db.get(dataKey(key));
      return v == null ? null : valueRow(v);
    } catch (RocksDBException e) {
      throw failed("get", e);
    }
  }

  boolean containsKey(UnsafeRow key) {
    return get(key) != null;
  }

  /**
   * Put; {@code prefixer} (null without an index) gives a new key's prefix to index it under.
   * Returns the old value.
   */
  UnsafeRow put(UnsafeRow key, UnsafeRow value, Function<UnsafeRow, UnsafeRow> prefixer) {
    try {
      live();
      byte[] k = dataKey(key);
      READS.increment();
      byte[] old = nat.db.get(k);
      nat.db.put(nat.write, k, valueBytes(value));
      if (old == null && prefixer != null) {
        nat.db.put(nat.write, indexKey(prefixer.apply(key), key), new byte[0]);
      }
      return old == null ? null : valueRow(old);
    } catch (RocksDBException e) {
      throw failed("put", e);
    }
  }

  /**
   * Put, for a caller that knows whether {@code key} is held ({@code fresh}: not, so it is
   * indexed under its prefix) and needs no old value back: one write, no read.
   */
  void putOver(UnsafeRow key, UnsafeRow value, boolean fresh,
      Function<UnsafeRow, UnsafeRow> prefixer) {
    try {
      live();
      byte[] k = dataKey(key);
      nat.db.put(nat.write, k, valueBytes(value));
      if (fresh && prefixer != null) {
        nat.db.put(nat.write, indexKey(prefixer.apply(key), key), new byte[0]);
      }
    } catch (RocksDBException e) {
      throw failed("put", e);
    }
  }

  /** Bytes of rows a {@link #writeAll} batch holds before it is written. */
  private static final long BATCH_BYTES = 4L << 20;

  /**
   * Put every row (a {@link StateData#TOMBSTONE} value removes its key), in write batches,
   * without reading what each replaces: for a version taking a committed overlay, whose store
   * counted its keys and bytes already. A prefix index entry is put again for a key already
   * held (the same empty value).
   */
  void writeAll(Iterator<Map.Entry<UnsafeRow, UnsafeRow>> rows,
      Function<UnsafeRow, UnsafeRow> prefixer) {
    write(rows, prefixer, false);
  }

  /**
   * Put every row as it is, a {@link StateData#TOMBSTONE} value kept as an overlay's
   * tombstone, in write batches and without reading what each replaces: for a store that
   * holds none of their keys yet (a version or an overlay moving here from the heap).
   */
  void load(Iterator<Map.Entry<UnsafeRow, UnsafeRow>> rows,
      Function<UnsafeRow, UnsafeRow> prefixer) {
    write(rows, prefixer, true);
  }

  /** {@link #writeAll} ({@code keepTombstones} false) and {@link #load} (true). */
  private void write(Iterator<Map.Entry<UnsafeRow, UnsafeRow>> rows,
      Function<UnsafeRow, UnsafeRow> prefixer, boolean keepTombstones) {
    try (WriteBatch batch = new WriteBatch()) {
      live();
      while (rows.hasNext()) {
        Map.Entry<UnsafeRow, UnsafeRow> e = rows.next();
        UnsafeRow key = e.getKey();
        byte[] k = dataKey(key);
        if (e.getValue() == StateData.TOMBSTONE && !keepTombstones) {
          batch.delete(k);
          if (prefixer != null) {
            batch.delete(indexKey(prefixer.apply(key), key));
          }
        } else {
          batch.put(k, valueBytes(e.getValue()));
          if (prefixer != null) {
            batch.put(indexKey(prefixer.apply(key), key), new byte[0]);
          }
        }
        if (batch.getDataSize() >= BATCH_BYTES) {
          nat.db.write(nat.write, batch);
          batch.clear();
        }
      }
      if (batch.count() > 0) {
        nat.db.write(nat.write, batch);
      }
    } catch (RocksDBException e) {
      throw failed(keepTombstones ? "load" : "write", e);
    }
  }

  /** Remove; returns the old value (null when absent). */
  UnsafeRow remove(UnsafeRow key, Function<UnsafeRow, UnsafeRow> prefixer) {
    try {
      live();
      byte[] k = dataKey(key);
      READS.increment();
      byte[] old = nat.db.get(k);
      if (old == null) {
        return null;
      }
      nat.db.delete(nat.write, k);
      if (prefixer != null) {
        nat.db.delete(nat.write, indexKey(prefixer.apply(key), key));
      }
      return valueRow(old);
    } catch (RocksDBException e) {
      throw failed("remove", e);
    }
  }

  private void live() {
    if (nat.closed) {
      throw new IllegalStateException("RingStateStoreProvider: a spilled version was used "
          + "after it was dropped");
    }
  }

  /** Iterators open on it (each pins what it reads until closed). */
  int openIterators() {
    return nat.iterators.size();
  }

  private RocksIterator openIterator() {
    synchronized (nat) {
      if (nat.closed) {
        throw new IllegalStateException("RingStateStoreProvider: a spilled version was read "
            + "after it was dropped");
      }
      RocksIterator it = nat.db.newIterator();
      nat.iterators.add(it);
      return it;
    }
  }

  private void closeIterator(RocksIterator it) {
    synchronized (nat) {
      if (nat.iterators.remove(it)) {
        it.close();
      }
    }
  }

  /** Every entry (values may be {@link StateData#TOMBSTONE}); closed when exhausted. */
  CloseableIterator<Map.Entry<UnsafeRow, UnsafeRow>> entries() {
    RocksIterator it = openIterator();
    it.seek(new byte[] {DATA});
    return new CloseableIterator<>() {
      private boolean open = true;
      /** The key under the iterator, read once (null: not read yet). */
      private byte[] key;

      @Override
      public boolean hasNext() {
        if (!open) {
          return false;
        }
        if (key != null) {
          return true;
        }
        if (it.isValid()) {
          byte[] k = it.key();
          if (k.length > 0 && k[0] == DATA) {
            key = k;
            return true;
          }
        } else {
          try {
            it.status(); // a read error is not the end of the rows
          } catch (RocksDBException e) {
            close();
            throw failed("iteration", e);
          }
        }
        close();
        return false;
      }

      @Override
      public Map.Entry<UnsafeRow, UnsafeRow> next() {
        if (!hasNext()) {
          throw new NoSuchElementException();
        }
        Map.Entry<UnsafeRow, UnsafeRow> e = new java.util.AbstractMap.SimpleImmutableEntry<>(
            keyRow(key, 1), valueRow(it.value()));
        key = null;
        it.next();
        return e;
      }

      @Override
      public void close() {
        if (open) {
          open = false;
          closeIterator(it);
        }
      }
    };
  }

  /** The keys indexed under {@code prefix}. */
  List<UnsafeRow> keysWithPrefix(UnsafeRow prefix) {
    byte[] start = indexPrefix(prefix, 0);
    List<UnsafeRow> out = new ArrayList<>();
    RocksIterator it = openIterator();
    try {
      for (it.seek(start); it.isValid(); it.next()) {
        byte[] k = it.key();
        if (!startsWith(k, start)) {
          break;
        }
        out.add(keyRow(k, start.length));
      }
    } finally {
      closeIterator(it);
    }
    return out;
  }

  private static boolean startsWith(byte[] a, byte[] p) {
    if (a.length < p.length) {
      return false;
    }
    for (int i = 0; i < p.length; i++) {
      if (a[i] != p[i]) {
        return false;
      }
    }
    return true;
  }

  /** An iterator with a close (for native resources). */
  interface CloseableIterator<T> extends Iterator<T>, AutoCloseable {
    @Override
    void close();
  }

  private static void deleteTree(Path dir) {
    if (!Files.exists(dir)) {
      return;
    }
    try (Stream<Path> walk = Files.walk(dir)) {
      walk.sorted(Comparator.reverseOrder()).map(Path::toFile).forEach(File::delete);
    } catch (IOException | RuntimeException e) {
      LOG.warn("cannot delete the spill directory {}: {}", dir, e.toString());
    }
  }
}
