package statestore.spark;

import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentHashMap;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

/**
 * The ring as the provider sees it: the coordinator endpoints of docs/api.md over
 * java.net.http. Any live member coordinates; a request that cannot reach one (connection
 * error, 5xx) goes to the next member, and the member list is refreshed from
 * {@code GET /v1/ring} when a whole round failed.
 */
final class RingHttp {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final ConcurrentHashMap<String, RingHttp> SHARED = new ConcurrentHashMap<>();

  /** A failure the ring reported in its own words (4xx/5xx with an error code). */
  static final class RingError extends IOException {
    final int status;
    final String code;

    RingError(int status, String code, String message) {
      super(message);
      this.status = status;
      this.code = code;
    }

    boolean retryable() {
      return status >= 500;
    }
  }

  /** What a restore returned besides the rows. */
  static final class Restored {
    long version;
    long writerEpoch;
    long rows;
    long bytes;
  }

  private final RingConfig config;
  private final HttpClient client;
  private volatile List<String> members;

  private RingHttp(RingConfig config) {
    this.config = config;
    this.client =
        HttpClient.newBuilder()
            .version(HttpClient.Version.HTTP_1_1)
            .connectTimeout(Duration.ofMillis(config.connectTimeoutMs))
            .build();
    this.members = List.copyOf(config.seeds);
  }

  static RingHttp shared(RingConfig config) {
    String key =
        String.join(",", config.seeds) + "|" + config.connectTimeoutMs + "|" + config.requestTimeoutMs
            + "|" + config.maxAttempts;
    return SHARED.computeIfAbsent(key, k -> new RingHttp(config));
  }

  /** Learn the ring's live members from the first seed or member that answers. */
  synchronized void refresh() throws IOException {
    List<String> candidates = new ArrayList<>(config.seeds);
    for (String m : members) {
      if (!candidates.contains(m)) {
        candidates.add(m);
      }
    }
    StringBuilder errors = new StringBuilder();
    for (String address : candidates) {
      try {
        HttpRequest req =
            HttpRequest.newBuilder(URI.create("http://" + address + "/v1/ring"))
                .timeout(Duration.ofMillis(Math.min(config.requestTimeoutMs, 10_000)))
                .GET()
                .build();
        HttpResponse<byte[]> resp = client.send(req, HttpResponse.BodyHandlers.ofByteArray());
        if (resp.statusCode() != 200) {
          errors.append(address).append(": HTTP ").append(resp.statusCode()).append("; ");
          continue;
        }
        JsonNode view = JSON.readTree(resp.body());
        List<String> up = new ArrayList<>();
        for (JsonNode m : view.path("members")) {
          if ("up".equals(m.path("status").asText())) {
            up.add(m.path("address").asText());
          }
        }
        if (!up.isEmpty()) {
          members = List.copyOf(up);
          return;
        }
        errors.append(address).append(": no member is up; ");
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IOException("interrupted while asking the ring for its members", e);
      } catch (IOException | IllegalArgumentException e) {
        errors.append(address).append(": ").append(describe(e)).append("; ");
      }
    }
    throw new IOException(
        "no statestore node answered at " + String.join(",", candidates) + " (" + errors
            + "): check " + RingConfig.PREFIX + "seeds and that the ring is running");
  }

  private volatile boolean learned;

  private List<String> route(String storePath) {
    if (!learned) {
      try {
        refresh();
      } catch (IOException e) {
        // keep the seeds: the request itself reports what is unreachable
      }
      learned = true;
    }
    List<String> ms = members;
    List<String> out = new ArrayList<>(ms.size());
    int start = Math.floorMod(storePath.hashCode(), ms.size());
    for (int i = 0; i < ms.size(); i++) {
      out.add(ms.get((start + i) % ms.size()));
    }
    return out;
  }

  /** One try of a request against one member. */
  private interface Attempt<T> {
    T call(String address) throws IOException, InterruptedException;
  }

  /** A failure after part of an answer was handed over: retrying would hand it over twice. */
  private static final class BrokeOff extends IOException {
    BrokeOff(String message, Throwable cause) {
      super(message, cause);
    }
  }

  /**
   * Try {@code attempt} on each member in the store's order; after a round in which every
   * member failed (unreachable or 5xx), refresh the member list and go again, up to
   * maxAttempts rounds. A 4xx is the ring's answer and is thrown at once.
   */
  private <T> T withRetries(String what, String storePath, Attempt<T> attempt)
      throws IOException {
    IOException last = null;
    for (int round = 0; round < config.maxAttempts; round++) {
      if (round > 0) {
        try {
          refresh();
        } catch (IOException e) {
          last = e;
          sleep(round);
          continue;
        }
      }
      for (String address : route(storePath)) {
        try {
          return attempt.call(address);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          throw new IOException("interrupted during " + what, e);
        } catch (RingError e) {
          if (!e.retryable()) {
            throw e;
          }
          last = e;
        } catch (BrokeOff e) {
          throw e;
        } catch (IOException e) {
          last = new IOException(address + ": " + describe(e), e);
        }
      }
    }
    throw new IOException(
        what + " failed on every ring member after " + config.maxAttempts + " rounds: "
            + describe(last),
        last);
  }

  /** POST the framed rows as version {@code version}; returns the node's JSON answer. */
  JsonNode commit(String storePath, long version, long epoch, boolean snapshot, byte[] body)
      throws IOException {
    String query =
        "/v1/stores/" + storePath + "/commit?version=" + version + "&epoch=" + epoch
            + (snapshot ? "&snapshot=1" : "");
    return withRetries("commit of " + storePath + " version " + version, storePath, address -> {
      HttpRequest req =
          HttpRequest.newBuilder(URI.create("http://" + address + query))
              .timeout(Duration.ofMillis(config.requestTimeoutMs))
              .header("Content-Type", "application/octet-stream")
              .header("X-Statestore-Positions", "{\"spark_state_version\":" + version + "}")
              .POST(HttpRequest.BodyPublishers.ofByteArray(body))
              .build();
      HttpResponse<byte[]> resp = client.send(req, HttpResponse.BodyHandlers.ofByteArray());
      if (resp.statusCode() == 201 || resp.statusCode() == 200) {
        return JSON.readTree(resp.body());
      }
      throw error(address, resp.statusCode(), resp.body());
    });
  }

  /** Stream version {@code version} of a store into {@code sink}. */
  Restored restore(String storePath, long version, RowFraming.RowSink sink) throws IOException {
    String what = "restore of " + storePath + " version " + version;
    String query =
        "/v1/stores/" + storePath + "/state?version=" + version + "&plan=" + config.restorePlan;
    return withRetries(what, storePath, address -> {
      HttpRequest req =
          HttpRequest.newBuilder(URI.create("http://" + address + query))
              .timeout(Duration.ofMillis(config.requestTimeoutMs))
              .GET()
              .build();
      HttpResponse<InputStream> resp = client.send(req, HttpResponse.BodyHandlers.ofInputStream());
      try (InputStream body = resp.body()) {
        if (resp.statusCode() != 200) {
          throw error(address, resp.statusCode(), body.readAllBytes());
        }
        Restored out = new Restored();
        out.version = header(resp, "X-Statestore-Version", version);
        out.writerEpoch = header(resp, "X-Statestore-Writer-Epoch", 0);
        try {
          RowFraming.Counts counts = new RowFraming.Counts();
          RowFraming.read(body, sink, counts);
          out.rows = counts.rows;
          out.bytes = counts.bytes;
        } catch (IOException e) {
          // rows were already handed over: the caller must start from an empty map again
          throw new BrokeOff(what + " broke off at " + address + ": " + describe(e), e);
        }
        return out;
      }
    });
  }

  /** The head a member knows of ({@code null} if it has none). */
  long[] head(String storePath) {
    for (String address : route(storePath)) {
      try {
        HttpRequest req =
            HttpRequest.newBuilder(URI.create("http://" + address + "/v1/stores/" + storePath + "/head"))
                .timeout(Duration.ofMillis(Math.min(config.requestTimeoutMs, 10_000)))
                .GET()
                .build();
        HttpResponse<byte[]> resp = client.send(req, HttpResponse.BodyHandlers.ofByteArray());
        if (resp.statusCode() == 200) {
          JsonNode h = JSON.readTree(resp.body());
          return new long[] {h.path("version").asLong(), h.path("epoch").asLong()};
        }
        if (resp.statusCode() == 404) {
          return null;
        }
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return null;
      } catch (IOException | IllegalArgumentException e) {
        // try the next member
      }
    }
    return null;
  }

  private static long header(HttpResponse<?> resp, String name, long dflt) {
    return resp.headers().firstValue(name).map(v -> {
      try {
        return Long.parseLong(v.trim());
      } catch (NumberFormatException e) {
        return dflt;
      }
    }).orElse(dflt);
  }

  private static RingError error(String address, int status, byte[] body) {
    String code = "http_" + status;
    String message = new String(body, StandardCharsets.UTF_8);
    try {
      JsonNode err = JSON.readTree(body).path("error");
      if (err.has("code")) {
        code = err.path("code").asText();
        message = err.path("message").asText();
      }
    } catch (IOException | RuntimeException e) {
      // not our JSON: keep the raw text
    }
    return new RingError(status, code, address + " answered " + status + " " + code + ": " + message);
  }

  private static String describe(Throwable e) {
    if (e == null) {
      return "no ring member reachable";
    }
    String msg = e.getMessage();
    if (e instanceof EOFException) {
      return "connection closed early";
    }
    return e.getClass().getSimpleName() + (msg == null ? "" : ": " + msg);
  }

  private static void sleep(int attempt) {
    try {
      Thread.sleep(Math.min(2_000L, 200L * attempt));
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }
}
