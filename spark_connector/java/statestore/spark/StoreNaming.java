package statestore.spark;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;

import org.apache.spark.sql.execution.streaming.state.StateStoreId;

/**
 * How Spark's state store coordinates map to the ring's {@code StoreId}
 * ({@code query/operator/partition/name}): query = the checkpoint root sanitized to
 * {@code [A-Za-z0-9._-]}, its last 100 characters, plus {@code -} and 12 hex digits of its
 * SHA-256; operator = {@code operatorId}; partition = {@code partitionId}; name = Spark's
 * store name, kept as is when the ring accepts it, else sanitized plus a hash.
 */
final class StoreNaming {
  private StoreNaming() {}

  /** The ring's store path {@code query/operator/partition/name} for a Spark store. */
  static String storePath(StateStoreId id) {
    return queryName(id.checkpointRootLocation()) + "/" + id.operatorId() + "/"
        + id.partitionId() + "/" + safeName(id.storeName());
  }

  /** A checkpoint root as a ring query name: readable tail plus a hash of the whole. */
  static String queryName(String root) {
    String clean = root.replaceAll("[^A-Za-z0-9._-]+", "_").replaceAll("^[._-]+|[._-]+$", "");
    if (clean.length() > 100) {
      clean = clean.substring(clean.length() - 100).replaceAll("^[._-]+", "");
    }
    String hash = sha256(root).substring(0, 12);
    return clean.isEmpty() ? "q-" + hash : clean + "-" + hash;
  }

  /** A Spark store name as a ring name (letters, digits, {@code ._-}, at most 128). */
  static String safeName(String name) {
    String clean = name.replaceAll("[^A-Za-z0-9._-]+", "_");
    if (clean.equals(name) && !name.isEmpty() && name.length() <= 128 && !name.equals(".")
        && !name.equals("..")) {
      return name;
    }
    if (clean.length() > 100) {
      clean = clean.substring(0, 100);
    }
    return clean + "-" + sha256(name).substring(0, 12);
  }

  static String sha256(String text) {
    try {
      byte[] d = MessageDigest.getInstance("SHA-256").digest(text.getBytes(StandardCharsets.UTF_8));
      StringBuilder sb = new StringBuilder();
      for (byte b : d) {
        sb.append(String.format("%02x", b));
      }
      return sb.toString();
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
  }
}
