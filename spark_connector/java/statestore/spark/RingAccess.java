package statestore.spark;

import java.io.IOException;
import java.io.InputStream;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyStore;
import java.security.MessageDigest;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.util.Collection;
import java.util.HexFormat;

import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

/**
 * How the provider reaches the nodes of a ring with security on (docs/security.md): a bearer
 * token on every request ({@code spark.statestore.token}, or the first line of the file named
 * by {@code spark.statestore.tokenFile}), and HTTPS verified against the CA certificates of a
 * PEM file ({@code spark.statestore.tlsCa}), host names included, as the Python SDK does.
 * Without a CA the ring is reached over plain HTTP. Every request of both data paths (the
 * coordinator endpoints of {@link RingHttp}, the direct chunk and manifest traffic of
 * {@link RingWriter} and {@link RingDirect}) is built here.
 */
final class RingAccess {
  /** Plain HTTP, no token: a ring without {@code --auth-file} or {@code --tls-cert}. */
  static final RingAccess NONE = new RingAccess(null, null, "");

  private final String authorization;
  private final SSLContext tls;
  private final String caFile;

  private RingAccess(String token, SSLContext tls, String caFile) {
    this.authorization = token == null ? null : "Bearer " + token;
    this.tls = tls;
    this.caFile = caFile;
  }

  /**
   * The access a ring's options describe: {@code token} (or, when empty, the one in
   * {@code tokenFile}) and the PEM CA file {@code tlsCa} ("" = plain HTTP). Throws
   * IllegalArgumentException naming the option and the file that cannot be used.
   */
  static RingAccess of(String token, String tokenFile, String tlsCa) {
    String t = token == null ? "" : token.trim();
    if (t.isEmpty() && tokenFile != null && !tokenFile.isBlank()) {
      try {
        t = Files.readString(Path.of(tokenFile.trim()), StandardCharsets.UTF_8).trim();
      } catch (IOException | RuntimeException e) {
        throw new IllegalArgumentException(
            "RingStateStoreProvider: cannot read " + RingConfig.PREFIX + "tokenFile " + tokenFile
                + " (" + e + "): it must exist on the driver and every executor");
      }
      if (t.isEmpty()) {
        throw new IllegalArgumentException(
            "RingStateStoreProvider: " + RingConfig.PREFIX + "tokenFile " + tokenFile + " is empty");
      }
    }
    if (!t.isEmpty() && !t.chars().allMatch(c -> c > 0x20 && c < 0x7f)) {
      throw new IllegalArgumentException(
          "RingStateStoreProvider: the token in " + RingConfig.PREFIX
              + "token(File) has spaces or characters outside printable ASCII");
    }
    String ca = tlsCa == null ? "" : tlsCa.trim();
    return new RingAccess(t.isEmpty() ? null : t, ca.isEmpty() ? null : trusting(ca), ca);
  }

  /** An SSLContext that trusts exactly the certificates of the PEM file {@code caFile}. */
  private static SSLContext trusting(String caFile) {
    try (InputStream in = Files.newInputStream(Path.of(caFile))) {
      Collection<? extends Certificate> certs =
          CertificateFactory.getInstance("X.509").generateCertificates(in);
      if (certs.isEmpty()) {
        throw new IllegalArgumentException("no certificate in it");
      }
      KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
      store.load(null, null);
      int i = 0;
      for (Certificate c : certs) {
        store.setCertificateEntry("statestore-ca-" + i++, c);
      }
      TrustManagerFactory tmf =
          TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
      tmf.init(store);
      SSLContext ctx = SSLContext.getInstance("TLS");
      ctx.init(null, tmf.getTrustManagers(), null);
      return ctx;
    } catch (IOException | GeneralSecurityException | RuntimeException e) {
      throw new IllegalArgumentException(
          "RingStateStoreProvider: cannot use " + RingConfig.PREFIX + "tlsCa " + caFile + " ("
              + e + "): give a PEM file of the CA that signed the nodes' certificates, present "
              + "on the driver and every executor");
    }
  }

  /** {@code builder} set to verify nodes against the CA (unchanged for plain HTTP). */
  HttpClient.Builder configure(HttpClient.Builder builder) {
    return tls == null ? builder : builder.sslContext(tls);
  }

  /** A request to {@code path} (with its query) on the node at {@code address}, token set. */
  HttpRequest.Builder request(String address, String path) {
    HttpRequest.Builder b = HttpRequest.newBuilder(uri(address, path));
    return authorization == null ? b : b.header("Authorization", authorization);
  }

  /** The address of {@code path} (with its query) on the node at {@code address}. */
  URI uri(String address, String path) {
    return URI.create((tls == null ? "http" : "https") + "://" + address + path);
  }

  /** The Authorization header's value, or null without a token. */
  String authorization() {
    return authorization;
  }

  /** The TLS context trusting the ring's CA, or null for plain HTTP. */
  SSLContext tls() {
    return tls;
  }

  /** Tells clients apart in the provider's caches without keeping the token in the key. */
  String key() {
    if (authorization == null && tls == null) {
      return "";
    }
    try {
      byte[] d = MessageDigest.getInstance("SHA-256").digest(
          ((authorization == null ? "" : authorization) + "\n" + caFile).getBytes(StandardCharsets.UTF_8));
      return HexFormat.of().formatHex(d, 0, 8);
    } catch (GeneralSecurityException e) {
      throw new IllegalStateException(e);
    }
  }
}
