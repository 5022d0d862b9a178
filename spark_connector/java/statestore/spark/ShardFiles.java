package statestore.spark;

import java.io.BufferedOutputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Iterator;
import java.util.Map;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;

/**
 * A commit's rows split by shard ({@link StateCommit}) into local files in one pass over them:
 * each shard's file holds its rows framed as a commit body ({@link RowFraming}), so the
 * coordinator path sends a file as it is and the direct path reads one shard's rows back at
 * a time. Without it every shard read every row again, and rows in a spill store (or still
 * on the ring) cost a RocksDB read, a look-up in the overlay and one in the version each time:
 * {@code n} passes for {@code n} shards. The heap holds one shard's rows at a time, as before,
 * plus a write buffer per shard; the files live under Spark's local dir and are deleted when
 * the commit ends ({@link #close}). Disk: the commit's framed rows once.
 */
final class ShardFiles implements AutoCloseable {
  /** The most shards routed through files (open files and buffers): more pass again. */
  static final int MAX_FILES = 64;
  /** The write buffers of all shards together. */
  private static final int BUFFERS = 4 << 20;

  private final Path dir;
  private final Path[] files;
  private final long[] bytes;

  private ShardFiles(Path dir, int shards) {
    this.dir = dir;
    this.files = new Path[shards];
    this.bytes = new long[shards];
    for (int i = 0; i < shards; i++) {
      files[i] = dir.resolve("shard-" + i);
    }
  }

  /**
   * Write each of {@code rows} to its shard's file (a tombstone as a delete), counting them
   * in {@code sizes} too when it is not null.
   */
  static ShardFiles route(Iterator<Map.Entry<UnsafeRow, UnsafeRow>> rows, int shards,
      StateCommit.Sizes sizes) throws IOException {
    if (shards < 1 || shards > MAX_FILES) {
      throw new IllegalArgumentException("routing " + shards + " shards through files");
    }
    Path dir = SpillStore.newDir("statestore-shards");
    Files.createDirectories(dir);
    SpillStore.deleteAtExit(dir);
    ShardFiles out = new ShardFiles(dir, shards);
    DataOutputStream[] streams = new DataOutputStream[shards];
    int buffer = Math.max(8 << 10, Math.min(1 << 16, BUFFERS / shards));
    try {
      for (int i = 0; i < shards; i++) {
        OutputStream f = Files.newOutputStream(out.files[i]);
        streams[i] = new DataOutputStream(new BufferedOutputStream(f, buffer));
      }
      while (rows.hasNext()) {
        Map.Entry<UnsafeRow, UnsafeRow> e = rows.next();
        UnsafeRow v = e.getValue() == StateData.TOMBSTONE ? null : e.getValue();
        int shard = StateCommit.shardOf(e.getKey(), shards);
        RowFraming.writeRow(streams[shard], e.getKey(), v);
        out.bytes[shard] += RowFraming.framedSize(e.getKey(), v);
        if (sizes != null) {
          sizes.add(e.getKey(), e.getValue());
        }
      }
      for (int i = 0; i < shards; i++) {
        DataOutputStream s = streams[i];
        streams[i] = null;
        s.close();
      }
      return out;
    } catch (IOException | RuntimeException | Error e) {
      for (DataOutputStream s : streams) {
        if (s != null) {
          try {
            s.close();
          } catch (IOException ignored) {
            // the files go below
          }
        }
      }
      out.close();
      throw e;
    }
  }

  /** The shard's rows as a commit body. */
  byte[] body(int shard) throws IOException {
    return Files.readAllBytes(files[shard]);
  }

  /** Hand the shard's rows to {@code sink} (a delete's value is null); their framed bytes. */
  long rows(int shard, RowFraming.RowSink sink) throws IOException {
    try (InputStream in = Files.newInputStream(files[shard])) {
      RowFraming.readAll(in, sink);
    }
    return bytes[shard];
  }

  /** Delete the files. */
  @Override
  public void close() {
    for (Path f : files) {
      try {
        Files.deleteIfExists(f);
      } catch (IOException ignored) {
        // deleted at exit, with the directory
      }
    }
    try {
      Files.deleteIfExists(dir);
      SpillStore.forget(dir);
    } catch (IOException ignored) {
      // deleted at exit
    }
  }
}
