package statestore.spark;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import com.fasterxml.jackson.databind.ObjectMapper;

/**
 * A command-line harness for the cross-language tests of the Java codec
 * ({@code tests/ring/test_java_codec.py}); a test tool, not in the provider's jar:
 * {@code tests/javakit.py} compiles it against that jar (it is in the provider's package for
 * the package-private classes it drives). Input and output are msgpack files:
 *
 * <ul>
 *   <li>{@code xxh3 IN OUT}: IN a list of bin; OUT the list of their XXH3-64 (uint64).
 *   <li>{@code encode IN OUT}: IN a list of commits, each a map {@code header} (JSON: store,
 *       version, epoch, snapshot, key_groups, chunk_size, max_chunk, positions, and optionally
 *       base_epoch), {@code puts}
 *       (list of [key, value]), {@code deletes} (list of keys); OUT per commit either
 *       {@code {error}} or {@code {chunks: [[name, lo, hi, data, checksum, raw_size, rows]],
 *       manifest: bin}}.
 *   <li>{@code decode IN OUT}: IN a list of commits, each {@code {chunks: [bin], manifest:
 *       bin, max_raw: optional int}}; OUT per commit either {@code {error}} or {@code {rows: [[[key, value|nil]]] per
 *       chunk, manifest: re-encoded bin, chunk_refs: [[...]], store, version, kind, epoch,
 *       key_groups}}.
 *   <li>{@code place IN OUT}: IN a list of {@code {view: GET /v1/ring JSON, keys: [str]}}; OUT
 *       per case {@code {replicas: [[id]], addresses: [[host:port]], preference: [[id]]}}.
 *   <li>{@code writeset IN OUT}: IN a list of {@code {view: GET /v1/ring JSON, keys: [str],
 *       acked: [[host:port]] (per key)}}; OUT per case {@code {current: [[host:port]], future:
 *       [[host:port]], targets: [[host:port]], checks: [str], homes: [[str]],
 *       manifest_checks: [str]}} per key: the key's current owners, its owners once moves
 *       finish, where RingWriter sends a write of it, whether that many acknowledgements make
 *       the write ({@code ok}, or the error's code and message as {@code code: message}), its
 *       home replicas as a manifest write counts them, and the same decision for a manifest.
 *   <li>{@code write IN OUT}: IN a list of commits as for {@code encode} plus {@code seeds};
 *       each is written to the ring with {@link RingWriter}; OUT per commit {@code {chunks,
 *       bytes, replica_writes, manifest_acks}} or {@code {code, error}}.
 *   <li>{@code resolve IN OUT}: IN a list of {@code {store, answers: [bin], version}}, each answer an
 *       encoded chain (one replica's {@code GET .../chain}); OUT per case the chain
 *       {@link Lineage} resolves from all of them, {@code {chain: [[version, epoch, kind]]}}, or
 *       {@code {error}} (with Python's VersionNotFound message).
 *   <li>{@code restore IN OUT}: IN a list of {@code {seeds, store, version}}; each is restored
 *       from the ring by the direct path ({@link RingDirect#restore}); OUT per case {@code
 *       {rows: [[key, value]] sorted by key, version, epoch, positions}} or {@code {code,
 *       error}}.
 *   <li>{@code fs IN OUT}: IN a list of {@code {seeds, name, ops: [[op, path, data?]]}}, each
 *       run on a fresh {@link RingFileSystem} for {@code ring://name}; ops are {@code store}
 *       (OUT {@code [store, old store or nil]} of the directory path), {@code write} (path,
 *       bin; OUT true), {@code read} (OUT the bytes, or nil when there is no such file),
 *       {@code list} (OUT the sorted child names, or nil when there is no such directory);
 *       OUT per case the list of the ops' answers.
 *   <li>{@code errors IN OUT}: IN a list of Python error class names (core/errors.py), or
 *       {@code "*"}; OUT per name the row of {@link RingErrors.Kind} of that name, {@code
 *       {code, status, parent, unavailable}} ({@code parent} nil at the root), or nil when
 *       Java has none; for {@code "*"} the list of every name the Java table holds.
 *   <li>{@code answer IN OUT}: IN a list of {@code {status, body}} (a node's non-OK answer);
 *       OUT per answer what Java makes of it: {@code {replica: [code, message], coordinator:
 *       [code, message], retryable}} ({@link RingErrors#replicaAnswer},
 *       {@link RingErrors#fromAnswer}, {@link RingErrors#retryable}).
 *   <li>{@code bench IN}: IN is {@code [keys, values]} (two lists of bin, one commit's puts);
 *       then commands on stdin, one per line, each answered by one line on stdout, for
 *       {@code bench/jvm_codec.py}: {@code encode N} encodes the commit N times and answers
 *       {@code <thread CPU ns> <wall ns> <raw bytes per encode> <chunks>}; {@code decode N}
 *       decodes its chunks N times and answers {@code <thread CPU ns> <wall ns> <rows>};
 *       {@code quit} ends.
 * </ul>
 */
public final class CodecHarness {
  private CodecHarness() {}

  public static void main(String[] args) throws IOException {
    if (args.length == 2 && args[0].equals("bench")) {
      bench(Files.readAllBytes(Path.of(args[1])));
      return;
    }
    if (args.length != 3) {
      System.err.println("usage: CodecHarness xxh3|encode|decode IN OUT");
      System.exit(2);
    }
    byte[] in = Files.readAllBytes(Path.of(args[1]));
    Object cases = new Msgpack.Reader(in, 0, in.length, false).value();
    Msgpack.Writer out = new Msgpack.Writer(1 << 16);
    List<?> list = (List<?>) cases;
    out.arrayHeader(list.size());
    switch (args[0]) {
      case "xxh3":
        for (Object o : list) {
          out.unsigned(Xxh3.hash((byte[]) o));
        }
        break;
      case "encode":
        for (Object o : list) {
          encodeOne(out, (Map<?, ?>) o);
        }
        break;
      case "decode":
        for (Object o : list) {
          decodeOne(out, (Map<?, ?>) o);
        }
        break;
      case "place":
        for (Object o : list) {
          placeOne(out, (Map<?, ?>) o);
        }
        break;
      case "resolve":
        for (Object o : list) {
          resolveOne(out, (Map<?, ?>) o);
        }
        break;
      case "restore":
        for (Object o : list) {
          restoreOne(out, (Map<?, ?>) o);
        }
        break;
      case "fs":
        for (Object o : list) {
          fsOne(out, (Map<?, ?>) o);
        }
        break;
      case "writeset":
        for (Object o : list) {
          writeSetOne(out, (Map<?, ?>) o);
        }
        break;
      case "errors":
        for (Object o : list) {
          errorKind(out, (String) o);
        }
        break;
      case "answer":
        for (Object o : list) {
          Map<?, ?> c = (Map<?, ?>) o;
          int status = (int) (long) (Long) c.get("status");
          byte[] body = (byte[]) c.get("body");
          RingErrors.RingException r = RingErrors.replicaAnswer("n1", status, body);
          RingErrors.RingError e = RingErrors.fromAnswer("n1", status, body);
          out.mapHeader(3).str("replica").arrayHeader(2).str(r.code()).str(r.getMessage());
          out.str("coordinator").arrayHeader(2).str(e.code).str(e.getMessage());
          out.str("retryable").bool(e.retryable());
        }
        break;
      case "write": {
        Map<List<?>, RingWriter> writers = new java.util.HashMap<>();
        for (Object o : list) {
          Map<?, ?> c = (Map<?, ?>) o;
          List<?> seeds = (List<?>) c.get("seeds");
          RingWriter w = writers.computeIfAbsent(seeds, s -> {
            List<String> addrs = new ArrayList<>();
            for (Object a : s) {
              addrs.add((String) a);
            }
            return new RingWriter(addrs);
          });
          writeOne(out, w, c);
        }
        break;
      }
      default:
        System.err.println("unknown command " + args[0]);
        System.exit(2);
    }
    Files.write(Path.of(args[2]), out.toByteArray());
  }

  private static void errorKind(Msgpack.Writer out, String name) {
    if (name.equals("*")) {
      RingErrors.Kind[] all = RingErrors.Kind.values();
      out.arrayHeader(all.length);
      for (RingErrors.Kind k : all) {
        out.str(k.name());
      }
      return;
    }
    RingErrors.Kind k;
    try {
      k = RingErrors.Kind.valueOf(name);
    } catch (IllegalArgumentException e) {
      out.nil();
      return;
    }
    out.mapHeader(4).str("code").str(k.code).str("status").integer(k.status).str("parent");
    if (k.parent == null) {
      out.nil();
    } else {
      out.str(k.parent.name());
    }
    out.str("unavailable").bool(k.unavailable());
  }

  private static void bench(byte[] in) throws IOException {
    List<?> both = (List<?>) new Msgpack.Reader(in, 0, in.length, false).value();
    List<byte[]> keys = new ArrayList<>();
    List<byte[]> values = new ArrayList<>();
    for (Object k : (List<?>) both.get(0)) {
      keys.add((byte[]) k);
    }
    for (Object v : (List<?>) both.get(1)) {
      values.add((byte[]) v);
    }
    List<byte[]> none = List.of();
    java.lang.management.ThreadMXBean mx = java.lang.management.ManagementFactory.getThreadMXBean();
    java.io.BufferedReader stdin = new java.io.BufferedReader(
        new java.io.InputStreamReader(System.in, java.nio.charset.StandardCharsets.UTF_8));
    List<ChunkCodec.Chunk> chunks = ChunkCodec.encode(keys, values, none);
    String line;
    while ((line = stdin.readLine()) != null) {
      String[] cmd = line.trim().split(" ");
      if (cmd[0].equals("quit")) {
        break;
      }
      int n = Integer.parseInt(cmd[1]);
      long cpu0 = mx.getCurrentThreadCpuTime();
      long wall0 = System.nanoTime();
      long sink = 0;
      for (int i = 0; i < n; i++) {
        if (cmd[0].equals("encode")) {
          chunks = ChunkCodec.encode(keys, values, none);
          for (ChunkCodec.Chunk c : chunks) {
            sink += c.rawSize();
          }
        } else {
          for (ChunkCodec.Chunk c : chunks) {
            sink += ChunkCodec.decode(c.data()).size();
          }
        }
      }
      long cpu = mx.getCurrentThreadCpuTime() - cpu0;
      long wall = System.nanoTime() - wall0;
      System.out.println(cpu + " " + wall + " " + sink / Math.max(1, n) + " " + chunks.size());
      System.out.flush();
    }
  }

  private static void error(Msgpack.Writer out, RuntimeException e) {
    out.mapHeader(1).str("error").str(e.getClass().getSimpleName() + ": " + e.getMessage());
  }

  @SuppressWarnings("unchecked")
  private static void encodeOne(Msgpack.Writer out, Map<?, ?> c) throws IOException {
    Map<String, Object> h = new ObjectMapper().readValue((String) c.get("header"), LinkedHashMap.class);
    List<byte[]> putKeys = new ArrayList<>();
    List<byte[]> putValues = new ArrayList<>();
    for (Object row : (List<?>) c.get("puts")) {
      putKeys.add((byte[]) ((List<?>) row).get(0));
      putValues.add((byte[]) ((List<?>) row).get(1));
    }
    List<byte[]> deletes = new ArrayList<>();
    for (Object k : (List<?>) c.get("deletes")) {
      deletes.add((byte[]) k);
    }
    boolean snapshot = (Boolean) h.get("snapshot");
    int groups = ((Number) h.get("key_groups")).intValue();
    List<ChunkCodec.Chunk> chunks;
    ManifestCodec.Manifest m;
    try {
      if (snapshot && !deletes.isEmpty()) {
        throw new ChunkCodec.InvalidRequestException("a snapshot holds the whole state: it takes no deletes");
      }
      chunks = ChunkCodec.encode(putKeys, putValues, deletes, groups,
          ((Number) h.get("chunk_size")).intValue(), snapshot ? snapshotKind(h) : 'd',
          ((Number) h.get("max_chunk")).intValue(), blockSize(h));
      m = ManifestCodec.of((String) h.get("store"), ((Number) h.get("version")).longValue(), snapshot,
          ((Number) h.get("epoch")).longValue(), groups, chunks, (Map<String, Object>) h.get("positions"),
          baseEpoch(h));
    } catch (IllegalArgumentException e) {
      error(out, e);
      return;
    }
    out.mapHeader(2).str("chunks").arrayHeader(chunks.size());
    for (ChunkCodec.Chunk ch : chunks) {
      out.arrayHeader(9).str(ch.name()).integer(ch.lo()).integer(ch.hi()).bin(ch.data())
          .unsigned(ch.checksum()).integer(ch.rawSize()).integer(ch.rows()).integer(ch.indexLen())
          .unsigned(ch.indexChecksum());
    }
    out.str("manifest").bin(ManifestCodec.encode(m));
  }

  private static char snapshotKind(Map<String, Object> header) {
    Object k = header.get("snapshot_kind");
    return k == null ? 's' : ((String) k).charAt(0);
  }

  private static int blockSize(Map<String, Object> header) {
    Object b = header.get("block_size");
    return b == null ? ChunkCodec.DEFAULT_BLOCK_SIZE : ((Number) b).intValue();
  }

  private static Long baseEpoch(Map<String, Object> header) {
    Object b = header.get("base_epoch");
    return b == null ? null : ((Number) b).longValue();
  }

  private static void resolveOne(Msgpack.Writer out, Map<?, ?> c) {
    List<ManifestCodec.Manifest> answered = new ArrayList<>();
    for (Object a : (List<?>) c.get("answers")) {
      answered.addAll(ManifestCodec.decodeChain((byte[]) a));
    }
    String store = (String) c.get("store");
    List<ManifestCodec.Manifest> chain;
    try {
      chain = Lineage.Candidates.of(answered).resolve(store, (Long) c.get("version"));
    } catch (Lineage.NotFoundException e) {
      out.mapHeader(1).str("error").str(e.getMessage());
      return;
    }
    out.mapHeader(1).str("chain").arrayHeader(chain.size());
    for (ManifestCodec.Manifest m : chain) {
      out.arrayHeader(3).integer(m.version()).integer(m.epoch()).str(m.kind());
    }
  }

  @SuppressWarnings("unchecked")
  private static void fsOne(Msgpack.Writer out, Map<?, ?> c) throws IOException {
    org.apache.hadoop.conf.Configuration conf = new org.apache.hadoop.conf.Configuration(false);
    conf.set(RingConfig.PREFIX + "seeds", String.join(",", (List<String>) (List<?>) c.get("seeds")));
    String name = (String) c.get("name");
    List<?> ops = (List<?>) c.get("ops");
    RingFileSystem fs = new RingFileSystem();
    fs.initialize(java.net.URI.create("ring://" + name), conf);
    out.arrayHeader(ops.size());
    for (Object o : ops) {
      List<?> op = (List<?>) o;
      String path = (String) op.get(1);
      org.apache.hadoop.fs.Path p = new org.apache.hadoop.fs.Path("ring://" + name + path);
      switch ((String) op.get(0)) {
        case "store": {
          String key = path.equals("/") ? "" : path;
          String old = RingFileSystem.legacyDirStore(name, key);
          out.arrayHeader(2).str(RingFileSystem.dirStore(name, key));
          if (old == null) {
            out.nil();
          } else {
            out.str(old);
          }
          break;
        }
        case "write":
          try (java.io.OutputStream w = fs.create(p, true)) {
            w.write((byte[]) op.get(2));
          }
          out.bool(true);
          break;
        case "read":
          if (!fs.exists(p)) {
            out.nil();
          } else {
            try (java.io.InputStream r = fs.open(p)) {
              out.bin(r.readAllBytes());
            }
          }
          break;
        case "list":
          if (!fs.exists(p)) {
            out.nil();
          } else {
            List<String> names = new ArrayList<>();
            for (org.apache.hadoop.fs.FileStatus st : fs.listStatus(p)) {
              names.add(st.getPath().getName());
            }
            java.util.Collections.sort(names);
            out.arrayHeader(names.size());
            for (String n : names) {
              out.str(n);
            }
          }
          break;
        default:
          throw new IllegalArgumentException("unknown fs op " + op.get(0));
      }
    }
  }

  @SuppressWarnings("unchecked")
  private static void restoreOne(Msgpack.Writer out, Map<?, ?> c) {
    org.apache.hadoop.conf.Configuration conf = new org.apache.hadoop.conf.Configuration(false);
    conf.set(RingConfig.PREFIX + "seeds", String.join(",", (List<String>) (List<?>) c.get("seeds")));
    conf.set(RingConfig.PREFIX + "restoreTimeoutMs", "30000");
    conf.set(RingConfig.PREFIX + "maxAttempts", "3");
    RingConfig config = RingConfig.from(conf, null);
    TreeMap<String, byte[][]> rows = new TreeMap<>();
    RingHttp.Restored r;
    try {
      r = RingDirect.shared(config).restore((String) c.get("store"), (Long) c.get("version"),
          System.nanoTime() + config.restoreTimeoutMs * 1_000_000L, () -> {
            rows.clear();
            return (k, v) -> {
              String hex = java.util.HexFormat.of().formatHex(k);
              if (v == null) {
                rows.remove(hex);
              } else {
                rows.put(hex, new byte[][] {k, v});
              }
            };
          });
    } catch (RingErrors.RingError e) {
      out.mapHeader(2).str("code").str(e.code).str("error").str(e.getMessage());
      return;
    } catch (IOException e) {
      out.mapHeader(2).str("code").str("unavailable").str("error").str(e.getMessage());
      return;
    }
    out.mapHeader(4).str("rows").arrayHeader(rows.size());
    for (byte[][] kv : rows.values()) {
      out.arrayHeader(2).bin(kv[0]).bin(kv[1]);
    }
    out.str("version").integer(r.version);
    out.str("epoch").integer(r.writerEpoch);
    out.str("positions").str(r.positions);
  }

  private static void placeOne(Msgpack.Writer out, Map<?, ?> c) throws IOException {
    RingView view = RingView.fromJson(new ObjectMapper().readTree((String) c.get("view")));
    List<?> keys = (List<?>) c.get("keys");
    out.mapHeader(3);
    out.str("replicas").arrayHeader(keys.size());
    for (Object k : keys) {
      List<String> ids = view.placement().replicas((String) k, view.replicas);
      out.arrayHeader(ids.size());
      ids.forEach(out::str);
    }
    out.str("addresses").arrayHeader(keys.size());
    for (Object k : keys) {
      List<String> addrs = view.replicasOf((String) k);
      out.arrayHeader(addrs.size());
      addrs.forEach(out::str);
    }
    out.str("preference").arrayHeader(keys.size());
    for (Object k : keys) {
      List<String> ids = view.placement().preference((String) k);
      out.arrayHeader(ids.size());
      ids.forEach(out::str);
    }
  }

  /** "ok", or the error's code and message: RingView.checkWriteSets over {@code acked}. */
  private static void check(Msgpack.Writer out, String what, RingView view, String key,
      List<?> acked, List<String> homes) throws IOException {
    java.util.Set<String> acks = new java.util.LinkedHashSet<>();
    for (Object a : acked) {
      acks.add((String) a);
    }
    try {
      RingView.checkWriteSets(what, acks, view.replicasOf(key), view.futureReplicasOf(key),
          view.writeQuorum, List.of(), homes);
      out.str("ok");
    } catch (RingErrors.RingException e) {
      out.str(e.code() + ": " + e.getMessage());
    }
  }

  private static void writeSetOne(Msgpack.Writer out, Map<?, ?> c) throws IOException {
    RingView view = RingView.fromJson(new ObjectMapper().readTree((String) c.get("view")));
    List<?> keys = (List<?>) c.get("keys");
    List<?> acked = (List<?>) c.get("acked");
    out.mapHeader(6);
    out.str("current").arrayHeader(keys.size());
    for (Object k : keys) {
      addresses(out, view.replicasOf((String) k));
    }
    out.str("future").arrayHeader(keys.size());
    for (Object k : keys) {
      addresses(out, view.futureReplicasOf((String) k));
    }
    out.str("targets").arrayHeader(keys.size());
    for (Object k : keys) {
      addresses(out, view.writeReplicasOf((String) k));
    }
    out.str("checks").arrayHeader(keys.size());
    for (int i = 0; i < keys.size(); i++) {
      String key = (String) keys.get(i);
      check(out, "chunk " + key, view, key, (List<?>) acked.get(i), List.of());
    }
    out.str("homes").arrayHeader(keys.size());
    for (Object k : keys) {
      addresses(out, view.writeHomesOf((String) k));
    }
    out.str("manifest_checks").arrayHeader(keys.size());
    for (int i = 0; i < keys.size(); i++) {
      String key = (String) keys.get(i);
      check(out, "manifest of " + key, view, key, (List<?>) acked.get(i), view.writeHomesOf(key));
    }
  }

  private static void addresses(Msgpack.Writer out, List<String> addrs) {
    out.arrayHeader(addrs.size());
    addrs.forEach(out::str);
  }

  /** Encode a commit as {@code encode} does and write it to the ring with RingWriter. */
  @SuppressWarnings("unchecked")
  private static void writeOne(Msgpack.Writer out, RingWriter w, Map<?, ?> c) throws IOException {
    Map<String, Object> h = new ObjectMapper().readValue((String) c.get("header"), LinkedHashMap.class);
    List<byte[]> putKeys = new ArrayList<>();
    List<byte[]> putValues = new ArrayList<>();
    for (Object row : (List<?>) c.get("puts")) {
      putKeys.add((byte[]) ((List<?>) row).get(0));
      putValues.add((byte[]) ((List<?>) row).get(1));
    }
    List<byte[]> deletes = new ArrayList<>();
    for (Object k : (List<?>) c.get("deletes")) {
      deletes.add((byte[]) k);
    }
    boolean snapshot = (Boolean) h.get("snapshot");
    int groups = ((Number) h.get("key_groups")).intValue();
    try {
      List<ChunkCodec.Chunk> chunks = ChunkCodec.encode(putKeys, putValues, deletes, groups,
          ((Number) h.get("chunk_size")).intValue(), snapshot ? snapshotKind(h) : 'd',
          ((Number) h.get("max_chunk")).intValue(), blockSize(h));
      ManifestCodec.Manifest m = ManifestCodec.of((String) h.get("store"),
          ((Number) h.get("version")).longValue(), snapshot, ((Number) h.get("epoch")).longValue(),
          groups, chunks, (Map<String, Object>) h.get("positions"), baseEpoch(h));
      RingWriter.WriteStats st = w.write(m, chunks);
      out.mapHeader(4).str("chunks").integer(st.chunks()).str("bytes").integer(st.bytes())
          .str("replica_writes").integer(st.replicaWrites()).str("manifest_acks")
          .integer(st.manifestAcks());
    } catch (RingErrors.RingException e) {
      out.mapHeader(2).str("code").str(e.code()).str("error").str(e.getMessage());
    }
  }

  private static void decodeOne(Msgpack.Writer out, Map<?, ?> c) {
    List<?> datas = (List<?>) c.get("chunks");
    List<List<ChunkCodec.Row>> decoded = new ArrayList<>();
    ManifestCodec.Manifest m;
    int maxRaw = c.get("max_raw") instanceof Long l ? (int) (long) l : ChunkCodec.MAX_CHUNK_RAW;
    try {
      m = ManifestCodec.decode((byte[]) c.get("manifest"));
      for (int i = 0; i < datas.size(); i++) {
        byte[] data = (byte[]) datas.get(i);
        ManifestCodec.ChunkRef ref = m.chunks().get(i);
        ChunkCodec.verify(data, ref.checksum(), ref.name());
        decoded.add(ChunkCodec.decode(data, maxRaw, ref.name()));
      }
    } catch (RuntimeException e) {
      error(out, e);
      return;
    }
    out.mapHeader(8).str("rows").arrayHeader(decoded.size());
    for (List<ChunkCodec.Row> rows : decoded) {
      out.arrayHeader(rows.size());
      for (ChunkCodec.Row r : rows) {
        out.arrayHeader(2).bin(r.key());
        if (r.value() == null) {
          out.nil();
        } else {
          out.bin(r.value());
        }
      }
    }
    out.str("manifest").bin(ManifestCodec.encode(m));
    out.str("chunk_refs").arrayHeader(m.chunks().size());
    for (ManifestCodec.ChunkRef r : m.chunks()) {
      out.arrayHeader(9).str(r.name()).integer(r.lo()).integer(r.hi()).integer(r.size())
          .integer(r.rawSize()).integer(r.rows()).unsigned(r.checksum()).integer(r.indexLen())
          .unsigned(r.indexChecksum());
    }
    out.str("store").str(m.store());
    out.str("version").integer(m.version());
    out.str("kind").str(m.kind());
    out.str("epoch").integer(m.epoch());
    out.str("key_groups").integer(m.keyGroups());
  }
}
