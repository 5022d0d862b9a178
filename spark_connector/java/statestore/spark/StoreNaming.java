package statestore.spark;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.execution.streaming.state.StateStoreId;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * How Spark's state store coordinates map to the ring's {@code StoreId}
 * ({@code query/operator/partition/name}): query = the checkpoint root sanitized to
 * {@code [A-Za-z0-9._-]}, its last 100 characters, plus {@code -} and 12 hex digits of the
 * SHA-256 of the root and the query's id (the UUID Spark writes to
 * {@code <checkpoint>/metadata} when it creates a checkpoint); operator =
 * {@code operatorId}; partition = {@code partitionId}; name = Spark's store name, kept as is
 * when the ring accepts it, else sanitized plus a hash. A checkpoint deleted and created
 * again at the same path gets a new id, so its state starts from nothing on the ring.
 */
final class StoreNaming {
  private static final Logger LOG = LoggerFactory.getLogger(StoreNaming.class);
  private static final ObjectMapper JSON = new ObjectMapper();
  /** The file the provider leaves in each store's checkpoint folder (see markPartition). */
  static final String MARKER = "_ring";

  private StoreNaming() {}

  /** The ring's store path {@code query/operator/partition/name} for a Spark store. */
  static String storePath(StateStoreId id, String queryId) {
    String root = id.checkpointRootLocation();
    return queryName(queryId == null ? root : root + "#" + queryId, root) + "/" + id.operatorId()
        + "/" + id.partitionId() + "/" + safeName(id.storeName());
  }

  /**
   * The query's persistent id from {@code <checkpoint>/metadata} (the checkpoint root's
   * parent), or {@code null} when there is none (then the path alone names the query).
   */
  static String queryId(String checkpointRoot, Configuration hadoopConf) {
    try {
      Path metadata = new Path(new Path(checkpointRoot).getParent(), "metadata");
      FileSystem fs = metadata.getFileSystem(hadoopConf);
      if (!fs.exists(metadata)) {
        return null;
      }
      try (InputStream in = fs.open(metadata)) {
        JsonNode id = JSON.readTree(in).path("id");
        String text = id.isTextual() ? id.asText() : null;
        return text == null || text.isEmpty() ? null : text;
      }
    } catch (IOException | RuntimeException e) {
      throw new IllegalStateException(
          "RingStateStoreProvider: cannot read the query id from " + checkpointRoot
              + "/../metadata (" + e + "): the ring names a query's state by it", e);
    }
  }

  /**
   * Leave an empty marker file in the store's checkpoint folder
   * ({@code state/<op>/<partition>[/<store>]}): Spark's state data source finds partitions
   * by listing those folders. Best effort: a failure is logged.
   */
  static void markPartition(StateStoreId id, Configuration hadoopConf) {
    try {
      Path marker = new Path(id.storeCheckpointLocation(), MARKER);
      FileSystem fs = marker.getFileSystem(hadoopConf);
      if (!fs.exists(marker)) {
        fs.mkdirs(marker.getParent());
        fs.create(marker, true).close();
      }
    } catch (IOException | RuntimeException e) {
      LOG.warn("cannot leave a marker in {}: the state data source may miss this partition",
          id.storeCheckpointLocation(), e);
    }
  }

  /** A checkpoint root as a ring query name: readable tail plus a hash of the whole. */
  static String queryName(String identity, String root) {
    String clean = root.replaceAll("[^A-Za-z0-9._-]+", "_").replaceAll("^[._-]+|[._-]+$", "");
    if (clean.length() > 100) {
      clean = clean.substring(clean.length() - 100).replaceAll("^[._-]+", "");
    }
    String hash = sha256(identity).substring(0, 12);
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
