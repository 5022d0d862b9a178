package statestore.spark;

import java.io.IOException;
import java.io.InputStream;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Callable;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionService;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorCompletionService;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;

import com.fasterxml.jackson.databind.ObjectMapper;

import statestore.spark.RingErrors.RingError;
import statestore.spark.RingErrors.RingException;
import statestore.spark.RingErrors.Unavailable;

/**
 * The provider's direct data path ({@code spark.statestore.dataPath=direct}, the default): the
 * JVM lays a commit out in chunks itself ({@link ChunkCodec}, byte for byte what a node's
 * coordinator would make of the same rows) and writes them with {@link RingWriter} (each chunk
 * to its R replicas, then the manifest to the store's replicas, W of R, fencing errors win),
 * and restores by reading the store's chain from its replicas and fetching every chunk from
 * its holders itself (star), decoding in the JVM. No node parses, chunks, compresses or
 * decodes rows on the provider's behalf.
 *
 * <p>Commits retry availability failures (no quorum, unreachable or timed-out replicas) with
 * the same budget and backoff as the coordinator path ({@code retryBudgetMs}, {@code
 * maxAttempts}); a retry re-sends the same chunks and manifest at the same epoch, which the
 * nodes take as a no-op where they already hold them. A restore has one deadline
 * ({@code restoreTimeoutMs}, passed in by the provider for all of a version's shards): each
 * chunk is read from its replicas then the other live nodes in ring order, failing over on an
 * error, a timeout, a body silent for {@code readTimeoutMs} (the {@link Watchdog} cuts it) or a
 * checksum mismatch, at most {@link #FETCH_THREADS} at once; a restore attempt that cannot
 * finish (a chain without a read quorum, a chunk no holder could serve) starts again from
 * empty after a backoff, until the deadline.
 */
final class RingDirect {
  static final int FETCH_THREADS = 8;
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final ConcurrentHashMap<String, RingDirect> SHARED = new ConcurrentHashMap<>();
  private static final AtomicInteger THREADS = new AtomicInteger();

  private final RingConfig config;
  private final RingWriter writer;

  private RingDirect(RingConfig config) {
    this.config = config;
    this.writer = new RingWriter(config.seeds, Duration.ofMillis(config.connectTimeoutMs),
        Duration.ofMillis(config.requestTimeoutMs), FETCH_THREADS, config.access);
  }

  static RingDirect shared(RingConfig config) {
    String key = String.join(",", config.seeds) + "|" + config.connectTimeoutMs + "|"
        + config.requestTimeoutMs + "|" + config.access.key();
    return SHARED.computeIfAbsent(key, k -> new RingDirect(config));
  }

  // -- commits ---------------------------------------------------------------------------

  /** What one shard's commit wrote. */
  static final class Written {
    long bytes;
    int chunks;
  }

  /**
   * Commit version {@code version} of one ring store: puts ({@code keys}, {@code values}) and
   * {@code deletes}, as a snapshot or a delta, with {@code retain} sent to the manifest's
   * replicas (Spark's minBatchesToRetain; 0 = the ring's default). {@code baseEpoch} is the
   * epoch of version - 1 the commit builds on (the manifest's {@code base_epoch}, which
   * restores follow, {@link Lineage}); {@code null} when the writer does not know it.
   */
  Written commit(
      String storePath, long version, long epoch, Long baseEpoch, boolean snapshot,
      Map<String, Object> positions, int retain, List<byte[]> keys, List<byte[]> values,
      List<byte[]> deletes)
      throws IOException {
    long t0 = System.nanoTime();
    long c0 = Trace.cpu();
    List<ChunkCodec.Chunk> chunks;
    int blockSize;
    char snapshotKind;
    RingView layout;
    try {
      layout = writer.view();
    } catch (RingException e) {
      // the view last read says the ring's layout as well (it changes with an upgrade): a
      // whole snapshot is named as the ring names one ('w', kept by thinning), never 's',
      // which a thinning line may drop with the version's only state
      layout = writer.lastView();
      if (layout == null) {
        throw new Unavailable("commit of " + storePath + " version " + version
            + ": the ring's view could not be read: " + e.getMessage(), e);
      }
    }
    blockSize = layout.blockSize();
    snapshotKind = layout.snapshotKind();
    try {
      chunks = ChunkCodec.encode(keys, values, deletes, ChunkCodec.DEFAULT_KEY_GROUPS,
          ChunkCodec.DEFAULT_CHUNK_SIZE, snapshot ? snapshotKind : 'd', ChunkCodec.MAX_CHUNK_RAW,
          blockSize);
    } catch (ChunkCodec.PayloadTooLargeException e) {
      throw new RingError(413, RingErrors.Kind.PayloadTooLarge.code, e.getMessage());
    } catch (ChunkCodec.InvalidRequestException e) {
      throw new RingError(400, RingErrors.Kind.InvalidRequest.code, e.getMessage());
    }
    ManifestCodec.Manifest manifest = ManifestCodec.of(storePath, version, snapshot, epoch,
        ChunkCodec.DEFAULT_KEY_GROUPS, chunks, positions, baseEpoch);
    String what = "commit of " + storePath + " version " + version;
    long deadline = System.nanoTime() + config.retryBudgetMs * 1_000_000L;
    RuntimeException last = null;
    for (int round = 0; ; round++) {
      if (round > 0) {
        long left = (deadline - System.nanoTime()) / 1_000_000L;
        if (left <= 0 || round >= config.maxAttempts) {
          throw new Unavailable(what + " failed for " + config.retryBudgetMs + " ms ("
              + round + " rounds): " + last.getMessage() + "; the ring may be down or overloaded"
              + " (raise " + RingConfig.PREFIX + "retryBudgetMs to wait longer)", last);
        }
        RingTransport.backoff(round, left);
        try {
          writer.refresh();
        } catch (RingException e) {
          last = e;
          continue;
        }
      }
      try {
        long t1 = System.nanoTime();
        long c1 = Trace.cpu();
        RingWriter.WriteStats stats = writer.write(manifest, chunks, retain);
        if (Trace.ON) {
          Trace.log("direct-commit %s v%d rows=%d chunks=%d bytes=%d encode=%.1fms(cpu %.1f) write=%.1fms(cpu %.1f)",
              storePath, version, keys.size() + deletes.size(), stats.chunks(), stats.bytes(),
              (t1 - t0) / 1e6, (c1 - c0) / 1e6, (System.nanoTime() - t1) / 1e6, (Trace.cpu() - c1) / 1e6);
        }
        Written out = new Written();
        out.bytes = stats.bytes();
        out.chunks = stats.chunks();
        return out;
      } catch (RingException e) {
        if (!e.unavailable()) {
          throw RingErrors.asIo(e);
        }
        last = e;
      }
    }
  }

  // -- restores --------------------------------------------------------------------------

  /**
   * Rebuild version {@code version} of one ring store into {@code target} (a fresh sink per
   * attempt; a {@code null} value is a delete of the chain's earlier rows), by
   * {@code deadline} ({@link System#nanoTime}).
   */
  RingHttp.Restored restore(String storePath, long version, long deadline,
      RingHttp.RestoreTarget target) throws IOException {
    return retrying("restore of " + storePath + " version " + version, deadline,
        v -> restoreOnce(v, storePath, version, deadline, target));
  }

  /** One attempt of a read against a view of the ring. */
  interface Attempt<T> {
    T run(RingView v) throws IOException;
  }

  /**
   * Run {@code attempt} until it succeeds, a non-retryable ring answer (a 4xx) ends it, or
   * {@code deadline} ({@link System#nanoTime}) or {@code maxAttempts} rounds pass; between
   * rounds a backoff and a refresh of the ring view.
   */
  <T> T retrying(String what, long deadline, Attempt<T> attempt) throws IOException {
    IOException last = null;
    int missing = 0;
    for (int round = 0; ; round++) {
      long left = (deadline - System.nanoTime()) / 1_000_000L;
      if (round > 0) {
        if (left <= 0 || round >= config.maxAttempts) {
          throw new Unavailable(what + " did not finish within "
              + config.restoreTimeoutMs + " ms (" + round + " attempts): "
              + (last == null ? "deadline passed" : last.getMessage()), last);
        }
        RingTransport.backoff(round, left);
        try {
          writer.refresh();
        } catch (RingException e) {
          last = new IOException(e.getMessage(), e);
          continue;
        }
      }
      try {
        return attempt.run(writer.view());
      } catch (RingError e) {
        if (!e.retryable()) {
          throw e;
        }
        last = e;
      } catch (RingException e) {
        last = new IOException(e.getMessage(), e);
      } catch (RingErrors.Missing e) {
        if (++missing >= MISSING_ROUNDS) {
          throw e; // not a stale view: the ring has no such chunk
        }
        last = e;
      } catch (IOException e) {
        last = e;
      }
    }
  }

  /**
   * Rounds of {@link #retrying} (refreshing the ring view between them, about 1.5 s of
   * backoff) after which a chunk that every holder answered 404 for is taken as gone:
   * {@link RingErrors.Missing}, where other failures are retried up to {@code maxAttempts}.
   */
  static final int MISSING_ROUNDS = 5;

  // -- one version's own manifests (the change feed) --------------------------------------

  /**
   * The manifests one version of a store has on the ring, merged over the store's replicas:
   * of the epoch a restore of the version takes ({@link Lineage.Candidates#epochAt}: the
   * head's lineage's, else the highest), per kind ({@code null} where no replica holds one at
   * that epoch).
   */
  record VersionManifests(ManifestCodec.Manifest delta, ManifestCodec.Manifest snapshot) {
    /**
     * The version's own changes are its delta unless only a snapshot was written at its
     * epoch (a re-commit as a snapshot); a compaction's snapshot has the delta's epoch.
     */
    boolean hasDelta() {
      return delta != null && (snapshot == null || delta.epoch() >= snapshot.epoch());
    }

    boolean isEmpty() {
      return delta == null && snapshot == null;
    }
  }

  /** {@link VersionManifests} of {@code version} of {@code storePath}, with retries. */
  VersionManifests versionManifests(String storePath, long version, long deadline)
      throws IOException {
    return retrying("reading the manifests of " + storePath + " version " + version, deadline,
        v -> {
          Gathered g = gather(v, storePath, version, deadline);
          Long epoch = g.held.epochAt(version);
          VersionManifests out = epoch == null
              ? new VersionManifests(null, null)
              : new VersionManifests(g.held.delta(version, epoch), g.held.snapshot(version, epoch));
          if (out.isEmpty() && (!g.errors.isEmpty() || g.answered == 0)) {
            throw new IOException("no replica of " + storePath + " that answered holds version "
                + version + " (" + String.join("; ", g.errors) + ")");
          }
          return out;
        });
  }

  /** Every row of one manifest's chunks, in chunk order (a {@code null} value: a delete). */
  List<ChunkCodec.Row> rowsOf(ManifestCodec.Manifest m, long deadline) throws IOException {
    return retrying("reading the chunks of " + m.store() + " version " + m.version(), deadline,
        v -> {
          List<ChunkCodec.Row> out = new ArrayList<>();
          for (ManifestCodec.ChunkRef ref : m.chunks()) {
            String key = RingWriter.chunkKey(m.store(), m.version(), ref.name());
            byte[] data = fetchChunk(v, key, ref.checksum(), ref.size(), deadline);
            try {
              out.addAll(ChunkCodec.decode(data, ChunkCodec.MAX_CHUNK_RAW, key));
            } catch (ChunkCodec.CorruptChunkException e) {
              throw new IOException(e.getMessage(), e);
            }
          }
          return out;
        });
  }

  private RingHttp.Restored restoreOnce(RingView v, String storePath, long version,
      long deadline, RingHttp.RestoreTarget target) throws IOException {
    List<ManifestCodec.Manifest> chain = readChain(v, storePath, version, deadline);
    RowFraming.RowSink sink = target.begin();
    List<ManifestCodec.Manifest> owners = new ArrayList<>();
    List<ManifestCodec.ChunkRef> refs = new ArrayList<>();
    for (ManifestCodec.Manifest m : chain) {
      for (ManifestCodec.ChunkRef c : m.chunks()) {
        owners.add(m);
        refs.add(c);
      }
    }
    RingHttp.Restored out = new RingHttp.Restored();
    ManifestCodec.Manifest top = chain.get(chain.size() - 1);
    out.version = top.version();
    out.writerEpoch = top.epoch();
    out.positions = JSON.writeValueAsString(top.positions());
    int threads = Math.max(1, Math.min(FETCH_THREADS, refs.size()));
    ExecutorService pool = fetchPool(threads);
    try {
      // a window of fetches ahead of the one being applied, in chain order (a later
      // version's rows must land after an earlier one's)
      List<Future<List<ChunkCodec.Row>>> futures = new ArrayList<>(refs.size());
      int window = 2 * threads;
      for (int i = 0; i < refs.size(); i++) {
        while (futures.size() < refs.size() && futures.size() <= i + window) {
          int j = futures.size();
          ManifestCodec.Manifest m = owners.get(j);
          ManifestCodec.ChunkRef ref = refs.get(j);
          futures.add(pool.submit(() -> {
            String key = RingWriter.chunkKey(m.store(), m.version(), ref.name());
            byte[] data = fetchChunk(v, key, ref.checksum(), ref.size(), deadline);
            synchronized (out) {
              out.bytes += data.length;
            }
            return ChunkCodec.decode(data, ChunkCodec.MAX_CHUNK_RAW, key);
          }));
        }
        List<ChunkCodec.Row> rows = await(futures.get(i), deadline,
            "restore of " + storePath + " version " + version);
        futures.set(i, null);
        for (ChunkCodec.Row row : rows) {
          sink.row(row.key(), row.value());
          if (row.value() != null) {
            out.rows++;
          }
        }
      }
    } finally {
      pool.shutdownNow();
    }
    return out;
  }

  private static ExecutorService fetchPool(int threads) {
    return Executors.newFixedThreadPool(threads, r -> {
      Thread t = new Thread(r, "statestore-fetch-" + THREADS.incrementAndGet());
      t.setDaemon(true);
      return t;
    });
  }

  /**
   * The results of {@code calls} (reads of the ring, each with its own retries), in order,
   * run at once, up to {@link #FETCH_THREADS} at a time on the JVM's shared fetch threads
   * ({@link #TOGETHER}), while the caller waits:
   * a lazy load's chains and indexes take a few round trips' time, not one a shard and chunk.
   * The first call to fail fails them all (the others are cancelled) with its own error;
   * when the deadline passes first, a call that fails within a second after it gives its
   * error as the cause ({@code what} names the calls in the message).
   */
  static <T> List<T> together(List<Callable<T>> calls, long deadline, String what)
      throws IOException {
    List<T> out = new ArrayList<>(calls.size());
    if (calls.size() == 1) {
      try {
        out.add(calls.get(0).call());
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IOException("interrupted during a restore", e);
      } catch (Exception e) {
        throw rethrown(e);
      }
      return out;
    }
    if (calls.isEmpty()) {
      return out;
    }
    CompletionService<Object[]> done = new ExecutorCompletionService<>(TOGETHER);
    List<Future<Object[]>> started = new ArrayList<>(calls.size());
    try {
      for (int i = 0; i < calls.size(); i++) {
        out.add(null);
      }
      // up to FETCH_THREADS at once: another starts as each ends
      while (started.size() < Math.min(FETCH_THREADS, calls.size())) {
        started.add(startCall(done, calls, started.size()));
      }
      for (int n = 0; n < calls.size(); n++) {
        Future<Object[]> f = done.poll(Math.max(1, deadline - System.nanoTime()),
            TimeUnit.NANOSECONDS);
        if (f == null) { // the deadline: a call's own error, if one comes soon, says why
          Future<Object[]> late = done.poll(1, TimeUnit.SECONDS);
          IOException timeout = new IOException(what + ": the restore deadline passed");
          if (late != null) {
            try {
              late.get();
            } catch (ExecutionException e) {
              timeout.initCause(e.getCause());
            }
          }
          throw timeout;
        }
        try {
          Object[] got = f.get();
          @SuppressWarnings("unchecked")
          T value = (T) got[1];
          out.set((Integer) got[0], value);
        } catch (ExecutionException e) {
          throw rethrown(e.getCause());
        }
        if (started.size() < calls.size()) {
          started.add(startCall(done, calls, started.size()));
        }
      }
      return out;
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IOException("interrupted during a restore", e);
    } finally {
      for (Future<Object[]> f : started) {
        f.cancel(true); // those still running (a failure, the deadline): interrupted
      }
    }
  }

  /**
   * The threads {@link #together} runs calls on, shared by every caller of the JVM (a lazy
   * load, each read-ahead window): idle ones end after a minute.
   */
  private static final ExecutorService TOGETHER = Executors.newCachedThreadPool(r -> {
    Thread t = new Thread(r, "statestore-fetch-" + THREADS.incrementAndGet());
    t.setDaemon(true);
    return t;
  });

  private static <T> Future<Object[]> startCall(CompletionService<Object[]> done,
      List<Callable<T>> calls, int at) {
    Callable<T> c = calls.get(at);
    return done.submit(() -> new Object[] {at, c.call()});
  }

  private static <T> T await(Future<T> f, long deadline, String what) throws IOException {
    long left = deadline - System.nanoTime();
    try {
      return f.get(Math.max(1, left), TimeUnit.NANOSECONDS);
    } catch (TimeoutException e) {
      f.cancel(true);
      throw new IOException(what + ": the restore deadline passed");
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IOException("interrupted during a restore", e);
    } catch (ExecutionException e) {
      throw rethrown(e.getCause());
    }
  }

  /** What a fetch failed with, as the caller throws it: an IOException or unchecked. */
  private static IOException rethrown(Throwable c) {
    if (c instanceof IOException io) {
      return io;
    }
    if (c instanceof ChunkCodec.CorruptChunkException cc) {
      return new IOException(cc.getMessage(), cc);
    }
    if (c instanceof RuntimeException r) {
      throw r;
    }
    return new IOException(c);
  }

  /** One chunk's verified bytes ({@code size} of them) from the first holder that has them. */
  private byte[] fetchChunk(RingView v, String key, long checksum, long size, long deadline)
      throws IOException {
    return fetch(v, key, "", checksum, size, deadline);
  }

  /**
   * Bytes {@code offset} to {@code offset + length - 1} of one chunk (a blocked chunk's index
   * or one block), from the first holder whose answer has checksum {@code checksum}.
   */
  byte[] fetchPart(String key, long offset, long length, long checksum, long deadline)
      throws IOException {
    return retrying("reading " + key, deadline,
        v -> fetch(v, key, "?offset=" + offset + "&length=" + length, checksum, length, deadline));
  }

  /** The most bytes a lookup answers (node/lookup.py's LOOKUP_ANSWER_BYTES). */
  static final long LOOKUP_ANSWER_BYTES = 32L << 20;

  /**
   * The values {@code keys} have along {@code path} (chunks of one version, in group order),
   * or null for a key they do not hold: {@code POST /v1/stores/{store}/lookup} to the first
   * holder of the chunk {@code anchor} (one of the path's) that answers (docs/api.md). One pass over the holders, no
   * retry: a read-ahead's keys are read block by block when it fails.
   */
  List<byte[]> lookup(String storePath, String anchor, int groups, List<byte[]> keys,
      List<LazyBase.Part> path, long deadline) throws IOException {
    List<String> hex = new ArrayList<>(keys.size());
    for (byte[] k : keys) {
      hex.add(java.util.HexFormat.of().formatHex(k));
    }
    List<List<Object>> parts = new ArrayList<>(path.size());
    for (LazyBase.Part p : path) {
      ManifestCodec.ChunkRef r = p.ref();
      // the checksum is an unsigned 64-bit number: a long above 2^63 is written as such
      parts.add(List.of(p.version(), r.name(), r.lo(), r.hi(), r.size(), r.indexLen(),
          new java.math.BigInteger(Long.toUnsignedString(r.indexChecksum()))));
    }
    Map<String, Object> request = new LinkedHashMap<>();
    request.put("groups", groups);
    request.put("keys", hex);
    request.put("parts", parts);
    byte[] body = JSON.writeValueAsBytes(request);
    List<String> errors = new ArrayList<>();
    for (String address : writer.view().readOrder(anchor)) {
      long left = (deadline - System.nanoTime()) / 1_000_000L;
      if (left <= 0) {
        errors.add("the deadline passed");
        break;
      }
      try {
        RingTransport.Answer got = writer.transport().post(address,
            "/v1/stores/" + storePath + "/lookup", body, "application/json",
            Math.min(config.requestTimeoutMs, left), deadline, config.readTimeoutMs,
            LOOKUP_ANSWER_BYTES + 5L * keys.size() + 5); // the values and their framing
        if (got.status() != 200) {
          errors.add(address + " answered " + got.status());
          int s = got.status();
          if (s >= 400 && s < 500 && s != 404 && s != 429) {
            break; // the request itself is refused: no other holder answers it otherwise
          }
          continue;
        }
        Msgpack.Reader r = new Msgpack.Reader(got.body(), 0, got.body().length, false);
        if (r.arrayHeader() != keys.size()) {
          errors.add(address + " answered another number of values");
          continue;
        }
        List<byte[]> out = new ArrayList<>(keys.size());
        for (int i = 0; i < keys.size(); i++) {
          out.add(r.binOrNil());
        }
        if (!r.atEnd()) {
          errors.add(address + " answered more than its values");
          continue;
        }
        return out;
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IOException("interrupted while looking up keys of " + storePath, e);
      } catch (IOException | Msgpack.FormatException | IllegalArgumentException e) {
        errors.add(address + ": " + e.getMessage());
      }
    }
    throw new IOException("lookup of " + keys.size() + " keys of " + storePath + " failed: "
        + String.join("; ", errors.subList(0, Math.min(3, errors.size()))));
  }

  /** Every row of one chunk of {@code m} (a {@code null} value: a delete), with retries. */
  List<ChunkCodec.Row> chunkRows(ManifestCodec.Manifest m, ManifestCodec.ChunkRef ref,
      long deadline) throws IOException {
    String key = RingWriter.chunkKey(m.store(), m.version(), ref.name());
    byte[] data = retrying("reading " + key, deadline,
        v -> fetch(v, key, "", ref.checksum(), ref.size(), deadline));
    try {
      return ChunkCodec.decode(data, ChunkCodec.MAX_CHUNK_RAW, key);
    } catch (ChunkCodec.CorruptChunkException e) {
      throw new IOException(e.getMessage(), e);
    }
  }

  /** The chain of {@code version} of one store, oldest first, with retries. */
  List<ManifestCodec.Manifest> chain(String storePath, long version, long deadline)
      throws IOException {
    return retrying("reading the chain of " + storePath + " version " + version, deadline,
        v -> readChain(v, storePath, version, deadline));
  }

  /**
   * {@code size} bytes of chunk {@code key} ({@code query}: a part of it), verified against
   * {@code checksum}, from the first holder that answers them; a longer answer is refused
   * unread past the size (an error body past 64 KiB too).
   */
  private byte[] fetch(RingView v, String key, String query, long checksum, long size,
      long deadline) throws IOException {
    List<String> errors = new ArrayList<>();
    int asked = 0;
    int notHeld = 0;
    for (String address : v.readOrder(key)) {
      long left = (deadline - System.nanoTime()) / 1_000_000L;
      if (left <= 0) {
        errors.add("the restore deadline passed");
        break;
      }
      try {
        RingTransport.Answer got = writer.transport().get(address, "/v1/chunks/" + key + query,
            Math.min(config.requestTimeoutMs, left), deadline, config.readTimeoutMs,
            Math.max(size, 64 << 10));
        byte[] data = got.body();
        asked++;
        if (got.status() == 404) {
          notHeld++;
        }
        if (got.status() != 200) {
          errors.add(address + " answered " + got.status() + " "
              + new String(data, 0, Math.min(200, data.length), StandardCharsets.UTF_8));
          continue;
        }
        ChunkCodec.verify(data, checksum, key + query);
        return data;
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IOException("interrupted while reading chunk " + key, e);
      } catch (IOException | ChunkCodec.CorruptChunkException | IllegalArgumentException e) {
        errors.add(address + ": " + e.getMessage());
      }
    }
    String why = String.join("; ", errors.subList(0, Math.min(3, errors.size())));
    if (asked > 0 && notHeld == asked && asked == errors.size()) {
      throw new RingErrors.Missing("chunk " + key + query + " is held by none of its "
          + asked + " holders: " + why);
    }
    throw new IOException("chunk " + key + query + " could not be read from any live holder: "
        + why);
  }

  /** What the store's replicas answered for {@code GET .../chain?version=N}. */
  static final class Gathered {
    /** Every manifest answered, one per (version, kind, epoch). */
    final Lineage.Candidates held = new Lineage.Candidates();
    final List<String> errors = new ArrayList<>();
    int answered;
  }

  /**
   * Ask every replica of {@code storePath} for the chain of {@code version} and merge the
   * answers: every manifest of every epoch they hold (a replica answers each epoch it keeps
   * of the versions the chain may need, core/manifest.py {@code local_chain}). A replica that
   * does not hold the store answers 404 and counts as answered with nothing.
   */
  private Gathered gather(RingView v, String storePath, long version, long deadline)
      throws IOException {
    Gathered g = new Gathered();
    List<String> targets = v.replicasOf(storePath);
    List<CompletableFuture<HttpResponse<byte[]>>> pending = new ArrayList<>();
    long left = Math.max(1, (deadline - System.nanoTime()) / 1_000_000L);
    for (String a : targets) {
      HttpRequest req = writer.transport().request(
              a, "/v1/stores/" + storePath + "/chain?version=" + version)
          .timeout(Duration.ofMillis(Math.min(config.requestTimeoutMs, left))).GET().build();
      pending.add(writer.transport().sendAsync(req, HttpResponse.BodyHandlers.ofByteArray()));
    }
    for (int i = 0; i < pending.size(); i++) {
      String a = targets.get(i);
      HttpResponse<byte[]> resp;
      try {
        long wait = Math.max(1, deadline - System.nanoTime());
        resp = pending.get(i).get(wait, TimeUnit.NANOSECONDS);
      } catch (TimeoutException e) {
        pending.get(i).cancel(true);
        g.errors.add(a + ": no answer by the restore deadline");
        continue;
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IOException("interrupted while reading the chain of " + storePath, e);
      } catch (ExecutionException e) {
        g.errors.add(a + ": " + e.getCause());
        continue;
      }
      writer.transport().sawEpoch(resp);
      if (resp.statusCode() == 404) {
        g.answered++;
        continue;
      }
      if (resp.statusCode() != 200) {
        g.errors.add(a + " answered " + resp.statusCode() + " "
            + new String(resp.body(), 0, Math.min(200, resp.body().length), StandardCharsets.UTF_8));
        continue;
      }
      List<ManifestCodec.Manifest> got;
      try {
        got = ManifestCodec.decodeChain(resp.body());
      } catch (ManifestCodec.MalformedException e) {
        g.errors.add(a + ": " + e.getMessage());
        continue;
      }
      g.answered++;
      for (ManifestCodec.Manifest m : got) {
        g.held.add(m);
      }
    }
    return g;
  }

  /**
   * The manifests to apply for {@code version}, oldest first, merged over the store's
   * replicas as {@code net/reads.read_chain} does: every epoch every replica answered, resolved
   * by {@link Lineage} (the head's lineage, each delta's exact base, the highest epoch where a
   * manifest names none). A replica that does not hold the store answers 404 and contributes
   * nothing; a chain that does not resolve is {@code version_not_found} when every replica
   * answered, else a retryable failure (the missing manifest may be on a silent replica).
   */
  List<ManifestCodec.Manifest> readChain(RingView v, String storePath, long version,
      long deadline) throws IOException {
    Gathered g = gather(v, storePath, version, deadline);
    try {
      return g.held.resolve(storePath, version);
    } catch (Lineage.NotFoundException e) {
      if (!g.errors.isEmpty() || g.answered == 0) {
        throw new IOException("the chain of " + storePath + " version " + version + " does not"
            + " resolve on the replicas that answered (" + e.getMessage() + "; "
            + String.join("; ", g.errors) + ")");
      }
      throw new RingError(404, RingErrors.Kind.VersionNotFound.code, e.getMessage());
    }
  }
}
