package statestore.spark;

import java.io.IOException;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.function.Predicate;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import statestore.spark.RingErrors.RingException;

/**
 * Direct writes to the ring, as {@code statestore/net/writes.py} and the Python client's
 * {@code commit} do them: each chunk goes to its own R replicas ({@code PUT
 * /v1/chunks/{store}/{version}/{name}}, placement of {@link RingPlacement} over the live
 * members of {@code GET /v1/ring}) and must be acknowledged by W of them; then the manifest
 * goes to the store's R replicas ({@code PUT /v1/manifests/{store}/{version}/{kind}}): a
 * {@code stale_epoch} or {@code version_conflict} from any replica fails the commit, otherwise
 * W acknowledgements make it. While a node joins or leaves, every chunk and manifest also goes
 * to its pending owners and needs W among its current owners and W among its future owners
 * ({@link RingView}, {@link RingView#checkWriteSets}). Re-sending the same content at the same
 * epoch is idempotent at the nodes. On an availability error the writer refreshes its view and
 * retries once (after 200 ms if the ring epoch did not move), as the Python client does. The
 * provider's direct data path ({@link RingDirect}) writes through it, within its retry budget.
 * Requests go through {@link RingTransport}; a replica's refusal is read by
 * {@link RingErrors#replicaAnswer}.
 */
public final class RingWriter {
  /** What one commit wrote. */
  public record WriteStats(int chunks, long bytes, int replicaWrites, int manifestAcks) {}

  private static final ObjectMapper JSON = new ObjectMapper();

  private final List<String> seeds;
  private final RingTransport transport;
  private final Duration requestTimeout;
  private final int concurrency;
  private volatile RingView view;

  public RingWriter(List<String> seeds, Duration connectTimeout, Duration requestTimeout, int concurrency) {
    this(seeds, connectTimeout, requestTimeout, concurrency, RingAccess.NONE);
  }

  RingWriter(List<String> seeds, Duration connectTimeout, Duration requestTimeout, int concurrency,
      RingAccess access) {
    if (seeds.isEmpty()) {
      throw new IllegalArgumentException("give at least one seed HOST:PORT");
    }
    this.seeds = List.copyOf(seeds);
    this.requestTimeout = requestTimeout;
    this.concurrency = Math.max(1, concurrency);
    this.transport = new RingTransport(access, connectTimeout);
  }

  public RingWriter(List<String> seeds) {
    this(seeds, Duration.ofSeconds(5), Duration.ofSeconds(120), 8);
  }

  /** Fetch the ring view from any known node (live members first, then the seeds). */
  public RingView refresh() {
    Set<String> candidates = new LinkedHashSet<>();
    RingView current = view;
    if (current != null) {
      candidates.addAll(current.liveAddresses());
    }
    candidates.addAll(seeds);
    List<String> errors = new ArrayList<>();
    for (String address : candidates) {
      HttpResponse<byte[]> resp;
      try {
        resp = transport.replicaSend(transport.request(address, "/v1/ring").timeout(Duration.ofSeconds(3))
            .GET().build(), address).join();
      } catch (CompletionException e) {
        errors.add(String.valueOf(e.getCause().getMessage()));
        continue;
      }
      if (resp.statusCode() != 200) {
        errors.add(RingErrors.replicaAnswer(address, resp.statusCode(), resp.body()).getMessage());
        continue;
      }
      RingView fresh;
      try {
        fresh = RingView.fromJson(JSON.readTree(resp.body()));
      } catch (IOException | RuntimeException e) {
        throw new RingException("malformed_data", "ring view from " + address + " is malformed (" + e + ")");
      }
      synchronized (this) {
        if (view == null || fresh.epoch >= view.epoch) {
          view = fresh;
        }
        return view;
      }
    }
    throw new RingException("node_unavailable", "no node of the ring answered ("
        + String.join("; ", errors.subList(0, Math.min(3, errors.size())))
        + "): start a node, or pass seeds of running ones");
  }

  /** The transport the writer sends with (shared by the provider's direct reads). */
  RingTransport transport() {
    return transport;
  }

  /** The view last read (none yet: null), not refreshed. */
  RingView lastView() {
    return view;
  }

  /** The current view, refreshed when a node reported a newer ring epoch. */
  public RingView view() {
    RingView v = view;
    if (v == null || transport.seenEpoch() > v.epoch) {
      return refresh();
    }
    return v;
  }

  /**
   * Write one commit laid out by {@link ChunkCodec} and described by {@code manifest}: chunks
   * at W, then the manifest at W. Throws RingException ({@code stale_epoch},
   * {@code version_conflict}, {@code quorum_not_reached}, ...); nothing is acknowledged then.
   */
  public WriteStats write(ManifestCodec.Manifest manifest, List<ChunkCodec.Chunk> chunks) {
    return write(manifest, chunks, 0);
  }

  /**
   * {@link #write(ManifestCodec.Manifest, List)}, asking the store's replicas to keep its last
   * {@code retain} versions ({@code PUT /v1/manifests/...?retain=N}; 0 = the ring's default).
   */
  public WriteStats write(ManifestCodec.Manifest manifest, List<ChunkCodec.Chunk> chunks, int retain) {
    RingView v = view();
    try {
      return writeOn(v, manifest, chunks, retain);
    } catch (RingException e) {
      if (!e.unavailable()) {
        throw e;
      }
      RingView fresh = refresh();
      if (fresh.epoch == v.epoch) {
        try {
          Thread.sleep(200);
        } catch (InterruptedException ie) {
          Thread.currentThread().interrupt();
          throw e;
        }
      }
      return writeOn(view(), manifest, chunks, retain);
    }
  }

  private WriteStats writeOn(RingView v, ManifestCodec.Manifest m, List<ChunkCodec.Chunk> chunks, int retain) {
    long t0 = System.nanoTime();
    int replicaWrites = putChunks(v, m.store(), m.version(), chunks);
    long t1 = System.nanoTime();
    long bytes = 0;
    for (ChunkCodec.Chunk c : chunks) {
      bytes += c.data().length;
    }
    int acks = putManifest(v, m, retain);
    if (Trace.ON) {
      Trace.log("write %s v%d chunks=%.1fms manifest=%.1fms", m.store(), m.version(), (t1 - t0) / 1e6,
          (System.nanoTime() - t1) / 1e6);
    }
    return new WriteStats(chunks.size(), bytes, replicaWrites, acks);
  }

  /** The ring-wide key of one chunk: {@code store/version/name}. */
  public static String chunkKey(String store, long version, String name) {
    return store + "/" + version + "/" + name;
  }

  /**
   * Store every chunk on its R replicas (and its pending owners while nodes join or leave);
   * throws quorum_not_reached below W of the current owners or of the future ones for any
   * chunk. Returns the copies acknowledged.
   */
  public int putChunks(RingView v, String store, long version, List<ChunkCodec.Chunk> chunks) {
    Semaphore sem = new Semaphore(concurrency);
    List<CompletableFuture<Integer>> all = new ArrayList<>();
    for (ChunkCodec.Chunk c : chunks) {
      String key = chunkKey(store, version, c.name());
      List<String> targets = v.writeReplicasOf(key);
      try {
        sem.acquire();
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new RingException("timeout", "interrupted while writing chunks");
      }
      all.add(putEverywhere(targets, "/v1/chunks/" + key, c.data(), null, chunkAck(key),
              RingView.quorumOf(v.replicasOf(key), v.futureReplicasOf(key), v.writeQuorum),
              CHUNK_FINAL)
          .whenComplete((r, e) -> sem.release())
          .thenApply(r -> {
            for (RingException e : r.errors) {
              if (e.code().equals("quota_exceeded")) {
                throw e; // the query is over its quota on a replica: final, not an outage
              }
            }
            RingView.checkWriteSets("chunk " + key, r.acked, v.replicasOf(key),
                v.futureReplicasOf(key), v.writeQuorum, r.errors);
            return r.acked.size();
          }));
    }
    int total = 0;
    RingException first = null;
    for (CompletableFuture<Integer> f : all) {
      try {
        total += f.join();
      } catch (CompletionException e) {
        if (first == null) {
          first = asRing(e.getCause());
        }
      }
    }
    if (first != null) {
      throw first;
    }
    return total;
  }

  /**
   * Store the manifest on the store's replicas (and its pending owners while nodes join or
   * leave); returns the acks. Fencing errors win, then W of the current owners and W of the
   * future ones.
   */
  public int putManifest(RingView v, ManifestCodec.Manifest m) {
    return putManifest(v, m, 0);
  }

  /** {@link #putManifest(RingView, ManifestCodec.Manifest)} with {@code ?retain=N} when N > 0. */
  public int putManifest(RingView v, ManifestCodec.Manifest m, int retain) {
    List<String> targets = new ArrayList<>(v.writeReplicasOf(m.store()));
    // W of the home replicas too: a stand-in's copy is a hint (RingView.checkWriteSets)
    List<String> homes = v.writeHomesOf(m.store());
    for (String a : v.liveHomeReplicasOf(m.store())) {
      if (!targets.contains(a)) {
        targets.add(a);
      }
    }
    String path = "/v1/manifests/" + m.store() + "/" + m.version() + "/" + m.kind()
        + (retain > 0 ? "?retain=" + retain : "");
    Puts r = putEverywhere(targets, path, ManifestCodec.encode(m), "application/msgpack",
        RingWriter::manifestAck,
        RingView.quorumOf(v.replicasOf(m.store()), v.futureReplicasOf(m.store()), v.writeQuorum,
            homes),
        MANIFEST_FINAL).join();
    for (RingException e : r.errors) {
      if (e.code().equals("stale_epoch") || e.code().equals("version_conflict")
          || e.code().equals("quota_exceeded")) {
        throw e;
      }
    }
    RingView.checkWriteSets("manifest of " + m.store() + " v" + m.version(), r.acked,
        v.replicasOf(m.store()), v.futureReplicasOf(m.store()), v.writeQuorum, r.errors, homes);
    return r.acked.size();
  }

  private static final class Puts {
    final Set<String> acked = new LinkedHashSet<>();
    final List<RingException> errors = new ArrayList<>();
    /** A replica's call failed in a way that is no answer of the ring (rethrown). */
    RuntimeException failure;
  }

  /**
   * A chunk's acknowledgement is {@code {"stored": KEY}} naming the chunk written, not any 2xx:
   * a member (or an impostor) answering an empty or foreign 200 is no copy (as the Python
   * client's net/writes.py).
   */
  private static Predicate<byte[]> chunkAck(String key) {
    return body -> {
      JsonNode stored = ackField(body);
      return stored != null && stored.isTextual() && stored.asText().equals(key);
    };
  }

  /** A manifest's acknowledgement is {@code {"stored": true|false}} (false: already held). */
  private static boolean manifestAck(byte[] body) {
    JsonNode stored = ackField(body);
    return stored != null && stored.isBoolean();
  }

  private static JsonNode ackField(byte[] body) {
    try {
      JsonNode answer = JSON.readTree(body);
      return answer != null && answer.isObject() ? answer.get("stored") : null;
    } catch (IOException | RuntimeException e) {
      return null;
    }
  }

  /**
   * The least time a write waits for the replicas still silent once it has enough answers
   * (W of the current and W of the future owners, or a refusal that decides it): twice the
   * time it took to get there, at least this. Python's {@code net/quorate.MIN_GRACE}.
   */
  static final long MIN_GRACE_MS = 500;

  /** Refusals that decide a chunk's write whatever the other replicas say. */
  private static final Set<String> CHUNK_FINAL = Set.of("quota_exceeded");
  /** ... and a manifest's (fencing first). */
  private static final Set<String> MANIFEST_FINAL =
      Set.of("stale_epoch", "version_conflict", "quota_exceeded");

  /**
   * PUT {@code body} to every address. The answer is complete when every replica answered,
   * or a grace period ({@link #MIN_GRACE_MS}) after {@code enough} held or a replica refused
   * with a code in {@code finalCodes}: a replica still silent then (paused, overloaded, a
   * half-open connection) counts as not answering instead of holding the write for its whole
   * request timeout (as Python's {@code net/quorate.until_enough}). Its request is left to
   * finish or time out on its own; quorum intersection makes the W that answered enough, and
   * repair gives it the copy.
   */
  private CompletableFuture<Puts> putEverywhere(List<String> addresses, String path,
      byte[] body, String contentType, Predicate<byte[]> ack, Predicate<Set<String>> enough,
      Set<String> finalCodes) {
    List<CompletableFuture<RingException>> each = new ArrayList<>();
    for (String a : addresses) {
      HttpRequest.Builder b = transport.request(a, path).timeout(requestTimeout)
          .PUT(HttpRequest.BodyPublishers.ofByteArray(body));
      if (contentType != null) {
        b.header("Content-Type", contentType);
      }
      each.add(transport.replicaSend(b.build(), a).handle((resp, err) -> {
        if (err != null) {
          return asRing(err instanceof CompletionException ? err.getCause() : err);
        }
        int s = resp.statusCode();
        if (s != 200 && s != 201) {
          return RingErrors.replicaAnswer(a, s, resp.body());
        }
        return ack.test(resp.body()) ? null : new RingException("malformed_data",
            "node " + a + " answered " + s + " without a well-formed acknowledgement of " + path
            + ": not counted as a copy");
      }));
    }
    CompletableFuture<Puts> out = new CompletableFuture<>();
    long started = System.nanoTime();
    boolean[] graceSet = {false};
    Runnable check = () -> {
      synchronized (out) {
        if (out.isDone()) {
          return;
        }
        Set<String> acked = new LinkedHashSet<>();
        boolean decided = false;
        int answered = 0;
        for (int i = 0; i < each.size(); i++) {
          CompletableFuture<RingException> f = each.get(i);
          if (!f.isDone()) {
            continue;
          }
          if (f.isCompletedExceptionally()) {
            out.complete(collect(addresses, each, path)); // rethrown by join() below
            return;
          }
          answered++;
          RingException e = f.join();
          if (e == null) {
            acked.add(addresses.get(i));
          } else if (finalCodes.contains(e.code())) {
            decided = true;
          }
        }
        if (answered == each.size()) {
          out.complete(collect(addresses, each, path));
        } else if (!graceSet[0] && (decided || enough.test(acked))) {
          graceSet[0] = true;
          long tookMs = (System.nanoTime() - started) / 1_000_000L;
          CompletableFuture.delayedExecutor(Math.max(MIN_GRACE_MS, 2 * tookMs),
              TimeUnit.MILLISECONDS).execute(() -> {
                synchronized (out) {
                  if (!out.isDone()) {
                    out.complete(collect(addresses, each, path));
                  }
                }
              });
        }
      }
    };
    for (CompletableFuture<RingException> f : each) {
      f.whenComplete((r, e) -> check.run());
    }
    check.run(); // no address at all: nothing to wait for
    return out.thenApply(puts -> {
      if (puts.failure != null) {
        throw puts.failure;
      }
      return puts;
    });
  }

  /** The answers so far: a replica still silent is a node_unavailable error. */
  private static Puts collect(
      List<String> addresses, List<CompletableFuture<RingException>> each, String path) {
    Puts out = new Puts();
    for (int i = 0; i < each.size(); i++) {
      CompletableFuture<RingException> f = each.get(i);
      if (!f.isDone()) {
        out.errors.add(new RingException("node_unavailable", "node " + addresses.get(i)
            + " did not answer PUT " + path + " within the grace period after enough replicas"
            + " answered"));
        continue;
      }
      RingException e;
      try {
        e = f.join();
      } catch (CompletionException x) {
        Throwable cause = x.getCause();
        out.failure = cause instanceof RuntimeException r ? r : new IllegalStateException(cause);
        return out;
      }
      if (e == null) {
        out.acked.add(addresses.get(i));
      } else {
        out.errors.add(e);
      }
    }
    return out;
  }

  private static RingException asRing(Throwable t) {
    if (t instanceof RingException r) {
      return r;
    }
    if (t instanceof RuntimeException r) {
      throw r;
    }
    throw new IllegalStateException(t);
  }


}
