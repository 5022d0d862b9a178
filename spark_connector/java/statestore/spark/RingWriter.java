package statestore.spark;

import java.io.IOException;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.net.http.HttpTimeoutException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Predicate;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

/**
 * Direct writes to the ring, as {@code statestore/net/writes.py} and the Python client's
 * {@code commit} do them: each chunk goes to its own R replicas ({@code PUT
 * /v1/chunks/{store}/{version}/{name}}, placement of {@link RingPlacement} over the live
 * members of {@code GET /v1/ring}) and must be acknowledged by W of them; then the manifest
 * goes to the store's R replicas ({@code PUT /v1/manifests/{store}/{version}/{kind}}): a
 * {@code stale_epoch} or {@code version_conflict} from any replica fails the commit, otherwise
 * W acknowledgements make it. While a node joins or leaves, every chunk and manifest also goes
 * to its pending owners and needs W among its current owners and W among its future owners
 * ({@link View}, {@link #checkWriteSets}). Re-sending the same content at the same epoch is
 * idempotent at the nodes. On an availability error the writer refreshes its view and retries
 * once (after 200 ms if the ring epoch did not move), as the Python client does. The provider's
 * direct data path ({@link RingDirect}) writes through it, within its retry budget.
 */
public final class RingWriter {
  /** Errors of the ring, with the node's stable {@code code} ({@code stale_epoch}, ...). */
  public static final class RingException extends RuntimeException {
    private final String code;

    public RingException(String code, String message) {
      super(message);
      this.code = code;
    }

    public String code() {
      return code;
    }

    /** Availability, not semantics: retrying may help (Python's Unavailable). */
    public boolean unavailable() {
      return code.equals("node_unavailable") || code.equals("quorum_not_reached")
          || code.equals("timeout") || code.equals("rate_limited");
    }
  }

  /**
   * One member of a ring view: its failure-detector status ({@code up}, {@code suspect},
   * {@code down}), its ring state ({@code joining}, {@code normal}, {@code leaving},
   * {@code left}; Python core/handover.py), the tokens it owns ({@code vnodes}, 0: the view's
   * count) and, while a rebalance moves them, the count it moves to ({@code nextVnodes}, 0:
   * none; Python core/view.py).
   */
  public record MemberInfo(String id, String address, String status, String zone, String state,
      int vnodes, int nextVnodes) {
    public MemberInfo(String id, String address, String status, String zone, String state) {
      this(id, address, status, zone, state, 0, 0);
    }

    public MemberInfo(String id, String address, String status, String zone) {
      this(id, address, status, zone, "normal");
    }

    /** This member on the read ring of a view whose count is {@code dflt}. */
    RingPlacement.Member placed(int dflt) {
      int n = vnodes != 0 ? vnodes : dflt;
      return new RingPlacement.Member(id, zone, n == dflt ? 0 : n);
    }

    /** This member on the future ring. */
    RingPlacement.Member placedLater(int dflt) {
      int n = nextVnodes != 0 ? nextVnodes : vnodes != 0 ? vnodes : dflt;
      return new RingPlacement.Member(id, zone, n == dflt ? 0 : n);
    }
  }

  /** The largest token count a view's member may claim (Python's MAX_VIEW_VNODES). */
  static final int MAX_VIEW_VNODES = 4096;

  /** Ring states whose live members own items now (Python's READ_STATES). */
  static final Set<String> READ_STATES = Set.of("normal", "leaving");
  /** Ring states whose live members own items once every move finishes (FUTURE_STATES). */
  static final Set<String> FUTURE_STATES = Set.of("normal", "joining");
  private static final Set<String> STATES = Set.of("joining", "normal", "leaving", "left");

  /**
   * A ring view: the members, R, W and vnodes at one ring epoch (Python's RingView). While
   * nodes join or leave it holds two rings, as Python's core/view.py: the current ring of the
   * live {@code normal} and {@code leaving} members, which owns every item now (reads), and
   * the future ring of the live {@code normal} and {@code joining} members. A write goes to
   * both ({@link #writeReplicasOf}) and counts only with W acknowledgements among the current
   * owners and W among the future ones ({@link RingWriter#checkWriteSets}), so that it is
   * readable before the switch and after it. With nobody moving they are one ring.
   */
  public static final class View {
    public final long epoch;
    public final List<MemberInfo> members;
    public final int replicas;
    public final int writeQuorum;
    public final int vnodes;
    private final RingPlacement ring;
    private final RingPlacement future;
    private final List<String> live;
    private final Map<String, String> address = new LinkedHashMap<>();

    public View(long epoch, List<MemberInfo> members, int replicas, int writeQuorum, int vnodes) {
      if (replicas < 1 || writeQuorum < 1 || writeQuorum > replicas) {
        throw new IllegalArgumentException("replicas " + replicas + " / write quorum " + writeQuorum);
      }
      this.epoch = epoch;
      this.members = List.copyOf(members);
      this.replicas = replicas;
      this.writeQuorum = writeQuorum;
      this.vnodes = vnodes;
      List<RingPlacement.Member> now = new ArrayList<>();
      List<RingPlacement.Member> later = new ArrayList<>();
      TreeSet<String> liveIds = new TreeSet<>();
      for (MemberInfo m : members) {
        if (!m.status().equals("down") && !m.state().equals("left")) {
          if (READ_STATES.contains(m.state())) {
            now.add(m.placed(vnodes));
          }
          if (FUTURE_STATES.contains(m.state())) {
            later.add(m.placedLater(vnodes));
          }
          liveIds.add(m.id());
        }
        address.put(m.id(), m.address());
      }
      ring = new RingPlacement(now, vnodes);
      future = new LinkedHashSet<>(later).equals(new LinkedHashSet<>(now))
          ? ring : new RingPlacement(later, vnodes);
      live = List.copyOf(liveIds);
    }

    public static View fromJson(JsonNode obj) {
      List<MemberInfo> members = new ArrayList<>();
      for (JsonNode m : obj.get("members")) {
        String status = m.get("status").asText();
        if (!status.equals("up") && !status.equals("suspect") && !status.equals("down")) {
          throw new RingException("malformed_data", "ring view member status " + status);
        }
        // Ring states (Python core/handover.py): a joining member is a pending owner (writes
        // go to it, reads do not yet), a leaving one still owns what it holds, a left one owns
        // nothing any more.
        String state = m.has("state") ? m.get("state").asText() : "normal";
        if (!STATES.contains(state)) {
          throw new RingException("malformed_data", "ring view member state " + state);
        }
        members.add(new MemberInfo(m.get("id").asText(), m.get("address").asText(), status,
            m.has("zone") ? m.get("zone").asText() : "", state, count(m, "vnodes"),
            count(m, "next_vnodes")));
      }
      return new View(obj.get("epoch").asLong(), members, obj.get("replicas").asInt(),
          obj.get("write_quorum").asInt(), obj.get("vnodes").asInt());
    }

    /** A member's token count: absent is 0, else an integer from 0 to MAX_VIEW_VNODES. */
    private static int count(JsonNode m, String field) {
      if (!m.has(field)) {
        return 0;
      }
      JsonNode v = m.get(field);
      if (!v.isInt() || v.asInt() < 0 || v.asInt() > MAX_VIEW_VNODES) {
        throw new RingException("malformed_data", "ring view member " + field + " " + v);
      }
      return v.asInt();
    }

    /** The current ring (the live normal and leaving members). */
    public RingPlacement placement() {
      return ring;
    }

    /** The ring once every move finishes (the current ring when nobody moves). */
    public RingPlacement futurePlacement() {
      return future;
    }

    /** Whether a member is joining or leaving (the two rings differ). */
    public boolean moving() {
      return future != ring;
    }

    /** Addresses of the R nodes that hold {@code key} at this epoch (its current owners). */
    public List<String> replicasOf(String key) {
      List<String> out = new ArrayList<>();
      for (String id : ring.replicas(key, replicas)) {
        out.add(address.get(id));
      }
      return out;
    }

    /** Addresses of {@code key}'s owners once every move finishes. */
    public List<String> futureReplicasOf(String key) {
      if (!moving()) {
        return replicasOf(key);
      }
      List<String> out = new ArrayList<>();
      for (String id : future.replicas(key, replicas)) {
        out.add(address.get(id));
      }
      return out;
    }

    /**
     * Where a write of {@code key} goes: its current owners, then its pending owners (future
     * owners that do not own it yet), as Python's {@code write_replicas_of}.
     */
    public List<String> writeReplicasOf(String key) {
      List<String> out = replicasOf(key);
      if (!moving()) {
        return out;
      }
      for (String a : futureReplicasOf(key)) {
        if (!out.contains(a)) {
          out.add(a);
        }
      }
      return out;
    }

    /** Replicas first, then every other live node in ring order (where it may have moved). */
    public List<String> readOrder(String key) {
      List<String> out = replicasOf(key);
      for (String id : ring.preference(key)) {
        String a = address.get(id);
        if (!out.contains(a)) {
          out.add(a);
        }
      }
      return out;
    }

    /** Every member that is not down and has not left, joining ones included. */
    public List<String> liveAddresses() {
      List<String> out = new ArrayList<>();
      for (String id : live) {
        out.add(address.get(id));
      }
      return out;
    }
  }

  /** What one commit wrote. */
  public record WriteStats(int chunks, long bytes, int replicaWrites, int manifestAcks) {}

  private static final ObjectMapper JSON = new ObjectMapper();
  private static final String EPOCH_HEADER = "X-Statestore-Epoch";

  private final List<String> seeds;
  private final RingAccess access;
  private final HttpClient http;
  private final Duration requestTimeout;
  private final int concurrency;
  private final AtomicLong seenEpoch = new AtomicLong();
  private volatile View view;

  public RingWriter(List<String> seeds, Duration connectTimeout, Duration requestTimeout, int concurrency) {
    this(seeds, connectTimeout, requestTimeout, concurrency, RingAccess.NONE);
  }

  RingWriter(List<String> seeds, Duration connectTimeout, Duration requestTimeout, int concurrency,
      RingAccess access) {
    if (seeds.isEmpty()) {
      throw new IllegalArgumentException("give at least one seed HOST:PORT");
    }
    this.seeds = List.copyOf(seeds);
    this.access = access;
    this.requestTimeout = requestTimeout;
    this.concurrency = Math.max(1, concurrency);
    this.http = access.configure(HttpClient.newBuilder())
        .version(HttpClient.Version.HTTP_1_1)
        .connectTimeout(connectTimeout)
        .build();
  }

  public RingWriter(List<String> seeds) {
    this(seeds, Duration.ofSeconds(5), Duration.ofSeconds(120), 8);
  }

  /** Fetch the ring view from any known node (live members first, then the seeds). */
  public View refresh() {
    Set<String> candidates = new LinkedHashSet<>();
    View current = view;
    if (current != null) {
      candidates.addAll(current.liveAddresses());
    }
    candidates.addAll(seeds);
    List<String> errors = new ArrayList<>();
    for (String address : candidates) {
      HttpResponse<byte[]> resp;
      try {
        resp = send(access.request(address, "/v1/ring").timeout(Duration.ofSeconds(3))
            .GET().build(), address).join();
      } catch (CompletionException e) {
        errors.add(String.valueOf(e.getCause().getMessage()));
        continue;
      }
      if (resp.statusCode() != 200) {
        errors.add(errorOf(resp, address).getMessage());
        continue;
      }
      View fresh;
      try {
        fresh = View.fromJson(JSON.readTree(resp.body()));
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

  /** The HTTP client the writer sends with (shared by the provider's direct reads). */
  HttpClient http() {
    return http;
  }

  /** Record a ring epoch a node reported (a newer one makes {@link #view} refresh). */
  void sawEpoch(long epoch) {
    seenEpoch.accumulateAndGet(epoch, Math::max);
  }

  /** The current view, refreshed when a node reported a newer ring epoch. */
  public View view() {
    View v = view;
    if (v == null || seenEpoch.get() > v.epoch) {
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
    View v = view();
    try {
      return writeOn(v, manifest, chunks, retain);
    } catch (RingException e) {
      if (!e.unavailable()) {
        throw e;
      }
      View fresh = refresh();
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

  private WriteStats writeOn(View v, ManifestCodec.Manifest m, List<ChunkCodec.Chunk> chunks, int retain) {
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
  public int putChunks(View v, String store, long version, List<ChunkCodec.Chunk> chunks) {
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
              quorumOf(v.replicasOf(key), v.futureReplicasOf(key), v.writeQuorum),
              CHUNK_FINAL)
          .whenComplete((r, e) -> sem.release())
          .thenApply(r -> {
            for (RingException e : r.errors) {
              if (e.code().equals("quota_exceeded")) {
                throw e; // the query is over its quota on a replica: final, not an outage
              }
            }
            checkWriteSets("chunk " + key, r.acked, v.replicasOf(key), v.futureReplicasOf(key),
                v.writeQuorum, r.errors);
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
  public int putManifest(View v, ManifestCodec.Manifest m) {
    return putManifest(v, m, 0);
  }

  /** {@link #putManifest(View, ManifestCodec.Manifest)} with {@code ?retain=N} when N > 0. */
  public int putManifest(View v, ManifestCodec.Manifest m, int retain) {
    List<String> targets = v.writeReplicasOf(m.store());
    String path = "/v1/manifests/" + m.store() + "/" + m.version() + "/" + m.kind()
        + (retain > 0 ? "?retain=" + retain : "");
    Puts r = putEverywhere(targets, path, ManifestCodec.encode(m), "application/msgpack",
        RingWriter::manifestAck,
        quorumOf(v.replicasOf(m.store()), v.futureReplicasOf(m.store()), v.writeQuorum),
        MANIFEST_FINAL).join();
    for (RingException e : r.errors) {
      if (e.code().equals("stale_epoch") || e.code().equals("version_conflict")
          || e.code().equals("quota_exceeded")) {
        throw e;
      }
    }
    checkWriteSets("manifest of " + m.store() + " v" + m.version(), r.acked, v.replicasOf(m.store()),
        v.futureReplicasOf(m.store()), v.writeQuorum, r.errors);
    return r.acked.size();
  }

  /**
   * Throw quorum_not_reached unless W of the current owners <em>and</em> W of the future owners
   * acknowledged ({@code acked}: the addresses that did), naming the set that fell short: the
   * rule of Python's {@code core/quorum.check_write_sets}. With nobody moving the two sets are
   * one.
   */
  static void checkWriteSets(String what, Set<String> acked, List<String> current,
      List<String> future, int w, List<RingException> errors) {
    checkWrite(what, countIn(current, acked), w, current.size(), errors);
    if (!future.equals(current)) {
      checkWrite(what + " (on its owners after the move)", countIn(future, acked), w, future.size(),
          errors);
    }
  }

  private static int countIn(List<String> addresses, Set<String> acked) {
    int n = 0;
    for (String a : addresses) {
      if (acked.contains(a)) {
        n++;
      }
    }
    return n;
  }

  private static void checkWrite(String what, int acks, int w, int placed, List<RingException> errors) {
    if (acks >= w) {
      return;
    }
    Set<String> msgs = new TreeSet<>();
    for (RingException e : errors) {
      msgs.add(e.getMessage());
    }
    String why = msgs.isEmpty() ? "no replica answered" : String.join("; ", msgs);
    if (placed < w) {
      why = "the ring has only " + placed + " live node(s) for it; " + why;
    }
    throw new RingException("quorum_not_reached", what + " reached " + acks + " of the " + w
        + " replicas it needs (W): " + why + ". Nothing was acknowledged; retry when the ring has"
        + " enough live nodes");
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

  /** W acknowledgements from the current owners and W from the future ones. */
  private static Predicate<Set<String>> quorumOf(List<String> current, List<String> future, int w) {
    int needCurrent = Math.min(w, current.size());
    int needFuture = Math.min(w, future.size());
    return acked -> countIn(current, acked) >= needCurrent && countIn(future, acked) >= needFuture;
  }

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
      HttpRequest.Builder b = access.request(a, path).timeout(requestTimeout)
          .PUT(HttpRequest.BodyPublishers.ofByteArray(body));
      if (contentType != null) {
        b.header("Content-Type", contentType);
      }
      each.add(send(b.build(), a).handle((resp, err) -> {
        if (err != null) {
          return asRing(err instanceof CompletionException ? err.getCause() : err);
        }
        int s = resp.statusCode();
        if (s != 200 && s != 201) {
          return errorOf(resp, a);
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

  private CompletableFuture<HttpResponse<byte[]>> send(HttpRequest req, String address) {
    return http.sendAsync(req, HttpResponse.BodyHandlers.ofByteArray()).handle((resp, err) -> {
      if (err != null) {
        Throwable cause = err instanceof CompletionException ? err.getCause() : err;
        if (cause instanceof HttpTimeoutException) {
          throw new RingException("timeout", req.method() + " " + req.uri() + " took longer than "
              + req.timeout().map(Duration::toString).orElse("its deadline")
              + ": the node is slow or stuck");
        }
        throw new RingException("node_unavailable", "node " + address + " is unreachable ("
            + cause.getClass().getSimpleName() + ": " + cause.getMessage()
            + "); check that it runs, or let the ring route around it");
      }
      resp.headers().firstValue(EPOCH_HEADER).ifPresent(h -> {
        try {
          seenEpoch.accumulateAndGet(Long.parseLong(h.trim()), Math::max);
        } catch (NumberFormatException ignored) {
          // a garbled header is not a newer epoch
        }
      });
      return resp;
    });
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

  private static RingException errorOf(HttpResponse<byte[]> resp, String address) {
    int status = resp.statusCode();
    try {
      JsonNode err = JSON.readTree(resp.body()).get("error");
      return new RingException(err.get("code").asText(),
          err.get("message").asText() + " (from " + address + ")");
    } catch (IOException | RuntimeException e) {
      String text = new String(resp.body(), 0, Math.min(200, resp.body().length), StandardCharsets.UTF_8);
      return new RingException(status >= 500 ? "node_unavailable" : "error",
          "node " + address + " answered " + status + ": " + text);
    }
  }
}
