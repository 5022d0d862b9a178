package statestore.spark;

import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.net.http.HttpTimeoutException;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The transport seam of the provider, as Python's {@code net/transport.py}: every request
 * either data path makes ({@link RingHttp}'s coordinator calls, {@link RingWriter}'s and
 * {@link RingDirect}'s replica traffic) is built and sent here, over one java.net.http client
 * per owner ({@link RingAccess}: token, HTTPS with a CA), except the direct path's blocking
 * chunk reads ({@link #get}), which go over {@link PooledGets}. The ring epoch header of the answers
 * is noted ({@link #seenEpoch}: a newer one makes the writer refresh its view). Failures map
 * onto the error table of {@link RingErrors}: an unreachable node is {@code node_unavailable},
 * a deadline {@code timeout} ({@link #replicaSend}), an error body the code the node sent.
 * The one backoff between retry rounds ({@link #backoff}) is here too.
 */
final class RingTransport {
  static final String EPOCH_HEADER = "X-Statestore-Epoch";

  private final RingAccess access;
  private final HttpClient client;
  private final Duration connectTimeout;
  /**
   * The direct path's GETs over kept-alive pooled connections, made on the first
   * {@link #get} (a transport that never reads a chunk, {@link RingHttp}'s, has none); null
   * until then, or for good when {@link #pooledUsable} says no.
   */
  private volatile PooledGets pooled;
  private volatile boolean pooledChecked;
  private final AtomicLong seenEpoch = new AtomicLong();

  RingTransport(RingAccess access, Duration connectTimeout) {
    this.access = access;
    this.client = access.configure(HttpClient.newBuilder())
        .version(HttpClient.Version.HTTP_1_1)
        .connectTimeout(connectTimeout)
        .build();
    this.connectTimeout = connectTimeout;
  }

  /**
   * The JVM system property that turns the pooled client off
   * ({@code -Dstatestore.spark.httpClient=jdk}: every GET through java.net.http, as before):
   * an escape hatch, and the baseline of {@code bench/spark_large_state.py}'s
   * {@code ring-lazy-jdk}.
   */
  static final String HTTP_CLIENT_PROPERTY = "statestore.spark.httpClient";

  /**
   * Whether {@link PooledGets} can be used: Apache HttpClient is on the classpath and
   * {@link #HTTP_CLIENT_PROPERTY} is not {@code jdk}. Here, not in PooledGets: linking that
   * class needs Apache's classes, so asking it would fail where they are missing.
   */
  private static boolean pooledUsable() {
    if ("jdk".equalsIgnoreCase(System.getProperty(HTTP_CLIENT_PROPERTY, "").trim())) {
      return false;
    }
    ClassLoader loader = RingTransport.class.getClassLoader();
    try {
      Class.forName("org.apache.http.impl.conn.PoolingHttpClientConnectionManager", false, loader);
      Class.forName("org.apache.http.impl.client.HttpClients", false, loader);
      return true;
    } catch (ClassNotFoundException | LinkageError e) {
      return false;
    }
  }

  /** The pooled client, made once if it can be ({@link #pooledUsable}); else null. */
  private PooledGets pooledGets() {
    if (!pooledChecked) {
      synchronized (this) {
        if (!pooledChecked) {
          try {
            pooled = pooledUsable() ? new PooledGets(access, connectTimeout.toMillis()) : null;
          } catch (LinkageError e) {
            pooled = null; // a partial or incompatible Apache HttpClient: java.net.http then
          }
          pooledChecked = true;
        }
      }
    }
    return pooled;
  }

  /** A GET's status and whole body. */
  record Answer(int status, byte[] body) {}

  /**
   * GET {@code path} on {@code address} and read the whole body: the direct read path's one
   * blocking request (a block, a chunk). {@code timeoutMs} bounds the wait for the answer,
   * {@code deadline} (System.nanoTime) and {@code stallMs} the body ({@link Watchdog}). Sent
   * over {@link PooledGets} when Apache HttpClient is on the classpath (Spark ships it),
   * else through java.net.http. A body longer than {@code maxBytes} is an IOException, read
   * no further.
   */
  Answer get(String address, String path, long timeoutMs, long deadline, long stallMs,
      long maxBytes) throws IOException, InterruptedException {
    PooledGets p = pooledGets();
    if (p != null) {
      return p.get(address, path, timeoutMs, deadline, stallMs, maxBytes, this);
    }
    HttpRequest req = request(address, path).timeout(Duration.ofMillis(Math.max(1, timeoutMs)))
        .GET().build();
    HttpResponse<InputStream> resp = send(req, HttpResponse.BodyHandlers.ofInputStream());
    try (InputStream body = resp.body();
        Watchdog.Guard guard = Watchdog.watch(body, deadline, stallMs)) {
      byte[] data;
      try {
        data = readAtMost(guard.stream(body), maxBytes, path);
      } catch (IOException e) {
        guard.check();
        throw e;
      }
      guard.check();
      return new Answer(resp.statusCode(), data);
    }
  }

  /**
   * POST {@code body} to {@code path} on {@code address} and read the whole answer, bounded as
   * {@link #get} bounds it, through java.net.http (a read-ahead's lookups: few and large).
   */
  Answer post(String address, String path, byte[] body, String contentType, long timeoutMs,
      long deadline, long stallMs, long maxBytes) throws IOException, InterruptedException {
    HttpRequest req = request(address, path).timeout(Duration.ofMillis(Math.max(1, timeoutMs)))
        .header("Content-Type", contentType)
        .POST(HttpRequest.BodyPublishers.ofByteArray(body)).build();
    HttpResponse<InputStream> resp = send(req, HttpResponse.BodyHandlers.ofInputStream());
    try (InputStream in = resp.body();
        Watchdog.Guard guard = Watchdog.watch(in, deadline, stallMs)) {
      byte[] data;
      try {
        data = readAtMost(guard.stream(in), maxBytes, path);
      } catch (IOException e) {
        guard.check();
        throw e;
      }
      guard.check();
      return new Answer(resp.statusCode(), data);
    }
  }

  /** The whole of {@code in}, or an IOException once it passes {@code maxBytes}. */
  static byte[] readAtMost(InputStream in, long maxBytes, String what) throws IOException {
    int cap = (int) Math.min(Integer.MAX_VALUE - 8, Math.max(0, maxBytes));
    byte[] out = in.readNBytes(cap);
    if (in.read() != -1) {
      throw new IOException("the answer to " + what + " is longer than the " + cap
          + " bytes expected: refused unread");
    }
    return out;
  }


  /** A request to {@code path} (with its query) on the node at {@code address}, token set. */
  HttpRequest.Builder request(String address, String path) {
    return access.request(address, path);
  }

  /** Send and wait; the answer's epoch is noted. */
  <T> HttpResponse<T> send(HttpRequest req, HttpResponse.BodyHandler<T> body)
      throws IOException, InterruptedException {
    HttpResponse<T> resp = client.send(req, body);
    sawEpoch(resp);
    return resp;
  }

  /**
   * Send without waiting: the client's own future, so that cancelling it aborts the exchange;
   * the caller notes the answer's epoch ({@link #sawEpoch(HttpResponse)}), a failure is the
   * client's own exception.
   */
  <T> CompletableFuture<HttpResponse<T>> sendAsync(
      HttpRequest req, HttpResponse.BodyHandler<T> body) {
    return client.sendAsync(req, body);
  }

  /**
   * Send to the replica at {@code address} without waiting, a failure to get an answer
   * mapped onto the error table: a deadline is {@code timeout}, anything else (refused, reset,
   * TLS) {@code node_unavailable}; both are {@link RingErrors.RingException}s.
   */
  CompletableFuture<HttpResponse<byte[]>> replicaSend(HttpRequest req, String address) {
    return client.sendAsync(req, HttpResponse.BodyHandlers.ofByteArray()).handle((resp, err) -> {
      if (err != null) {
        Throwable cause = err instanceof CompletionException ? err.getCause() : err;
        if (cause instanceof HttpTimeoutException) {
          throw new RingErrors.RingException(RingErrors.Kind.RequestTimeout.code,
              req.method() + " " + req.uri() + " took longer than "
              + req.timeout().map(Duration::toString).orElse("its deadline")
              + ": the node is slow or stuck");
        }
        throw new RingErrors.RingException(RingErrors.Kind.NodeUnavailable.code, "node " + address
            + " is unreachable (" + cause.getClass().getSimpleName() + ": " + cause.getMessage()
            + "); check that it runs, or let the ring route around it");
      }
      sawEpoch(resp);
      return resp;
    });
  }

  /** Note the ring epoch an answer carried (a garbled header is no newer epoch). */
  void sawEpoch(HttpResponse<?> resp) {
    resp.headers().firstValue(EPOCH_HEADER).ifPresent(this::sawEpoch);
  }

  /** Note the ring epoch of an answer's epoch header (a garbled one is no newer epoch). */
  void sawEpoch(String header) {
    try {
      sawEpoch(Long.parseLong(header.trim()));
    } catch (NumberFormatException ignored) {
      // a garbled header is not a newer epoch
    }
  }

  /** Record a ring epoch a node reported. */
  void sawEpoch(long epoch) {
    seenEpoch.accumulateAndGet(epoch, Math::max);
  }

  /** The highest ring epoch any answer carried. */
  long seenEpoch() {
    return seenEpoch.get();
  }

  /**
   * Sleep before retry round {@code round} (1, 2, ...): exponential backoff with full jitter
   * over the upper half, 100 ms doubling to 5 s, never more than {@code leftMs}.
   */
  static void backoff(int round, long leftMs) throws IOException {
    long cap = Math.min(5_000L, 100L << Math.min(round - 1, 6));
    long ms = Math.min(leftMs, ThreadLocalRandom.current().nextLong(cap / 2, cap + 1));
    try {
      Thread.sleep(Math.max(0, ms));
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IOException("interrupted while waiting to retry", e);
    }
  }

  /** A failure in a few words for a message ({@code null}: nothing was reachable). */
  static String describe(Throwable e) {
    if (e == null) {
      return "no ring member reachable";
    }
    String msg = e.getMessage();
    if (e instanceof EOFException) {
      return "connection closed early";
    }
    return e.getClass().getSimpleName() + (msg == null ? "" : ": " + msg);
  }
}
