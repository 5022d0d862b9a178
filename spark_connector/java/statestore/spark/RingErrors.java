package statestore.spark;

import java.io.IOException;
import java.nio.charset.StandardCharsets;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

/**
 * The ring's errors in Java: the one table of {@code statestore/core/errors.py} ({@link Kind},
 * one constant per Python class, named as it is, with its wire {@code code}, HTTP status and
 * parent), the exceptions the provider throws, and the one place an answer's status and error
 * body become one of them ({@link #fromAnswer}, {@link #replicaAnswer}; Python's
 * {@code net/transport.error_from_answer}). The cross-language test holds the table to
 * Python's class by class.
 *
 * <p>Two exception types carry a code: {@link RingException} (unchecked) on the direct write
 * path ({@link RingWriter}, {@link RingView}), and {@link RingError} (an IOException with the
 * HTTP status) where the provider meets Hadoop's and Spark's IOException contracts
 * ({@link RingHttp}, {@link RingDirect}); {@link #asIo} turns the first into the second.
 * {@link Unavailable} is a request that found no ring member within its budget.
 */
public final class RingErrors {
  private RingErrors() {}

  private static final ObjectMapper JSON = new ObjectMapper();

  /**
   * The classes of core/errors.py (a constant's name is the Python class's), each with its
   * stable {@code code}, HTTP status and parent. Availability errors ({@link #unavailable}:
   * Python's {@code Unavailable} subtree) may go away when the ring heals; every other is
   * final.
   */
  public enum Kind {
    StateStoreError("error", 500, null),
    InvalidRequest("invalid_request", 400, StateStoreError),
    FloorWithinRetain("floor_within_retain", 400, InvalidRequest),
    InvalidStoreId("invalid_store_id", 400, InvalidRequest),
    InvalidAddress("invalid_address", 400, InvalidRequest),
    PayloadTooLarge("payload_too_large", 413, InvalidRequest),
    MalformedData("malformed_data", 400, InvalidRequest),
    SlowRequest("request_timeout", 408, InvalidRequest),
    AccessDenied("access_denied", 403, StateStoreError),
    Unauthenticated("unauthenticated", 401, AccessDenied),
    Forbidden("forbidden", 403, AccessDenied),
    NotFound("not_found", 404, StateStoreError),
    StoreNotFound("store_not_found", 404, NotFound),
    VersionNotFound("version_not_found", 404, NotFound),
    StaleEpoch("stale_epoch", 409, StateStoreError),
    TentativeRolledBack("tentative_rolled_back", 409, StaleEpoch),
    VersionConflict("version_conflict", 409, StateStoreError),
    QueryDropping("query_dropping", 409, StateStoreError),
    QuotaExceeded("quota_exceeded", 507, StateStoreError),
    CorruptChunk("corrupt_chunk", 422, StateStoreError),
    DecompressionBomb("decompression_bomb", 422, CorruptChunk),
    Unsupported("unsupported", 404, StateStoreError),
    Unavailable("unavailable", 503, StateStoreError),
    NodeUnavailable("node_unavailable", 503, Unavailable),
    TlsFailed("tls_failed", 503, NodeUnavailable),
    UnprovenAnswer("unproven_answer", 503, NodeUnavailable),
    QuorumNotReached("quorum_not_reached", 503, Unavailable),
    RateLimited("rate_limited", 429, Unavailable),
    RequestTimeout("timeout", 504, Unavailable),
    DelayBoundExceeded("delay_bound_exceeded", 504, RequestTimeout),
    InsufficientStorage("insufficient_storage", 507, Unavailable),
    SetupError("setup_error", 500, StateStoreError),
    DataDirInUse("data_dir_in_use", 500, SetupError),
    UnknownDiskFormat("unknown_disk_format", 500, SetupError),
    SparkConnectorError("spark_connector_error", 500, SetupError);

    public final String code;
    public final int status;
    /** The Python class's base ({@code null} for StateStoreError). */
    public final Kind parent;

    Kind(String code, int status, Kind parent) {
      this.code = code;
      this.status = status;
      this.parent = parent;
    }

    /** Whether this is {@code kind} or under it (Python's issubclass). */
    public boolean is(Kind kind) {
      for (Kind k = this; k != null; k = k.parent) {
        if (k == kind) {
          return true;
        }
      }
      return false;
    }

    /** Availability, not semantics: retrying may help (under Python's Unavailable). */
    public boolean unavailable() {
      return is(Unavailable);
    }

    /** The class of a wire code; {@code null} for one core/errors.py does not define. */
    public static Kind of(String code) {
      for (Kind k : values()) {
        if (k.code.equals(code)) {
          return k;
        }
      }
      return null;
    }
  }

  /** Whether {@code code} names an availability error (retrying may help). */
  static boolean unavailable(String code) {
    Kind k = Kind.of(code);
    return k != null && k.unavailable();
  }

  /**
   * The HTTP status of {@code code} as the node would send it; a code the table does not
   * hold (or the generic {@code error}) is a 422 when it names a corruption, else a 400.
   */
  static int status(String code) {
    Kind k = Kind.of(code);
    if (k != null && k != Kind.StateStoreError) {
      return k.status;
    }
    return code.startsWith("corrupt") ? 422 : 400;
  }

  /**
   * Whether an answer with {@code status} and {@code code} is worth a retry: the table decides
   * for a code it holds (an Unavailable one, never a final one: a 507 {@code quota_exceeded}
   * stores nothing more when retried); a code it does not hold ({@code internal}, a proxy's
   * {@code http_502}, the generic {@code error}) is retried when it is a 5xx or a 429.
   */
  static boolean retryable(int status, String code) {
    Kind k = Kind.of(code);
    if (k != null && k != Kind.StateStoreError) {
      return k.unavailable();
    }
    return status >= 500 || status == 429;
  }

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
      return RingErrors.unavailable(code);
    }
  }

  /** A failure the ring reported in its own words (4xx/5xx with an error code). */
  static final class RingError extends IOException {
    final int status;
    final String code;

    RingError(int status, String code, String message) {
      super(message);
      this.status = status;
      this.code = code;
    }

    /** {@link RingErrors#retryable}. */
    boolean retryable() {
      return RingErrors.retryable(status, code);
    }
  }

  /** The ring could not be reached within a request's budget. */
  static final class Unavailable extends IOException {
    Unavailable(String message, Throwable cause) {
      super(message, cause);
    }
  }

  /**
   * Every holder a read asked answered 404: the chunk is not on the ring (a snapshot thinning
   * dropped, say), unless the reader's view of the ring is stale; retried for a few rounds
   * only ({@code RingDirect.MISSING_ROUNDS}).
   */
  static final class Missing extends IOException {
    Missing(String message) {
      super(message);
    }
  }

  /** A {@link RingException} as the IOException the provider throws, with its code's status. */
  static RingError asIo(RingException e) {
    return new RingError(status(e.code()), e.code(), e.getMessage());
  }

  /**
   * The error a coordinator's non-OK answer stands for: the code its error body names
   * ({@code http_STATUS} and the raw text when the body is not the ring's JSON), the message
   * saying which member answered.
   */
  static RingError fromAnswer(String address, int status, byte[] body) {
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
    return new RingError(
        status, code, address + " answered " + status + " " + code + ": " + message);
  }

  /**
   * The error a replica's non-OK answer stands for, as Python's
   * {@code net/transport.error_from_answer}: the code its error body names, else
   * {@code node_unavailable} for a 5xx and the generic {@code error} for anything else.
   */
  static RingException replicaAnswer(String address, int status, byte[] body) {
    try {
      JsonNode err = JSON.readTree(body).get("error");
      return new RingException(err.get("code").asText(),
          err.get("message").asText() + " (from " + address + ")");
    } catch (IOException | RuntimeException e) {
      String text = new String(body, 0, Math.min(200, body.length), StandardCharsets.UTF_8);
      String code = status >= 500 ? Kind.NodeUnavailable.code : Kind.StateStoreError.code;
      return new RingException(code, "node " + address + " answered " + status + ": " + text);
    }
  }
}
