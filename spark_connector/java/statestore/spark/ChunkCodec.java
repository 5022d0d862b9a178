package statestore.spark;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Set;

import com.github.luben.zstd.Zstd;
import com.github.luben.zstd.ZstdCompressCtx;
import com.github.luben.zstd.ZstdException;
import com.github.luben.zstd.ZstdInputStream;

/**
 * The chunk codec of {@code statestore/core/chunk.py}, byte for byte.
 *
 * <p>A commit's rows are laid out by key group ({@code xxh3_64(key) % groups}, unsigned), each
 * group sorted by key as unsigned bytes, and cut into chunks: from each start row, the rows
 * whose running size ({@code len(key) + len(value) + 10}, a delete's value counting 0) stays
 * within {@code targetSize}, at least one row. An empty commit is one empty chunk covering
 * groups {@code [0, groups - 1]}. A chunk's raw bytes are the format byte {@code 0x01} and a
 * msgpack array of alternating keys and values (bin; nil marks a delete), compressed with
 * zstd level 1 (content size in the frame header, no frame checksum); its checksum is
 * XXH3-64 of the compressed bytes and its name {@code <kind><index>-<checksum as 16 hex>}.
 */
public final class ChunkCodec {
  private ChunkCodec() {}

  public static final int DEFAULT_KEY_GROUPS = 128;
  public static final int DEFAULT_CHUNK_SIZE = 4 * 1024 * 1024;
  public static final int MAX_CHUNK_RAW = 256 * 1024 * 1024;
  static final int FORMAT = 0x01;
  static final int ROW_OVERHEAD = 10;
  private static final int ZSTD_LEVEL = 1;

  /** The arguments describe an impossible commit (Python's InvalidRequest). */
  public static final class InvalidRequestException extends IllegalArgumentException {
    InvalidRequestException(String message) {
      super(message);
    }
  }

  /** One row is larger than a chunk may be (Python's PayloadTooLarge). */
  public static final class PayloadTooLargeException extends IllegalArgumentException {
    PayloadTooLargeException(String message) {
      super(message);
    }
  }

  /** A chunk that is not what this codec writes, or does not match its checksum. */
  public static class CorruptChunkException extends RuntimeException {
    CorruptChunkException(String message) {
      super(message);
    }

    CorruptChunkException(String message, Throwable cause) {
      super(message, cause);
    }
  }

  /** A chunk that would decompress past the limit (Python's DecompressionBomb). */
  public static final class DecompressionBombException extends CorruptChunkException {
    DecompressionBombException(String message) {
      super(message);
    }
  }

  /** One row: a key and its value, or {@code null} for a delete. */
  public record Row(byte[] key, byte[] value) {}

  /** One compressed chunk, ready to send (Python's EncodedChunk). */
  public record Chunk(String name, int lo, int hi, byte[] data, long checksum, int rawSize, int rows) {}

  /** XXH3-64 of the compressed chunk bytes, as an unsigned value in a long. */
  public static long checksum(byte[] data) {
    return Xxh3.hash(data);
  }

  /** Throws CorruptChunkException if {@code data} does not have checksum {@code expected}. */
  public static void verify(byte[] data, long expected, String what) {
    long got = checksum(data);
    if (got != expected) {
      throw new CorruptChunkException(String.format(
          "chunk %s is corrupt: checksum %016x != expected %016x; "
              + "it will be read from another replica, and repair rewrites the bad copy",
          what, got, expected));
    }
  }

  /** The key group of {@code key} among {@code groups} groups. */
  public static int keyGroup(byte[] key, int groups) {
    return Xxh3.keyGroup(key, groups);
  }

  /** {@link #encode(List, List, int, int, char, int)} with the defaults (a delta). */
  public static List<Chunk> encode(List<byte[]> putKeys, List<byte[]> putValues, List<byte[]> deletes) {
    return encode(
        putKeys, putValues, deletes, DEFAULT_KEY_GROUPS, DEFAULT_CHUNK_SIZE, 'd', MAX_CHUNK_RAW);
  }

  /**
   * Lay rows out by key group and cut them into compressed chunks, as Python's
   * {@code encode_chunks(puts, deletes, groups=, target_size=, kind=, max_raw=)}.
   *
   * @param putKeys distinct keys put (Python's {@code puts} mapping; order does not matter)
   * @param putValues their values, same length
   * @param deletes keys deleted; duplicates are kept, as Python keeps them
   * @param kind {@code 'd'} for a delta, {@code 's'} for a snapshot: it prefixes chunk names
   * @throws InvalidRequestException a key both put and deleted, or put twice
   * @throws PayloadTooLargeException a put row bigger than {@code maxRaw}
   */
  public static List<Chunk> encode(
      List<byte[]> putKeys,
      List<byte[]> putValues,
      List<byte[]> deletes,
      int groups,
      int targetSize,
      char kind,
      int maxRaw) {
    if (groups < 1 || groups > 65536) {
      throw new InvalidRequestException("key groups must be in 1..65536, got " + groups);
    }
    if (kind != 'd' && kind != 's') {
      throw new InvalidRequestException("chunk kind must be 'd' or 's', got " + kind);
    }
    int nPuts = putKeys.size();
    if (putValues.size() != nPuts) {
      throw new InvalidRequestException(
          nPuts + " keys put but " + putValues.size() + " values given");
    }
    int total = nPuts + deletes.size();
    byte[][] keys = new byte[total][];
    byte[][] values = new byte[total][];
    Set<ByteBuffer> seen = new HashSet<>(Math.max(16, nPuts * 2));
    for (int i = 0; i < nPuts; i++) {
      byte[] k = putKeys.get(i);
      byte[] v = putValues.get(i);
      if (k == null || v == null) {
        throw new InvalidRequestException("a put needs a key and a value (use deletes to delete)");
      }
      if ((long) k.length + v.length + ROW_OVERHEAD > maxRaw) {
        throw new PayloadTooLargeException(String.format(
            "row of %d bytes is over the %d-byte chunk limit", (long) k.length + v.length, maxRaw));
      }
      if (!seen.add(ByteBuffer.wrap(k))) {
        throw new InvalidRequestException("key " + preview(k) + " is put twice in one commit");
      }
      keys[i] = k;
      values[i] = v;
    }
    for (int j = 0; j < deletes.size(); j++) {
      byte[] k = deletes.get(j);
      if (k == null) {
        throw new InvalidRequestException("a deleted key is null");
      }
      if (nPuts > 0 && seen.contains(ByteBuffer.wrap(k))) {
        throw new InvalidRequestException("key " + preview(k)
            + " is both put and deleted in one commit: keep one of the two");
      }
      keys[nPuts + j] = k;
    }
    // order: key group, then key as unsigned bytes (deleted duplicates are equal: any order)
    int[] group = new int[total];
    Integer[] order = new Integer[total];
    for (int i = 0; i < total; i++) {
      group[i] = Xxh3.keyGroup(keys[i], groups);
      order[i] = i;
    }
    Arrays.sort(order, (a, b) -> {
      int c = Integer.compare(group[a], group[b]);
      return c != 0 ? c : Arrays.compareUnsigned(keys[a], keys[b]);
    });

    List<Chunk> chunks = new ArrayList<>();
    Msgpack.Writer raw = new Msgpack.Writer(Math.min(targetSize, 1 << 20) + 64);
    try (ZstdCompressCtx cctx = new ZstdCompressCtx()) {
      cctx.setLevel(ZSTD_LEVEL);
      int start = 0;
      while (start < total || chunks.isEmpty()) {
        // the rows from start whose running size stays within the target (at least one)
        int stop = start;
        long used = 0;
        while (stop < total) {
          int r = order[stop];
          long row = (long) ROW_OVERHEAD + keys[r].length + (values[r] == null ? 0 : values[r].length);
          if (stop > start && used + row > targetSize) {
            break;
          }
          used += row;
          stop++;
          if (used > targetSize) {
            break; // a first row bigger than the target is a chunk of its own
          }
        }
        int n = stop - start;
        raw.reset();
        raw.raw(FORMAT);
        raw.arrayHeader(2L * n);
        for (int i = start; i < stop; i++) {
          int r = order[i];
          raw.bin(keys[r]);
          if (values[r] == null) {
            raw.nil();
          } else {
            raw.bin(values[r]);
          }
        }
        int lo = n > 0 ? group[order[start]] : 0;
        int hi = n > 0 ? group[order[stop - 1]] : groups - 1;
        byte[] data = compress(cctx, raw.buffer(), raw.size());
        long digest = checksum(data);
        String name = String.format("%c%d-%016x", kind, chunks.size(), digest);
        chunks.add(new Chunk(name, lo, hi, data, digest, raw.size(), n));
        start = stop;
      }
    }
    return chunks;
  }

  private static byte[] compress(ZstdCompressCtx cctx, byte[] src, int len) {
    byte[] dst = new byte[(int) Zstd.compressBound(len)];
    int n = cctx.compressByteArray(dst, 0, dst.length, src, 0, len);
    return Arrays.copyOf(dst, n);
  }

  private static String preview(byte[] key) {
    StringBuilder sb = new StringBuilder("b'");
    for (int i = 0; i < Math.min(64, key.length); i++) {
      int c = key[i] & 0xff;
      if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
        sb.append((char) c);
      } else {
        sb.append(String.format("\\x%02x", c));
      }
    }
    return sb.append('\'').toString();
  }

  /** {@link #decode(byte[], int, String)} with the default limit. */
  public static List<Row> decode(byte[] data) {
    return decode(data, MAX_CHUNK_RAW, "");
  }

  /**
   * Decompress and decode one chunk into its rows, in key-group order (Python's
   * {@code decode_chunk}).
   *
   * @throws DecompressionBombException the frame would expand past {@code maxRaw}
   * @throws CorruptChunkException not a chunk this codec writes
   */
  public static List<Row> decode(byte[] data, int maxRaw, String what) {
    byte[] raw = decompress(data, maxRaw, what);
    if (raw.length < 1 || raw[0] != FORMAT) {
      throw new CorruptChunkException("chunk " + what + " has unknown format byte "
          + (raw.length < 1 ? "b''" : String.format("0x%02x", raw[0] & 0xff)));
    }
    try {
      Msgpack.Reader in = new Msgpack.Reader(raw, 1, raw.length - 1, true);
      long n = in.arrayHeader();
      if (n % 2 != 0) {
        throw new CorruptChunkException("chunk " + what + " payload is not a list of key/value pairs");
      }
      if (n > raw.length) {
        throw new Msgpack.FormatException("array of " + n + " items in " + raw.length + " bytes");
      }
      List<Row> rows = new ArrayList<>((int) (n / 2));
      for (long i = 0; i < n; i += 2) {
        byte[] k = in.binOrNil();
        if (k == null) {
          throw new Msgpack.FormatException("a key is nil");
        }
        rows.add(new Row(k, in.binOrNil()));
      }
      if (!in.atEnd()) {
        throw new Msgpack.FormatException("extra data after the rows");
      }
      return rows;
    } catch (Msgpack.FormatException | IndexOutOfBoundsException e) {
      throw new CorruptChunkException(
          "chunk " + what + " payload does not decode (" + e.getMessage() + ")", e);
    }
  }

  private static byte[] decompress(byte[] data, int maxRaw, String what) {
    long declared = Zstd.getFrameContentSize(data, 0, data.length);
    if (declared < -1) { // ZSTD_CONTENTSIZE_ERROR or a too-short input; -1 = not declared
      throw new CorruptChunkException("chunk " + what + " is not a zstd frame");
    }
    if (declared > maxRaw) {
      throw new DecompressionBombException(String.format(
          "chunk %s would decompress to %d bytes, past the %d-byte limit; "
              + "raise --max-chunk if this is real data", what, declared, maxRaw));
    }
    try {
      if (declared >= 0) {
        byte[] out = new byte[(int) declared];
        long n = Zstd.decompress(out, data);
        if (Zstd.isError(n)) {
          throw new CorruptChunkException(
              "chunk " + what + " does not decompress (" + Zstd.getErrorName(n) + ")");
        }
        if (n != declared) {
          throw new CorruptChunkException("chunk " + what + " decompresses to " + n
              + " bytes, not the " + declared + " its frame declares");
        }
        return out;
      }
      // no declared size: stream it and stop one byte past the limit
      try (ZstdInputStream zin = new ZstdInputStream(new ByteArrayInputStream(data))) {
        Msgpack.Writer out = new Msgpack.Writer(64 * 1024);
        byte[] piece = new byte[1 << 16];
        long totalRead = 0;
        while (totalRead <= maxRaw) {
          int r = zin.read(piece, 0, (int) Math.min(piece.length, maxRaw + 1L - totalRead));
          if (r < 0) {
            break;
          }
          out.raw(piece, 0, r);
          totalRead += r;
        }
        if (totalRead > maxRaw) {
          throw new DecompressionBombException(String.format(
              "chunk %s decompresses past the %d-byte limit; raise --max-chunk if this is real data",
              what, maxRaw));
        }
        return out.toByteArray();
      }
    } catch (ZstdException | IOException e) {
      throw new CorruptChunkException(
          "chunk " + what + " does not decompress (" + e.getMessage() + ")", e);
    }
  }
}
