package statestore.spark;

import java.io.IOException;
import java.io.InputStream;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import statestore.spark.RingErrors.RingError;
import statestore.spark.RingErrors.Unavailable;

/**
 * The ring as the provider sees it: the coordinator endpoints of docs/api.md, sent through
 * {@link RingTransport} (errors by the table of {@link RingErrors}). Any live member
 * coordinates; a request that cannot reach one (connection error, 5xx) goes to the next
 * member, and the member list is refreshed from {@code GET /v1/ring} when a whole round
 * failed.
 */
final class RingHttp {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final ConcurrentHashMap<String, RingHttp> SHARED = new ConcurrentHashMap<>();

  /** What a restore returned besides the rows. */
  static final class Restored {
    long version;
    long writerEpoch;
    String positions = "{}";
    long rows;
    long bytes;
  }

  private final RingConfig config;
  private final RingTransport transport;
  private volatile List<String> members;

  private RingHttp(RingConfig config) {
    this.config = config;
    this.transport = new RingTransport(config.access, Duration.ofMillis(config.connectTimeoutMs));
    this.members = List.copyOf(config.seeds);
  }

  static RingHttp shared(RingConfig config) {
    String key =
        String.join(",", config.seeds) + "|" + config.connectTimeoutMs + "|" + config.requestTimeoutMs
            + "|" + config.maxAttempts + "|" + config.retryBudgetMs + "|" + config.readTimeoutMs
            + "|" + config.restoreTimeoutMs + "|" + config.restorePlan + "|" + config.access.key();
    return SHARED.computeIfAbsent(key, k -> new RingHttp(config));
  }

  /** Learn the ring's live members from the first seed or member that answers. */
  synchronized void refresh(long deadline) throws IOException {
    List<String> candidates = new ArrayList<>(config.seeds);
    for (String m : members) {
      if (!candidates.contains(m)) {
        candidates.add(m);
      }
    }
    StringBuilder errors = new StringBuilder();
    for (String address : candidates) {
      long left = (deadline - System.nanoTime()) / 1_000_000L;
      if (left <= 0) {
        errors.append("deadline passed; ");
        break;
      }
      try {
        HttpRequest req =
            transport.request(address, "/v1/ring")
                .timeout(Duration.ofMillis(Math.min(left, Math.min(config.requestTimeoutMs, 10_000))))
                .GET()
                .build();
        HttpResponse<byte[]> resp = transport.send(req, HttpResponse.BodyHandlers.ofByteArray());
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
        errors.append(address).append(": ").append(RingTransport.describe(e)).append("; ");
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
        refresh(System.nanoTime() + Math.min(config.requestTimeoutMs, 10_000) * 1_000_000L);
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

  /** One try of a request against one member, bounded by {@code timeoutMs}. */
  private interface Attempt<T> {
    T call(String address, long timeoutMs) throws IOException, InterruptedException;
  }

  /**
   * Try {@code attempt} on each member in the store's order until one succeeds, for at most
   * {@code budgetMs}: after a round in which every member failed (unreachable, timed out,
   * 5xx, cut mid-body), refresh the member list, sleep the backoff of
   * {@link RingTransport#backoff} (never past the deadline) and go again, at most
   * maxAttempts rounds. No attempt starts after the deadline; one in flight is bounded by
   * {@code attemptMs} (or the time left when {@code hard}). A 4xx is the ring's answer and
   * ({@link RingErrors#retryable}) is thrown at once.
   */
  private <T> T withRetries(
      String what, String storePath, long budgetMs, long attemptMs, boolean hard, Attempt<T> attempt)
      throws IOException {
    long deadline = System.nanoTime() + budgetMs * 1_000_000L;
    IOException last = null;
    int round = 0;
    while (true) {
      if (round > 0) {
        long left = (deadline - System.nanoTime()) / 1_000_000L;
        if (left <= 0 || round >= config.maxAttempts) {
          break;
        }
        RingTransport.backoff(round, left);
        try {
          refresh(deadline);
        } catch (IOException e) {
          last = e;
          round++;
          continue;
        }
      }
      for (String address : storePath == null ? List.of("*") : route(storePath)) {
        long left = (deadline - System.nanoTime()) / 1_000_000L;
        if (left <= 0) {
          break;
        }
        try {
          return attempt.call(address, hard ? Math.min(attemptMs, left) : attemptMs);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          throw new IOException("interrupted during " + what, e);
        } catch (RingError e) {
          if (!e.retryable()) {
            throw e;
          }
          last = e;
        } catch (IOException e) {
          last = new IOException(address + ": " + RingTransport.describe(e), e);
        }
      }
      round++;
    }
    throw new Unavailable(
        what + " failed on every ring member for " + budgetMs + " ms (" + (round) + " rounds): "
            + RingTransport.describe(last) + "; the ring may be down or overloaded (raise "
            + RingConfig.PREFIX + "retryBudgetMs to wait longer)",
        last);
  }

  /**
   * POST the framed rows as version {@code version}; returns the node's JSON answer.
   * {@code retain} ({@code > 0}) asks the ring to keep that many versions of the store
   * (Spark's {@code minBatchesToRetain}). {@code baseEpoch} is the epoch of version - 1 the
   * commit builds on (sent as {@code base_epoch}, the manifest's; {@code null}: not known).
   */
  JsonNode commit(
      String storePath, long version, long epoch, Long baseEpoch, boolean snapshot,
      String positions, int retain, byte[] body)
      throws IOException {
    String query =
        "/v1/stores/" + storePath + "/commit?version=" + version + "&epoch=" + epoch
            + (baseEpoch != null ? "&base_epoch=" + baseEpoch : "")
            + (snapshot ? "&snapshot=1" : "") + (retain > 0 ? "&retain=" + retain : "");
    return withRetries(
        "commit of " + storePath + " version " + version, storePath, config.retryBudgetMs,
        config.requestTimeoutMs, false, (address, timeoutMs) -> {
          HttpRequest req =
              transport.request(address, query)
                  .timeout(Duration.ofMillis(timeoutMs))
                  .header("Content-Type", "application/octet-stream")
                  .header("X-Statestore-Positions", positions)
                  .POST(HttpRequest.BodyPublishers.ofByteArray(body))
                  .build();
          HttpResponse<byte[]> resp = transport.send(req, HttpResponse.BodyHandlers.ofByteArray());
          if (resp.statusCode() == 201 || resp.statusCode() == 200) {
            return JSON.readTree(resp.body());
          }
          throw RingErrors.fromAnswer(address, resp.statusCode(), resp.body());
        });
  }

  /** Where a restore's rows go; {@link #begin} is called once per attempt, from scratch. */
  interface RestoreTarget {
    RowFraming.RowSink begin();
  }

  /**
   * Stream version {@code version} of a store into the target. The whole restore, every
   * attempt and backoff included, ends by {@code restoreTimeoutMs}; a body that delivers no
   * byte for {@code readTimeoutMs} is cut. A failed attempt (unreachable, 5xx, stalled or cut
   * mid-body) is retried on the next member, from an empty target.
   */
  Restored restore(String storePath, long version, RestoreTarget target) throws IOException {
    String what = "restore of " + storePath + " version " + version;
    String query =
        "/v1/stores/" + storePath + "/state?version=" + version + "&plan=" + config.restorePlan;
    long deadline = System.nanoTime() + config.restoreTimeoutMs * 1_000_000L;
    return withRetries(
        what, storePath, config.restoreTimeoutMs, config.requestTimeoutMs, true,
        (address, timeoutMs) -> {
          HttpRequest req =
              transport.request(address, query)
                  .timeout(Duration.ofMillis(timeoutMs))
                  .GET()
                  .build();
          HttpResponse<InputStream> resp =
              transport.send(req, HttpResponse.BodyHandlers.ofInputStream());
          try (InputStream body = resp.body()) {
            if (resp.statusCode() != 200) {
              throw RingErrors.fromAnswer(address, resp.statusCode(), body.readAllBytes());
            }
            Restored out = new Restored();
            out.version = header(resp, "X-Statestore-Version", version);
            out.writerEpoch = header(resp, "X-Statestore-Writer-Epoch", 0);
            out.positions = resp.headers().firstValue("X-Statestore-Positions").orElse("{}");
            RowFraming.Counts counts = new RowFraming.Counts();
            try (Watchdog.Guard guard =
                Watchdog.watch(body, deadline, config.readTimeoutMs)) {
              try {
                RowFraming.read(guard.stream(body), target.begin(), counts);
              } catch (IOException e) {
                guard.check();
                throw e;
              }
              guard.check();
            }
            out.rows = counts.rows;
            out.bytes = counts.bytes;
            return out;
          }
        });
  }

  /** A store's head: its latest version and that version's writer epoch. */
  static final class Head {
    final long version;
    final long epoch;

    Head(long version, long epoch) {
      this.version = version;
      this.epoch = epoch;
    }

    @Override
    public String toString() {
      return "(version " + version + ", epoch " + epoch + ")";
    }
  }

  /**
   * The store's head as the ring knows it: every live member is asked at once (a node
   * answers for what it holds), and the highest (version, epoch) wins; {@code null} when
   * no member holds the store. Retried within {@code retryBudgetMs} while no member
   * answers.
   */
  Head head(String storePath) throws IOException {
    return withRetries(
        "head of " + storePath, null, config.retryBudgetMs, config.requestTimeoutMs, false,
        (ignored, timeoutMs) -> {
          List<String> all = route(storePath);
          List<CompletableFuture<HttpResponse<byte[]>>> pending = new ArrayList<>();
          for (String address : all) {
            HttpRequest req =
                transport.request(address, "/v1/stores/" + storePath + "/head")
                    .timeout(Duration.ofMillis(timeoutMs))
                    .GET()
                    .build();
            pending.add(transport.sendAsync(req, HttpResponse.BodyHandlers.ofByteArray()));
          }
          Head best = null;
          int answered = 0;
          IOException last = null;
          for (int i = 0; i < pending.size(); i++) {
            HttpResponse<byte[]> resp;
            try {
              resp = pending.get(i).get();
            } catch (ExecutionException e) {
              last = new IOException(
                  all.get(i) + ": " + RingTransport.describe(e.getCause()), e.getCause());
              continue;
            }
            if (resp.statusCode() == 200) {
              JsonNode h = JSON.readTree(resp.body());
              Head got = new Head(h.path("version").asLong(), h.path("epoch").asLong());
              if (best == null || got.version > best.version
                  || (got.version == best.version && got.epoch > best.epoch)) {
                best = got;
              }
              answered++;
            } else if (resp.statusCode() == 404) {
              answered++;
            } else {
              last = RingErrors.fromAnswer(all.get(i), resp.statusCode(), resp.body());
            }
          }
          if (answered == 0) {
            throw last != null ? last : new IOException("no member answered");
          }
          return best;
        });
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


}
