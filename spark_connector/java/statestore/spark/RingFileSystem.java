package statestore.spark;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.EOFException;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.OutputStream;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSInputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.util.Progressable;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A Hadoop {@code FileSystem} for {@code ring://NAME/path}: a Spark checkpoint (offsets,
 * commits, metadata, source and sink logs, any provider's files) kept on the ring, durable at
 * W when a file is closed.
 *
 * <p>Each directory is one ring store ({@code fs-NAME/0/0/<dir>}, {@link #dirStore}), its
 * rows the directory's entries: {@code f:<name>} a file's record (length, modification time,
 * blob id, parts), {@code b:<blob>:<i>} its bytes in parts of at most {@link #PART} bytes,
 * {@code d:<name>} a subdirectory. Every change of a directory is one delta commit of its
 * store, so closing a file, deleting one and renaming one within its directory (what Spark's
 * atomic writers do: a temporary file renamed over the final name) are each atomic, and a
 * rename moves the record, not the bytes. A directory exists once its parent lists it; the
 * root always does.
 *
 * <p>One writer per directory at a time: this JVM caches each directory it reads or writes
 * and writes with its own epoch (above the store's, so an older writer is fenced). Listing, and
 * looking up a name the cache lacks, check the ring's head of the directory first (unless it
 * was checked in the last 200 ms) and reload it when another JVM wrote it since (a state partition's task that ran on another executor in
 * between); a write after another JVM's is refused by the replicas (its epoch is lower) and
 * fails instead of overwriting it. Spark writes the checkpoint's
 * logs from the driver and each state partition's files from that partition's task. The
 * cache holds every file of the directories this JVM touched: a checkpoint's live files must
 * fit in the heap of the JVMs that use them.
 */
public final class RingFileSystem extends FileSystem {
  /** Largest part of a file in one row. */
  static final int PART = 1 << 20;
  /** A directory's head asked this recently is not asked again (a load, then a listing). */
  static final long RECHECK_NANOS = 200_000_000L;
  private static final byte[] NOTHING = new byte[0];
  private static final Logger LOG = LoggerFactory.getLogger(RingFileSystem.class);
  /** A directory with more {@code ~} than this does not look for its data under the old name. */
  static final int MAX_LEGACY_TILDES = 10;
  /** The row a directory adopted from its old store writes first (not a file, not listed). */
  static final String ADOPTED = "m:adopted";

  private URI uri;
  private String fsName;
  private RingConfig config;
  private final ConcurrentHashMap<String, Dir> dirs = new ConcurrentHashMap<>();
  private Path workingDir;

  @Override
  public String getScheme() {
    return "ring";
  }

  @Override
  public void initialize(URI name, Configuration conf) throws IOException {
    super.initialize(name, conf);
    setConf(conf);
    String authority = name.getAuthority();
    if (authority == null || authority.isEmpty() || !authority.matches("[A-Za-z0-9._-]{1,64}")) {
      throw new IOException("ring:// needs a name of 1-64 letters, digits or ._- after //, "
          + "e.g. ring://checkpoints/q1 (got " + name + ")");
    }
    this.fsName = authority;
    this.uri = URI.create("ring://" + authority);
    this.config = RingConfig.from(conf, null);
    this.workingDir = new Path(uri.toString() + "/");
  }

  @Override
  public URI getUri() {
    return uri;
  }

  @Override
  public Path getWorkingDirectory() {
    return workingDir;
  }

  @Override
  public void setWorkingDirectory(Path dir) {
    workingDir = makeQualified(dir);
  }

  // -- paths -------------------------------------------------------------------------------

  /** The path inside this file system: "" for the root, else "/a/b". */
  private String key(Path p) {
    Path q = makeQualified(p);
    String s = q.toUri().getPath();
    if (s == null || s.isEmpty() || s.equals("/")) {
      return "";
    }
    return s.endsWith("/") ? s.substring(0, s.length() - 1) : s;
  }

  private static String parentOf(String key) {
    return key.substring(0, key.lastIndexOf('/'));
  }

  private static String nameOf(String key) {
    return key.substring(key.lastIndexOf('/') + 1);
  }

  private Path pathOf(String key) {
    return new Path(uri.toString() + (key.isEmpty() ? "/" : key));
  }

  /**
   * The ring store of directory {@code key} ("" the root, else "/a/b") of file system
   * {@code fsName}. A key without {@code ~} keeps the name it always had: {@code "d" + key}
   * with {@code /} as {@code ~}. A key with {@code ~} is {@code "e" + key} with {@code %} as
   * {@code %25}, {@code ~} as {@code %7E}, then {@code /} as {@code ~}: reversible, so no two
   * directories share a store (the old naming mapped {@code /a/b} and {@code /a~b} to one).
   * {@link StoreNaming#safeName} then hashes the whole name.
   */
  static String dirStore(String fsName, String key) {
    if (key.isEmpty()) {
      return storeOf(fsName, "root");
    }
    if (key.indexOf('~') < 0) {
      return storeOf(fsName, "d" + key.replace('/', '~'));
    }
    return storeOf(fsName,
        "e" + key.replace("%", "%25").replace("~", "%7E").replace('/', '~'));
  }

  /** The store the old naming gave {@code key}, when it differs from {@link #dirStore}. */
  static String legacyDirStore(String fsName, String key) {
    return key.indexOf('~') < 0 ? null : storeOf(fsName, "d" + key.replace('/', '~'));
  }

  private static String storeOf(String fsName, String dirName) {
    return StoreNaming.queryName("ring-fs#" + fsName, "fs-" + fsName) + "/0/0/"
        + StoreNaming.safeName(dirName);
  }

  /**
   * Whether the old store of {@code key} (a key with {@code ~}) held this directory's data
   * alone: the old naming gave the same store to every key that differs from it only by
   * {@code /} in place of some {@code ~}, so none of those may be a directory now.
   */
  private boolean legacyIsOnlyMine(String key) throws IOException {
    List<Integer> tildes = new ArrayList<>();
    for (int i = 0; i < key.length(); i++) {
      if (key.charAt(i) == '~') {
        tildes.add(i);
      }
    }
    if (tildes.size() > MAX_LEGACY_TILDES) {
      return false;
    }
    for (int mask = 1; mask < (1 << tildes.size()); mask++) {
      char[] v = key.toCharArray();
      for (int b = 0; b < tildes.size(); b++) {
        if ((mask & (1 << b)) != 0) {
          v[tildes.get(b)] = '/';
        }
      }
      String variant = new String(v);
      if (variant.contains("//") || variant.endsWith("/")) {
        continue; // not a path: no directory has it
      }
      if (isDir(variant)) {
        return false;
      }
    }
    return true;
  }

  // -- directories as ring stores ------------------------------------------------------------

  /** One directory: its store's rows as this JVM last read or wrote them. */
  private final class Dir {
    final String key;
    final String store;
    /** The old naming's store of this directory (null: the same as {@link #store}). */
    final String legacy;
    /** Rows read from {@link #legacy}: the first commit writes them all to {@link #store}. */
    boolean adopted;
    final TreeMap<String, byte[]> rows = new TreeMap<>();
    /** Rows of temporary files, in {@link #rows} but not on the ring (see {@link #isTemp}). */
    final Set<String> pending = new HashSet<>();
    boolean loaded;
    /** When the ring's head of this directory was last asked, and its epoch then. */
    long checkedNanos;
    long checkedEpoch;
    long version;
    long versionEpoch;
    long epoch; // this JVM's, once it writes

    Dir(String key) {
      this.key = key;
      this.store = dirStore(fsName, key);
      this.legacy = legacyDirStore(fsName, key);
    }

    void load() throws IOException {
      RingHttp.Head head = checkHead();
      if (head != null) {
        load(head);
      } else if (legacy != null) {
        adoptLegacy();
      }
    }

    /**
     * A directory never written under its own store: read what the old naming stored for it,
     * when that store was this directory's alone (no directory it collided with exists).
     */
    private void adoptLegacy() throws IOException {
      RingHttp.Head old = RingHttp.shared(config).head(legacy);
      if (old == null) {
        return;
      }
      if (!legacyIsOnlyMine(key)) {
        LOG.warn("ring://{}{}: its data under the old store name {} is shared with a directory "
            + "whose name differs only by / for ~, so it is not read; the directory starts "
            + "empty", fsName, key, legacy);
        return;
      }
      TreeMap<String, byte[]> got = new TreeMap<>();
      RingHttp.shared(config).restore(legacy, old.version, () -> {
        got.clear();
        return (k, v) -> got.put(new String(k, StandardCharsets.UTF_8), v);
      });
      rows.putAll(got);
      adopted = true;
      LOG.info("ring://{}{}: read {} rows from the old store name {}; the next change writes "
          + "them to {}", fsName, key, got.size(), legacy, store);
    }

    private RingHttp.Head checkHead() throws IOException {
      RingHttp.Head head = RingHttp.shared(config).head(store);
      checkedNanos = System.nanoTime();
      checkedEpoch = head == null ? 0 : head.epoch;
      return head;
    }

    /** The head was asked within the last {@link #RECHECK_NANOS}: asking again adds nothing. */
    private boolean checkedJustNow() {
      return checkedNanos != 0 && System.nanoTime() - checkedNanos < RECHECK_NANOS;
    }

    private void load(RingHttp.Head head) throws IOException {
      TreeMap<String, byte[]> got = new TreeMap<>();
      RingHttp.Restored r = RingHttp.shared(config).restore(store, head.version, () -> {
        got.clear();
        return (k, v) -> got.put(new String(k, StandardCharsets.UTF_8), v);
      });
      Map<String, byte[]> kept = new HashMap<>();
      for (String k : pending) {
        kept.put(k, rows.get(k));
      }
      rows.clear();
      rows.putAll(got);
      rows.putAll(kept);
      version = r.version;
      versionEpoch = r.writerEpoch > 0 ? r.writerEpoch : head.epoch;
      adopted = false; // the directory's own store was written: its rows are the truth
    }

    /**
     * Catch up with the ring when another JVM wrote this directory since this one read it (a
     * task that ran elsewhere in between): reload, and write above that writer's epoch.
     */
    void fresh() throws IOException {
      if (checkedJustNow()) {
        return;
      }
      RingHttp.Head head = checkHead();
      if (head != null && (head.version != version || head.epoch != versionEpoch)) {
        load(head);
        epoch = 0;
      }
    }

    /** One atomic change of this directory: the puts and deletes, as the next version. */
    void commit(Map<String, byte[]> puts, List<String> deletes) throws IOException {
      List<String> ringDeletes = new ArrayList<>();
      for (String d : deletes) {
        if (!pending.contains(d)) {
          ringDeletes.add(d);
        }
      }
      if (adopted) {
        // the first write of a directory read from its old store: a snapshot of every row
        Map<String, byte[]> all = new HashMap<>();
        for (Map.Entry<String, byte[]> e : rows.entrySet()) {
          if (!pending.contains(e.getKey()) && !deletes.contains(e.getKey())) {
            all.put(e.getKey(), e.getValue());
          }
        }
        all.putAll(puts);
        all.put(ADOPTED, NOTHING);
        puts = all;
      }
      if (puts.isEmpty() && ringDeletes.isEmpty()) { // only temporary rows go: nothing to send
        for (String d : deletes) {
          rows.remove(d);
          pending.remove(d);
        }
        return;
      }
      if (epoch == 0) {
        // this JVM's first write here: above every epoch the store has seen, so the replicas
        // refuse (stale_epoch) any later write of an earlier writer of this directory
        if (!checkedJustNow()) {
          RingHttp.Head head = checkHead();
          if (head != null && (head.version != version || head.epoch != versionEpoch)) {
            load(head);
          }
        }
        epoch = Math.max(versionEpoch, checkedEpoch) + 1;
      }
      long next = version + 1;
      boolean snapshot = next == 1;
      List<byte[]> keys = new ArrayList<>();
      List<byte[]> values = new ArrayList<>();
      List<byte[]> dels = new ArrayList<>();
      for (Map.Entry<String, byte[]> e : puts.entrySet()) {
        keys.add(e.getKey().getBytes(StandardCharsets.UTF_8));
        values.add(e.getValue());
      }
      if (!snapshot) {
        for (String d : ringDeletes) {
          dels.add(d.getBytes(StandardCharsets.UTF_8));
        }
      }
      try {
        RingDirect.shared(config).commit(store, next, epoch, next == 1 ? null : versionEpoch,
            snapshot, Map.of(), 0, keys, values, dels);
      } catch (RingErrors.RingError e) {
        if (!"stale_epoch".equals(e.code)) {
          throw e;
        }
        checkedNanos = 0; // ask the ring now, whenever it was asked last
        fresh();
        epoch = 0;
        throw new IOException("ring://" + fsName + ": another writer changed directory " + store
            + " since this JVM read it (its writes are fenced now): the change was not made", e);
      }
      for (String d : deletes) {
        rows.remove(d);
        pending.remove(d);
      }
      rows.putAll(puts);
      pending.removeAll(puts.keySet());
      version = next;
      versionEpoch = epoch;
      adopted = false;
    }

    /** A temporary file's rows: kept here only, until a rename commits them. */
    void holdPending(Map<String, byte[]> puts, List<String> deletes) {
      for (String d : deletes) {
        rows.remove(d);
        pending.remove(d);
      }
      rows.putAll(puts);
      pending.addAll(puts.keySet());
    }
  }

  /** The directory, read from the ring on first use (directories load in parallel). */
  private Dir dir(String key) throws IOException {
    Dir d = dirs.computeIfAbsent(key, Dir::new);
    synchronized (d) {
      if (!d.loaded) {
        d.load();
        d.loaded = true;
      }
    }
    return d;
  }

  /** A file's record: length, modification time, blob id and parts count. */
  private record Entry(long length, long mtime, String blob, int parts) {
    byte[] encode() {
      try {
        ByteArrayOutputStream b = new ByteArrayOutputStream();
        DataOutputStream out = new DataOutputStream(b);
        out.writeLong(length);
        out.writeLong(mtime);
        out.writeUTF(blob);
        out.writeInt(parts);
        return b.toByteArray();
      } catch (IOException e) {
        throw new IllegalStateException(e);
      }
    }

    static Entry decode(byte[] raw) throws IOException {
      DataInputStream in = new DataInputStream(new ByteArrayInputStream(raw));
      return new Entry(in.readLong(), in.readLong(), in.readUTF(), in.readInt());
    }

    List<String> partKeys() {
      List<String> out = new ArrayList<>();
      for (int i = 0; i < parts; i++) {
        out.add("b:" + blob + ":" + i);
      }
      return out;
    }
  }

  private boolean isDir(String key) throws IOException {
    if (key.isEmpty()) {
      return true;
    }
    Dir parent = dir(parentOf(key));
    synchronized (parent) {
      if (!parent.rows.containsKey("d:" + nameOf(key))) {
        parent.fresh(); // made by another JVM since?
      }
      return parent.rows.containsKey("d:" + nameOf(key));
    }
  }

  private Entry file(String key) throws IOException {
    if (key.isEmpty()) {
      return null;
    }
    Dir parent = dir(parentOf(key));
    synchronized (parent) {
      byte[] raw = parent.rows.get("f:" + nameOf(key));
      if (raw == null) {
        parent.fresh(); // written by another JVM since?
        raw = parent.rows.get("f:" + nameOf(key));
      }
      return raw == null ? null : Entry.decode(raw);
    }
  }

  // -- FileSystem ------------------------------------------------------------------------------

  @Override
  public FileStatus getFileStatus(Path p) throws IOException {
    String key = key(p);
    Entry e = file(key);
    if (e != null) {
      return new FileStatus(e.length(), false, 1, PART, e.mtime(), pathOf(key));
    }
    if (isDir(key)) {
      return new FileStatus(0, true, 1, 0, 0, pathOf(key));
    }
    throw new FileNotFoundException(p + " does not exist");
  }

  @Override
  public boolean mkdirs(Path p, FsPermission permission) throws IOException {
    String key = key(p);
    if (key.isEmpty()) {
      return true;
    }
    if (file(key) != null) {
      throw new FileAlreadyExistsException(p + " is a file");
    }
    if (isDir(key)) {
      return true;
    }
    mkdirs(pathOf(parentOf(key)), permission);
    Dir parent = dir(parentOf(key));
    synchronized (parent) {
      if (!parent.rows.containsKey("d:" + nameOf(key))) {
        parent.commit(Map.of("d:" + nameOf(key), NOTHING), List.of());
      }
    }
    return true;
  }

  @Override
  public FileStatus[] listStatus(Path p) throws IOException {
    String key = key(p);
    if (file(key) != null) {
      return new FileStatus[] {getFileStatus(p)};
    }
    if (!isDir(key)) {
      throw new FileNotFoundException(p + " does not exist");
    }
    Dir d = dir(key);
    List<FileStatus> out = new ArrayList<>();
    synchronized (d) {
      d.fresh();
      for (Map.Entry<String, byte[]> e : d.rows.entrySet()) {
        String k = e.getKey();
        String child = key + "/" + k.substring(2);
        if (k.startsWith("f:")) {
          Entry f = Entry.decode(e.getValue());
          out.add(new FileStatus(f.length(), false, 1, PART, f.mtime(), pathOf(child)));
        } else if (k.startsWith("d:")) {
          out.add(new FileStatus(0, true, 1, 0, 0, pathOf(child)));
        }
      }
    }
    return out.toArray(new FileStatus[0]);
  }

  @Override
  public FSDataInputStream open(Path p, int bufferSize) throws IOException {
    String key = key(p);
    Dir parent = dir(parentOf(key));
    byte[] data;
    synchronized (parent) {
      byte[] raw = parent.rows.get("f:" + nameOf(key));
      if (raw == null) {
        parent.fresh(); // written by another JVM since?
        raw = parent.rows.get("f:" + nameOf(key));
      }
      if (raw == null) {
        throw new FileNotFoundException(p + " does not exist");
      }
      Entry e = Entry.decode(raw);
      data = new byte[(int) e.length()];
      int at = 0;
      for (String part : e.partKeys()) {
        byte[] b = parent.rows.get(part);
        if (b == null) {
          throw new IOException(p + ": part " + part + " is missing from " + parent.store);
        }
        System.arraycopy(b, 0, data, at, b.length);
        at += b.length;
      }
    }
    return new FSDataInputStream(new BytesInput(data));
  }

  @Override
  public FSDataOutputStream create(Path p, FsPermission permission, boolean overwrite,
      int bufferSize, short replication, long blockSize, Progressable progress)
      throws IOException {
    String key = key(p);
    if (key.isEmpty() || isDir(key)) {
      throw new FileAlreadyExistsException(p + " is a directory");
    }
    if (!overwrite && file(key) != null) {
      throw new FileAlreadyExistsException(p + " already exists");
    }
    mkdirs(pathOf(parentOf(key)), FsPermission.getDirDefault());
    OutputStream sink = new ByteArrayOutputStream() {
      private boolean closed;

      @Override
      public void close() throws IOException {
        if (!closed) {
          closed = true;
          RingFileSystem.this.write(key, toByteArray(), overwrite);
        }
      }
    };
    return new FSDataOutputStream(sink, statistics);
  }

  private void write(String key, byte[] data, boolean overwrite) throws IOException {
    Dir parent = dir(parentOf(key));
    synchronized (parent) {
      String name = "f:" + nameOf(key);
      byte[] old = parent.rows.get(name);
      if (old != null && !overwrite) {
        throw new FileAlreadyExistsException(pathOf(key) + " already exists");
      }
      String blob = UUID.randomUUID().toString().replace("-", "");
      int parts = (data.length + PART - 1) / PART;
      Entry e = new Entry(data.length, System.currentTimeMillis(), blob, parts);
      Map<String, byte[]> puts = new HashMap<>();
      puts.put(name, e.encode());
      for (int i = 0; i < parts; i++) {
        puts.put("b:" + blob + ":" + i,
            Arrays.copyOfRange(data, i * PART, Math.min(data.length, (i + 1) * PART)));
      }
      List<String> deletes = old == null ? List.of() : Entry.decode(old).partKeys();
      if (isTemp(nameOf(key)) && (old == null || parent.pending.contains(name))) {
        parent.holdPending(puts, deletes);
      } else {
        parent.commit(puts, deletes);
      }
    }
  }

  /**
   * Spark's atomic writers' temporary files ({@code .<name>.<uuid>.tmp}, renamed over the
   * final name when complete): held in this JVM only, and sent to the ring by the rename, in
   * the same commit that names the final file. One commit per file instead of two; a
   * temporary file is not durable (and no other JVM sees it), which Spark never needs.
   */
  static boolean isTemp(String name) {
    return name.startsWith(".") && name.endsWith(".tmp");
  }

  @Override
  public FSDataOutputStream append(Path p, int bufferSize, Progressable progress)
      throws IOException {
    throw new IOException("ring:// does not append to files (" + p + ")");
  }

  @Override
  public boolean rename(Path src, Path dst) throws IOException {
    String from = key(src);
    String to = key(dst);
    if (from.isEmpty() || to.isEmpty() || from.equals(to)) {
      return false;
    }
    Entry e = file(from);
    if (e == null) {
      return false; // a directory, or nothing: Spark renames files only
    }
    if (isDir(to)) {
      to = to + "/" + nameOf(from);
    }
    if (file(to) != null || isDir(to) || !isDir(parentOf(to))) {
      return false;
    }
    Dir source = dir(parentOf(from));
    if (parentOf(from).equals(parentOf(to))) {
      synchronized (source) {
        // one commit: the record moves, the bytes stay (a temporary file's go now)
        Map<String, byte[]> puts = new HashMap<>();
        puts.put("f:" + nameOf(to), e.encode());
        for (String part : e.partKeys()) {
          if (source.pending.contains(part)) {
            puts.put(part, source.rows.get(part));
          }
        }
        source.commit(puts, List.of("f:" + nameOf(from)));
      }
      return true;
    }
    Dir target = dir(parentOf(to));
    Map<String, byte[]> puts = new HashMap<>();
    synchronized (source) {
      puts.put("f:" + nameOf(to), e.encode());
      for (String part : e.partKeys()) {
        puts.put(part, source.rows.get(part));
      }
    }
    synchronized (target) {
      target.commit(puts, List.of());
    }
    List<String> gone = new ArrayList<>(e.partKeys());
    gone.add("f:" + nameOf(from));
    synchronized (source) {
      source.commit(Map.of(), gone);
    }
    return true;
  }

  @Override
  public boolean delete(Path p, boolean recursive) throws IOException {
    String key = key(p);
    if (key.isEmpty()) {
      throw new IOException("ring:// does not delete its root");
    }
    Entry e = file(key);
    Dir parent = dir(parentOf(key));
    if (e != null) {
      List<String> gone = new ArrayList<>(e.partKeys());
      gone.add("f:" + nameOf(key));
      synchronized (parent) {
        parent.commit(Map.of(), gone);
      }
      return true;
    }
    if (!isDir(key)) {
      return false;
    }
    FileStatus[] children = listStatus(p);
    if (children.length > 0 && !recursive) {
      throw new IOException(p + " is a directory that is not empty");
    }
    for (FileStatus child : children) {
      delete(child.getPath(), true);
    }
    synchronized (parent) {
      parent.commit(Map.of(), List.of("d:" + nameOf(key)));
    }
    return true;
  }

  /** A file's bytes, seekable. */
  private static final class BytesInput extends FSInputStream {
    private final byte[] data;
    private int pos;

    BytesInput(byte[] data) {
      this.data = data;
    }

    @Override
    public void seek(long to) throws IOException {
      if (to < 0 || to > data.length) {
        throw new EOFException("seek to " + to + " outside 0.." + data.length);
      }
      pos = (int) to;
    }

    @Override
    public long getPos() {
      return pos;
    }

    @Override
    public boolean seekToNewSource(long targetPos) {
      return false;
    }

    @Override
    public int read() {
      return pos < data.length ? data[pos++] & 0xff : -1;
    }

    @Override
    public int read(byte[] b, int off, int len) {
      if (len == 0) {
        return 0;
      }
      if (pos >= data.length) {
        return -1;
      }
      int n = Math.min(len, data.length - pos);
      System.arraycopy(data, pos, b, off, n);
      pos += n;
      return n;
    }

    @Override
    public int available() {
      return data.length - pos;
    }
  }
}
