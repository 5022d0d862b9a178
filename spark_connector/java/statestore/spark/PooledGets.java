package statestore.spark;

import java.io.IOException;
import java.io.InputStream;
import java.util.concurrent.TimeUnit;

import org.apache.http.Header;
import org.apache.http.HttpEntity;
import org.apache.http.client.config.RequestConfig;
import org.apache.http.client.methods.CloseableHttpResponse;
import org.apache.http.client.methods.HttpGet;
import org.apache.http.config.RegistryBuilder;
import org.apache.http.conn.socket.ConnectionSocketFactory;
import org.apache.http.conn.socket.PlainConnectionSocketFactory;
import org.apache.http.conn.ssl.DefaultHostnameVerifier;
import org.apache.http.conn.ssl.SSLConnectionSocketFactory;
import org.apache.http.impl.client.CloseableHttpClient;
import org.apache.http.impl.client.DefaultHttpRequestRetryHandler;
import org.apache.http.impl.client.HttpClients;
import org.apache.http.impl.conn.PoolingHttpClientConnectionManager;

/**
 * The blocking GETs of the direct read path ({@link RingDirect}: a lazily loaded version's
 * blocks, one request per key not yet held, and whole chunks) over Apache HttpClient 4.5
 * (httpclient and httpcore, which Spark ships), with a pool of kept-alive connections per
 * node. java.net.http hands every exchange between its selector thread and an executor: on
 * these 2 cores that cost about 210 µs of CPU a small GET against about 50 µs here (a
 * loopback GET of 2.4 KB in a loop, warm JVM, 2026-11-28), and a lazy restart makes one such
 * GET per key it touches. Only used when the classes are on the classpath
 * ({@link #create}); otherwise {@link RingTransport} sends them through java.net.http as
 * before. Verifies HTTPS against the ring's CA, host names included, as java.net.http does.
 */
final class PooledGets implements AutoCloseable {
  private final CloseableHttpClient client;
  private final RingAccess access;
  private final int connectTimeoutMs;

  private PooledGets(RingAccess access, int connectTimeoutMs) {
    this.access = access;
    this.connectTimeoutMs = connectTimeoutMs;
    RegistryBuilder<ConnectionSocketFactory> schemes = RegistryBuilder.<ConnectionSocketFactory>create()
        .register("http", PlainConnectionSocketFactory.getSocketFactory());
    if (access.tls() != null) {
      schemes.register("https",
          new SSLConnectionSocketFactory(access.tls(), new DefaultHostnameVerifier()));
    }
    PoolingHttpClientConnectionManager pool = new PoolingHttpClientConnectionManager(schemes.build());
    // one connection per task thread and node at most; executors run a few dozen tasks at most
    pool.setMaxTotal(512);
    pool.setDefaultMaxPerRoute(64);
    // a connection idle for a second is checked before reuse (a node closes idle ones)
    pool.setValidateAfterInactivity(1_000);
    this.client = HttpClients.custom()
        .setConnectionManager(pool)
        .disableCookieManagement()
        .disableRedirectHandling()
        .disableContentCompression()
        .disableAuthCaching()
        // one resend of an idempotent GET when a kept-alive connection turned out closed
        .setRetryHandler(new DefaultHttpRequestRetryHandler(1, false))
        .evictIdleConnections(30, TimeUnit.SECONDS)
        .setUserAgent("statestore-spark")
        .build();
  }

  /**
   * The JVM system property that turns this off ({@code -Dstatestore.spark.httpClient=jdk}:
   * every GET through java.net.http, as before): an escape hatch, and the baseline of
   * {@code bench/spark_large_state.py}'s {@code ring-jdk}.
   */
  static final String PROPERTY = "statestore.spark.httpClient";

  /**
   * The pooled client, or null when Apache HttpClient is not on the classpath or
   * {@link #PROPERTY} is {@code jdk}.
   */
  static PooledGets create(RingAccess access, long connectTimeoutMs) {
    if ("jdk".equalsIgnoreCase(System.getProperty(PROPERTY, "").trim())) {
      return null;
    }
    try {
      return new PooledGets(access, (int) Math.min(Integer.MAX_VALUE, connectTimeoutMs));
    } catch (LinkageError e) {
      return null;
    }
  }

  /**
   * GET {@code path} on {@code address}: the status and the whole body (at most
   * {@code maxBytes}, else an IOException). {@code timeoutMs} bounds the connection and each
   * wait for bytes; {@code deadline} (System.nanoTime) and {@code stallMs} bound the body as
   * {@link Watchdog} does for java.net.http.
   */
  RingTransport.Answer get(String address, String path, long timeoutMs, long deadline,
      long stallMs, long maxBytes, RingTransport transport) throws IOException {
    HttpGet req = new HttpGet(access.uri(address, path));
    String auth = access.authorization();
    if (auth != null) {
      req.setHeader("Authorization", auth);
    }
    int wait = (int) Math.max(1, Math.min(Integer.MAX_VALUE, timeoutMs));
    req.setConfig(RequestConfig.custom()
        .setConnectTimeout(Math.min(connectTimeoutMs, wait))
        .setConnectionRequestTimeout(wait)
        .setSocketTimeout(wait)
        .build());
    try (CloseableHttpResponse resp = client.execute(req)) {
      Header epoch = resp.getFirstHeader(RingTransport.EPOCH_HEADER);
      if (epoch != null) {
        transport.sawEpoch(epoch.getValue());
      }
      HttpEntity entity = resp.getEntity();
      byte[] body = new byte[0];
      if (entity != null) {
        // the watchdog aborts the exchange (closing the socket) to end a stalled read
        try (InputStream in = entity.getContent();
            Watchdog.Guard guard = Watchdog.watch(in, req::abort, deadline, stallMs)) {
          try {
            body = RingTransport.readAtMost(guard.stream(), maxBytes, path);
          } catch (IOException e) {
            guard.check();
            throw e;
          }
          guard.check();
        }
      }
      return new RingTransport.Answer(resp.getStatusLine().getStatusCode(), body);
    } catch (IOException | RuntimeException e) {
      // drop the connection: closing a body read halfway would read the rest of it first
      req.abort();
      throw e;
    }
  }

  @Override
  public void close() throws IOException {
    client.close();
  }
}
