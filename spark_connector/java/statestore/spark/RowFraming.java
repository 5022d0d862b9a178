package statestore.spark;

import java.io.BufferedInputStream;
import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.util.Map;

import org.apache.spark.sql.catalyst.expressions.UnsafeRow;

/**
 * The framed rows of docs/api.md, both ways: each row is a 4-byte big-endian key length, a
 * 4-byte value length ({@code -1} = delete, no value bytes), the key bytes, the value bytes.
 * The provider frames a commit's rows with {@link #frame} and reads a restore's with
 * {@link #read}; key and value are the {@code UnsafeRow} bytes.
 */
final class RowFraming {
  private RowFraming() {}

  /** Receives decoded rows, one at a time. */
  interface RowSink {
    void row(byte[] key, byte[] value);
  }

  /** What {@link #read} counted. */
  static final class Counts {
    long rows;
    long bytes;
  }

  /** Frame rows as the coordinator endpoints read them (null value = delete). */
  static byte[] frame(Map<UnsafeRow, UnsafeRow> rows) {
    ByteArrayOutputStream buf = new ByteArrayOutputStream(Math.max(1024, rows.size() * 48));
    DataOutputStream out = new DataOutputStream(buf);
    try {
      for (Map.Entry<UnsafeRow, UnsafeRow> e : rows.entrySet()) {
        writeRow(out, e.getKey(), e.getValue());
      }
      out.flush();
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    return buf.toByteArray();
  }

  static void writeRow(DataOutputStream out, UnsafeRow key, UnsafeRow value) throws IOException {
    byte[] k = key.getBytes();
    out.writeInt(k.length);
    if (value == null) {
      out.writeInt(-1);
      out.write(k);
    } else {
      byte[] v = value.getBytes();
      out.writeInt(v.length);
      out.write(k);
      out.write(v);
    }
  }

  /** Bytes one framed row takes. */
  static long framedSize(UnsafeRow key, UnsafeRow value) {
    return 8L + key.getSizeInBytes() + (value == null ? 0 : value.getSizeInBytes());
  }

  /**
   * Read framed rows until the end of the stream, handing puts to {@code sink} (deletes are
   * skipped: the state endpoint sends puts only).
   *
   * @throws IOException on a read error or a stream cut inside a row
   */
  static void read(InputStream raw, RowSink sink, Counts out) throws IOException {
    read(raw, sink, out, false);
  }

  /**
   * Read framed rows until the end of the stream, deletes included (a null value): a commit
   * body as this JVM framed it ({@link ShardFiles}).
   */
  static void readAll(InputStream raw, RowSink sink) throws IOException {
    read(raw, sink, new Counts(), true);
  }

  private static void read(InputStream raw, RowSink sink, Counts out, boolean deletes)
      throws IOException {
    DataInputStream in = new DataInputStream(new BufferedInputStream(raw, 1 << 16));
    byte[] header = new byte[8];
    while (true) {
      int n = in.read(header, 0, 1);
      if (n < 0) {
        return;
      }
      in.readFully(header, 1, 7);
      int klen = ((header[0] & 0xff) << 24) | ((header[1] & 0xff) << 16)
          | ((header[2] & 0xff) << 8) | (header[3] & 0xff);
      int vlen = ((header[4] & 0xff) << 24) | ((header[5] & 0xff) << 16)
          | ((header[6] & 0xff) << 8) | (header[7] & 0xff);
      if (klen < 0) {
        throw new IOException("restored stream has a key longer than 2 GiB: not Spark state");
      }
      byte[] key = new byte[klen];
      in.readFully(key);
      if (vlen < 0) {
        if (deletes) {
          sink.row(key, null);
        }
        continue;
      }
      byte[] value = new byte[vlen];
      in.readFully(value);
      sink.row(key, value);
      out.rows++;
      out.bytes += 8L + klen + vlen;
    }
  }
}
