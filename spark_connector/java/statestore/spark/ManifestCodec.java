package statestore.spark;

import java.math.BigInteger;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.regex.Pattern;

/**
 * Manifests (schema 1) as {@code statestore/wire/manifest.py} encodes them, byte for byte: a
 * msgpack map, in this key order, {@code schema, store, version, kind, epoch, key_groups,
 * chunks, positions}, then {@code base_epoch} only when the manifest names one (the epoch of
 * the version - 1 its writer built on, core/manifest.py "Lineage": an optional last key, so a
 * manifest without it is byte for byte what schema 1 always was); each chunk an array
 * {@code [name, lo, hi, size, raw_size, rows, checksum]} (checksum as an unsigned integer);
 * positions a JSON-like map in its own order. Decoding validates as Python does (a manifest
 * that does not decode is a {@link MalformedException}).
 */
public final class ManifestCodec {
  private ManifestCodec() {}

  public static final int SCHEMA = 1;
  public static final long MAX_VERSION = 1L << 62;
  /** Python's MAX_EPOCH (statestore/core/ids.py): what a Java long holds. */
  public static final long MAX_EPOCH = Long.MAX_VALUE;
  private static final Pattern NAME = Pattern.compile("^[A-Za-z0-9._-]{1,128}$");

  /** A manifest (or chain) that does not decode or does not validate. */
  public static final class MalformedException extends RuntimeException {
    MalformedException(String message) {
      super(message);
    }

    MalformedException(String message, Throwable cause) {
      super(message, cause);
    }
  }

  /** Where one chunk of a version lives and how to check it (Python's ChunkRef). */
  public record ChunkRef(String name, int lo, int hi, long size, long rawSize, long rows, long checksum,
      long indexLen, long indexChecksum) {
    /** A whole (format 1) chunk: no index. */
    public ChunkRef(String name, int lo, int hi, long size, long rawSize, long rows, long checksum) {
      this(name, lo, hi, size, rawSize, rows, checksum, 0, 0);
    }

    public static ChunkRef of(ChunkCodec.Chunk c) {
      return new ChunkRef(c.name(), c.lo(), c.hi(), c.data().length, c.rawSize(), c.rows(), c.checksum(),
          c.indexLen(), c.indexChecksum());
    }

    /** Whether it is a blocked chunk whose index the manifest names. */
    public boolean blocked() {
      return indexLen > 0;
    }
  }

  /**
   * One commit of a store. {@code store} is the path form {@code query/operator/partition/name};
   * {@code kind} is {@code "delta"} or {@code "snapshot"}; {@code positions} a JSON-like map
   * (String keys; values null, Boolean, integers, Double, String, List, Map), encoded in its
   * iteration order; {@code baseEpoch} the epoch of version - 1 the writer built on, or
   * {@code null} when it names none (then a chain takes the highest epoch there).
   */
  public record Manifest(
      String store,
      long version,
      String kind,
      long epoch,
      int keyGroups,
      List<ChunkRef> chunks,
      Map<String, Object> positions,
      Long baseEpoch) {
    public Manifest {
      chunks = List.copyOf(chunks);
      positions = positions == null
          ? Collections.emptyMap()
          : Collections.unmodifiableMap(new LinkedHashMap<>(positions));
      if (baseEpoch != null && baseEpoch < 0) {
        throw new IllegalArgumentException("base epoch " + baseEpoch + " is negative");
      }
    }

    /** A manifest that names no base epoch. */
    public Manifest(String store, long version, String kind, long epoch, int keyGroups,
        List<ChunkRef> chunks, Map<String, Object> positions) {
      this(store, version, kind, epoch, keyGroups, chunks, positions, null);
    }

    public boolean isSnapshot() {
      return "snapshot".equals(kind);
    }

    /** The version this one applies on top of (0 = empty state); -1 for a snapshot. */
    public long base() {
      return "delta".equals(kind) ? version - 1 : -1;
    }

    /** The compressed bytes of all its chunks. */
    public long bytes() {
      long n = 0;
      for (ChunkRef c : chunks) {
        n += c.size();
      }
      return n;
    }
  }

  /** The manifest of a commit laid out in {@code chunks}, naming no base epoch. */
  public static Manifest of(
      String store,
      long version,
      boolean snapshot,
      long epoch,
      int keyGroups,
      List<ChunkCodec.Chunk> chunks,
      Map<String, Object> positions) {
    return of(store, version, snapshot, epoch, keyGroups, chunks, positions, null);
  }

  /**
   * The manifest of a commit laid out in {@code chunks} (what Python's build_commit makes):
   * {@code baseEpoch} is the epoch of version - 1 the writer restored or committed
   * ({@code null}: not known); version 1 applies to the empty state and names none.
   */
  public static Manifest of(
      String store,
      long version,
      boolean snapshot,
      long epoch,
      int keyGroups,
      List<ChunkCodec.Chunk> chunks,
      Map<String, Object> positions,
      Long baseEpoch) {
    List<ChunkRef> refs = new ArrayList<>(chunks.size());
    for (ChunkCodec.Chunk c : chunks) {
      refs.add(ChunkRef.of(c));
    }
    return new Manifest(store, version, snapshot ? "snapshot" : "delta", epoch, keyGroups, refs,
        positions, version == 1 ? null : baseEpoch);
  }

  /** The store path {@code query/operator/partition/name}, validated as Python's StoreId. */
  public static String storePath(String query, int operator, int partition, String name) {
    checkName("query", query);
    checkName("name", name);
    if (operator < 0 || partition < 0) {
      throw new IllegalArgumentException("store operator and partition must be non-negative");
    }
    return query + "/" + operator + "/" + partition + "/" + name;
  }

  private static void checkName(String field, String value) {
    if (value == null || !NAME.matcher(value).matches() || value.equals(".") || value.equals("..")) {
      throw new IllegalArgumentException("store " + field + " " + value
          + " must be 1-128 letters, digits, '.', '_' or '-' (and not '.' or '..' alone)");
    }
  }

  public static byte[] encode(Manifest m) {
    Msgpack.Writer w = new Msgpack.Writer(128 + 64 * m.chunks().size());
    write(w, m);
    return w.toByteArray();
  }

  public static byte[] encodeChain(List<Manifest> chain) {
    Msgpack.Writer w = new Msgpack.Writer(256 * Math.max(1, chain.size()));
    w.arrayHeader(chain.size());
    for (Manifest m : chain) {
      write(w, m);
    }
    return w.toByteArray();
  }

  private static void write(Msgpack.Writer w, Manifest m) {
    w.mapHeader(m.baseEpoch() == null ? 8 : 9);
    w.str("schema").integer(SCHEMA);
    w.str("store").str(m.store());
    w.str("version").integer(m.version());
    w.str("kind").str(m.kind());
    w.str("epoch").integer(m.epoch());
    w.str("key_groups").integer(m.keyGroups());
    w.str("chunks").arrayHeader(m.chunks().size());
    for (ChunkRef c : m.chunks()) {
      w.arrayHeader(c.blocked() ? 9 : 7);
      w.str(c.name());
      w.integer(c.lo());
      w.integer(c.hi());
      w.integer(c.size());
      w.integer(c.rawSize());
      w.integer(c.rows());
      w.unsigned(c.checksum());
      if (c.blocked()) {
        w.integer(c.indexLen());
        w.unsigned(c.indexChecksum());
      }
    }
    w.str("positions").value(m.positions());
    if (m.baseEpoch() != null) {
      w.str("base_epoch").integer(m.baseEpoch());
    }
  }

  public static Manifest decode(byte[] data) {
    Object obj;
    try {
      Msgpack.Reader r = new Msgpack.Reader(data, 0, data.length, false);
      obj = r.value();
      if (!r.atEnd()) {
        throw new Msgpack.FormatException("extra data after the manifest");
      }
    } catch (Msgpack.FormatException | IndexOutOfBoundsException e) {
      throw new MalformedException("manifest is not valid msgpack (" + e.getMessage() + ")", e);
    }
    return fromObject(obj);
  }

  public static List<Manifest> decodeChain(byte[] data) {
    Object obj;
    try {
      Msgpack.Reader r = new Msgpack.Reader(data, 0, data.length, false);
      obj = r.value();
      if (!r.atEnd()) {
        throw new Msgpack.FormatException("extra data after the chain");
      }
    } catch (Msgpack.FormatException | IndexOutOfBoundsException e) {
      throw new MalformedException("chain is not valid msgpack (" + e.getMessage() + ")", e);
    }
    if (!(obj instanceof List<?> list)) {
      throw new MalformedException("chain is not a list of manifests");
    }
    List<Manifest> out = new ArrayList<>(list.size());
    for (Object o : list) {
      out.add(fromObject(o));
    }
    return out;
  }

  /** A uint64 (a checksum): past Long.MAX_VALUE it keeps its bits. */
  private static long unsigned(Object o, String what) {
    if (o instanceof BigInteger bi) {
      return bi.longValue();
    }
    return integer(o, what);
  }

  private static long integer(Object o, String what) {
    if (o instanceof Long l) {
      return l;
    }
    throw new MalformedException("manifest " + what + " " + o + " is not an integer");
  }

  @SuppressWarnings("unchecked")
  private static Manifest fromObject(Object obj) {
    if (!(obj instanceof Map<?, ?> map)) {
      throw new MalformedException("manifest is not a map");
    }
    Object schema = map.get("schema");
    if (!(schema instanceof Long s) || s != SCHEMA) {
      throw new MalformedException("manifest schema " + schema + " is not supported (this reader speaks "
          + SCHEMA + "): upgrade the older side");
    }
    Object kind = map.get("kind");
    if (!"delta".equals(kind) && !"snapshot".equals(kind)) {
      throw new MalformedException("manifest kind " + kind + " is not delta or snapshot");
    }
    for (String field : new String[] {"store", "version", "epoch", "key_groups", "chunks"}) {
      if (!map.containsKey(field)) {
        throw new MalformedException("manifest is malformed (no '" + field + "')");
      }
    }
    long epoch = integer(map.get("epoch"), "epoch");
    if (epoch < 0) {
      throw new MalformedException("manifest epoch " + epoch + " is not a non-negative integer");
    }
    long groups = integer(map.get("key_groups"), "key_groups");
    if (groups < 1 || groups > 65536) {
      throw new MalformedException("manifest key_groups " + groups + " is not in 1..65536");
    }
    Object positions = map.containsKey("positions") ? map.get("positions") : new LinkedHashMap<>();
    if (!(positions instanceof Map<?, ?> pos)) {
      throw new MalformedException("manifest positions must be a map");
    }
    for (Object k : pos.keySet()) {
      if (!(k instanceof String)) {
        throw new MalformedException("manifest positions keys must be strings");
      }
    }
    if (!(map.get("chunks") instanceof List<?> rawChunks)) {
      throw new MalformedException("manifest chunks must be a list");
    }
    List<ChunkRef> chunks = new ArrayList<>(rawChunks.size());
    for (Object c : rawChunks) {
      if (!(c instanceof List<?> f) || (f.size() != 7 && f.size() != 9)
          || !(f.get(0) instanceof String name)) {
        throw new MalformedException("manifest chunk " + c + " is malformed");
      }
      long lo = integer(f.get(1), "chunk lo");
      long hi = integer(f.get(2), "chunk hi");
      if (!(0 <= lo && lo <= hi && hi < groups)) {
        throw new MalformedException("manifest chunk " + c + " is malformed");
      }
      long checksum = unsigned(f.get(6), "chunk checksum");
      long size = integer(f.get(3), "chunk size");
      long indexLen = 0;
      long indexChecksum = 0;
      if (f.size() == 9) {
        indexLen = integer(f.get(7), "chunk index length");
        indexChecksum = unsigned(f.get(8), "chunk index checksum");
        if (indexLen <= 0 || indexLen > size - 5) {
          throw new MalformedException("manifest chunk " + c + " names an index outside it");
        }
      }
      chunks.add(new ChunkRef(name, (int) lo, (int) hi, size, integer(f.get(4), "chunk raw_size"),
          integer(f.get(5), "chunk rows"), checksum, indexLen, indexChecksum));
    }
    Object store = map.get("store");
    if (!(store instanceof String path) || path.split("/", -1).length != 4) {
      throw new MalformedException("manifest store " + store + " is not QUERY/OPERATOR/PARTITION/NAME");
    }
    long version = integer(map.get("version"), "version");
    if (version < 1 || version > MAX_VERSION) {
      throw new MalformedException("manifest version " + version + " is out of range");
    }
    Long baseEpoch = null;
    Object base = map.get("base_epoch");
    if (base != null) { // absent or nil: names none, as Python's obj.get("base_epoch")
      if (!(base instanceof Long b) || b < 0) {
        throw new MalformedException("manifest base_epoch " + base + " is not in 0.." + MAX_EPOCH);
      }
      baseEpoch = b;
    }
    return new Manifest(path, version, (String) kind, epoch, (int) groups, chunks,
        (Map<String, Object>) pos, baseEpoch);
  }
}
