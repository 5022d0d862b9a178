package statestore.spark;

import java.io.IOException;
import java.io.InputStream;
import java.util.concurrent.TimeUnit;

import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.SSLSocket;

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
 * GET per key it touches. Used when {@link RingTransport} finds Apache's classes on the
 * classpath; otherwise it sends these GETs through java.net.http as before. Verifies HTTPS
 * against the ring's CA, host names checked in the handshake as java.net.http does.
 */
final class PooledGets implements AutoCloseable {
  private static final int MAX_CONNECTIONS = 4096;

  /**
   * HTTPS sockets that check the node's host name in the handshake as java.net.http does
   * (endpoint identification "HTTPS": an IP address must be among the certificate's subject
   * alternative names), then Apache's verifier as well (which alone would also take a
   * certificate's CN).
   */
  private static final class VerifyingSockets extends SSLConnectionSocketFactory {
    VerifyingSockets(SSLContext tls) {
      super(tls, new DefaultHostnameVerifier());
    }

    @Override
    protected void prepareSocket(SSLSocket socket) throws IOException {
      SSLParameters params = socket.getSSLParameters();
      params.setEndpointIdentificationAlgorithm("HTTPS");
      socket.setSSLParameters(params);
    }
  }

  private final CloseableHttpClient client;
  private final RingAccess access;
  private final int connectTimeoutMs;

  PooledGets(RingAccess access, long connectTimeoutMs) {
    this.access = access;
    this.connectTimeoutMs = (int) Math.max(1, Math.min(Integer.MAX_VALUE, connectTimeoutMs));
    RegistryBuilder<ConnectionSocketFactory> schemes = RegistryBuilder.<ConnectionSocketFactory>create()
        .register("http", PlainConnectionSocketFactory.getSocketFactory());
    if (access.tls() != null) {
      schemes.register("https", new VerifyingSockets(access.tls()));
    }
    PoolingHttpClientConnectionManager pool = new PoolingHttpClientConnectionManager(schemes.build());
    // no cap in practice, as java.net.http has none: a connection per reading thread and node
    // (a restoring task reads with 8 threads)
    pool.setMaxTotal(MAX_CONNECTIONS);
    pool.setDefaultMaxPerRoute(MAX_CONNECTIONS);
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
   * GET {@code path} on {@code address}: the status and the whole body (at most
   * {@code maxBytes}, else an IOException, the rest unread). The wait for a pooled
   * connection, the connection and the answer's headers are bounded together by
   * {@code timeoutMs}, the body by {@code stallMs} without a byte, everything by
   * {@code deadline} (System.nanoTime): a {@link Watchdog} guard aborts the exchange (closing
   * its socket) past any of them, or when the task thread is interrupted (then an
   * InterruptedException). Any failure aborts the exchange: closing a body read halfway
   * would first read the rest of it.
   */
  RingTransport.Answer get(String address, String path, long timeoutMs, long deadline,
      long stallMs, long maxBytes, RingTransport transport)
      throws IOException, InterruptedException {
    if (Thread.interrupted()) {
      throw new InterruptedException("GET " + path + ": the task was interrupted");
    }
    HttpGet req = new HttpGet(access.uri(address, path));
    String auth = access.authorization();
    if (auth != null) {
      req.setHeader("Authorization", auth);
    }
    int wait = (int) Math.max(1, Math.min(Integer.MAX_VALUE, timeoutMs));
    req.setConfig(RequestConfig.custom()
        .setConnectTimeout(Math.min(connectTimeoutMs, wait))
        .setConnectionRequestTimeout(wait)
        // a read's own limit, the larger of the two phases' (the watchdog holds each to its own)
        .setSocketTimeout((int) Math.min(Integer.MAX_VALUE, Math.max(wait, stallMs)))
        .build());
    long now = System.nanoTime();
    long headersBy = Math.min(deadline, now + wait * 1_000_000L);
    String late = headersBy == deadline ? "the restore deadline passed"
        : "no answer within " + wait + " ms (requestTimeoutMs)";
    Watchdog.Guard guard = Watchdog.watchExchange(req::abort, headersBy, late, wait);
    boolean done = false;
    try {
      CloseableHttpResponse resp = client.execute(req);
      guard.check(); // the watchdog may have cut it just as it answered
      guard.phase(deadline, stallMs);
      Header epoch = resp.getFirstHeader(RingTransport.EPOCH_HEADER);
      if (epoch != null) {
        transport.sawEpoch(epoch.getValue());
      }
      HttpEntity entity = resp.getEntity();
      byte[] body = new byte[0];
      if (entity != null) {
        InputStream in = entity.getContent();
        body = RingTransport.readAtMost(guard.stream(in), maxBytes, path);
        guard.check(); // a cut body can look like a clean end
        in.close(); // at its end: the connection goes back to the pool
      }
      resp.close();
      done = true;
      return new RingTransport.Answer(resp.getStatusLine().getStatusCode(), body);
    } catch (IOException e) {
      // the watchdog's cause, not the socket's "closed" or the client's "aborted"
      String why = guard.reason();
      if (Watchdog.INTERRUPTED.equals(why) || Thread.interrupted()) {
        // thrown as java.net.http throws it: the thread's interrupt status cleared
        Thread.interrupted();
        InterruptedException out = new InterruptedException("GET " + path + " interrupted");
        out.initCause(e);
        throw out;
      }
      if (why != null) {
        throw new IOException("read cut: " + why, e);
      }
      throw e;
    } finally {
      guard.close();
      if (!done) {
        req.abort();
      }
    }
  }

  @Override
  public void close() throws IOException {
    client.close();
  }
}
