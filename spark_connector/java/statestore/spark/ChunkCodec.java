package statestore.spark;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

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
      keys[i] = k;
      values[i] = v;
    }
    for (int j = 0; j < deletes.size(); j++) {
      byte[] k = deletes.get(j);
      if (k == null) {
        throw new InvalidRequestException("a deleted key is null");
      }
      keys[nPuts + j] = k;
    }
    // order: key group (a counting sort), then key as unsigned bytes within each group
    int[] group = new int[total];
    int[] starts = new int[groups + 1];
    for (int i = 0; i < total; i++) {
      int g = Xxh3.keyGroup(keys[i], groups);
      group[i] = g;
      starts[g + 1]++;
    }
    for (int g = 0; g < groups; g++) {
      starts[g + 1] += starts[g];
    }
    int[] order = new int[total];
    int[] fill = Arrays.copyOf(starts, groups);
    for (int i = 0; i < total; i++) {
      order[fill[group[i]]++] = i;
    }
    KeySort sorter = new KeySort(keys, total);
    for (int g = 0; g < groups; g++) {
      sorter.sort(order, starts[g], starts[g + 1]);
    }
    // equal keys are now adjacent: a key put twice, or put and deleted, is refused (deleted
    // duplicates are kept, as Python keeps them)
    for (int i = 1; i < total; i++) {
      int a = order[i - 1];
      int b = order[i];
      if (group[a] == group[b] && Arrays.equals(keys[a], keys[b])) {
        boolean putA = values[a] != null;
        boolean putB = values[b] != null;
        if (putA && putB) {
          throw new InvalidRequestException("key " + preview(keys[a]) + " is put twice in one commit");
        }
        if (putA || putB) {
          throw new InvalidRequestException("key " + preview(keys[a])
              + " is both put and deleted in one commit: keep one of the two");
        }
      }
    }

    List<Chunk> chunks = new ArrayList<>();
    ZstdCompressCtx cctx = takeCtx();
    try {
      byte[] raw = null;
      byte[] dst = null;
      int start = 0;
      while (start < total || chunks.isEmpty()) {
        // the rows from start whose running size stays within the target (at least one, at
        // most MAX_CHUNK_ROWS); the raw size is counted as it goes
        int stop = start;
        long used = 0;
        long rawSize = 1;
        while (stop < total && stop - start < MAX_CHUNK_ROWS) {
          int r = order[stop];
          int klen = keys[r].length;
          int vlen = values[r] == null ? 0 : values[r].length;
          long row = (long) ROW_OVERHEAD + klen + vlen;
          if (stop > start && used + row > targetSize) {
            break;
          }
          used += row;
          rawSize += binSize(klen) + (values[r] == null ? 1 : binSize(vlen));
          stop++;
          if (used > targetSize) {
            break; // a first row bigger than the target is a chunk of its own
          }
        }
        int n = stop - start;
        rawSize += arrayHeaderSize(2L * n);
        if (rawSize > Integer.MAX_VALUE - 8) {
          throw new PayloadTooLargeException("chunk of " + rawSize + " bytes is over 2 GiB");
        }
        int size = (int) rawSize;
        if (raw == null || raw.length < size) {
          raw = new byte[Math.max(size, raw == null ? 0 : raw.length + raw.length / 2)];
        }
        int at = 0;
        raw[at++] = (byte) FORMAT;
        at = putArrayHeader(raw, at, 2L * n);
        for (int i = start; i < stop; i++) {
          int r = order[i];
          at = putBin(raw, at, keys[r]);
          if (values[r] == null) {
            raw[at++] = (byte) 0xc0;
          } else {
            at = putBin(raw, at, values[r]);
          }
        }
        if (at != size) {
          throw new IllegalStateException("chunk layout: wrote " + at + " of " + size + " bytes");
        }
        int lo = n > 0 ? group[order[start]] : 0;
        int hi = n > 0 ? group[order[stop - 1]] : groups - 1;
        int bound = (int) Math.min(Integer.MAX_VALUE - 8L, Zstd.compressBound(size));
        if (dst == null || dst.length < bound) {
          dst = new byte[bound];
        }
        int len = cctx.compressByteArray(dst, 0, dst.length, raw, 0, size);
        byte[] data = Arrays.copyOf(dst, len);
        long digest = checksum(data);
        String name = kind + Integer.toString(chunks.size()) + "-" + hex16(digest);
        chunks.add(new Chunk(name, lo, hi, data, digest, size, n));
        start = stop;
      }
    } finally {
      giveCtx(cctx);
    }
    return chunks;
  }

  /** Rows per chunk at most (Python's MAX_CHUNK_ROWS). */
  public static final int MAX_CHUNK_ROWS = 1 << 20;

  /** Compression contexts kept for reuse (one per thread encoding at once, at most). */
  private static final java.util.concurrent.ConcurrentLinkedDeque<ZstdCompressCtx> CTXS =
      new java.util.concurrent.ConcurrentLinkedDeque<>();

  private static ZstdCompressCtx takeCtx() {
    ZstdCompressCtx c = CTXS.pollFirst();
    if (c == null) {
      c = new ZstdCompressCtx();
      c.setLevel(ZSTD_LEVEL);
    }
    return c;
  }

  private static void giveCtx(ZstdCompressCtx c) {
    if (CTXS.size() < 64) {
      CTXS.addFirst(c);
    } else {
      c.close();
    }
  }

  private static final byte[] HEX = "0123456789abcdef".getBytes(java.nio.charset.StandardCharsets.US_ASCII);

  private static String hex16(long v) {
    byte[] out = new byte[16];
    for (int i = 15; i >= 0; i--) {
      out[i] = HEX[(int) (v & 0xf)];
      v >>>= 4;
    }
    return new String(out, java.nio.charset.StandardCharsets.US_ASCII);
  }

  private static int binSize(int n) {
    return n + (n <= 0xff ? 2 : n <= 0xffff ? 3 : 5);
  }

  private static int arrayHeaderSize(long n) {
    return n <= 15 ? 1 : n <= 0xffff ? 3 : 5;
  }

  private static int putArrayHeader(byte[] b, int at, long n) {
    if (n <= 15) {
      b[at++] = (byte) (0x90 | (int) n);
    } else if (n <= 0xffff) {
      b[at++] = (byte) 0xdc;
      b[at++] = (byte) (n >>> 8);
      b[at++] = (byte) n;
    } else {
      b[at++] = (byte) 0xdd;
      b[at++] = (byte) (n >>> 24);
      b[at++] = (byte) (n >>> 16);
      b[at++] = (byte) (n >>> 8);
      b[at++] = (byte) n;
    }
    return at;
  }

  private static int putBin(byte[] b, int at, byte[] v) {
    int n = v.length;
    if (n <= 0xff) {
      b[at++] = (byte) 0xc4;
      b[at++] = (byte) n;
    } else if (n <= 0xffff) {
      b[at++] = (byte) 0xc5;
      b[at++] = (byte) (n >>> 8);
      b[at++] = (byte) n;
    } else {
      b[at++] = (byte) 0xc6;
      b[at++] = (byte) (n >>> 24);
      b[at++] = (byte) (n >>> 16);
      b[at++] = (byte) (n >>> 8);
      b[at++] = (byte) n;
    }
    System.arraycopy(v, 0, b, at, n);
    return at + n;
  }

  /**
   * Sorts ranges of row indices by key as unsigned bytes, without boxing or a comparator:
   * each key of a range is read as the 8 bytes past the range's common prefix (big-endian,
   * zero-padded), whose high bits and the row's place in the range make one long; a
   * primitive sort of those longs orders the keys wherever their high bits differ, and the
   * runs that tie on them are then sorted by comparing the keys in full.
   */
  static final class KeySort {
    private final byte[][] keys;
    private long[] packed = new long[16];
    private int[] local = new int[16];

    KeySort(byte[][] keys, int total) {
      this.keys = keys;
    }

    void sort(int[] idx, int from, int to) {
      int n = to - from;
      if (n < 2) {
        return;
      }
      byte[] first = keys[idx[from]];
      int common = first.length;
      for (int i = from + 1; i < to && common > 0; i++) {
        byte[] k = keys[idx[i]];
        int m = Arrays.mismatch(first, 0, common, k, 0, Math.min(common, k.length));
        if (m >= 0) {
          common = m;
        } else if (k.length < common) {
          common = k.length;
        }
      }
      if (packed.length < n) {
        packed = new long[Math.max(n, packed.length * 2)];
        local = new int[packed.length];
      }
      int bits = 32 - Integer.numberOfLeadingZeros(n - 1);
      long low = (1L << bits) - 1;
      for (int i = 0; i < n; i++) {
        byte[] k = keys[idx[from + i]];
        long w = 0;
        int end = Math.min(k.length, common + 8);
        for (int j = common; j < end; j++) {
          w |= (long) (k[j] & 0xff) << (8 * (7 - (j - common)));
        }
        // unsigned order of the word's high bits as signed order: flip the sign bit
        packed[i] = ((w & ~low) ^ Long.MIN_VALUE) | i;
        local[i] = idx[from + i];
      }
      Arrays.sort(packed, 0, n);
      for (int i = 0; i < n; i++) {
        idx[from + i] = local[(int) (packed[i] & low)];
      }
      // runs tied on the high bits: in full (insertion sort; ties are rare and short)
      int run = 0;
      for (int i = 1; i <= n; i++) {
        if (i < n && (packed[i] & ~low) == (packed[run] & ~low)) {
          continue;
        }
        if (i - run > 1) {
          for (int x = from + run + 1; x < from + i; x++) {
            int v = idx[x];
            int y = x - 1;
            while (y >= from + run && Arrays.compareUnsigned(keys[idx[y]], keys[v]) > 0) {
              idx[y + 1] = idx[y];
              y--;
            }
            idx[y + 1] = v;
          }
        }
        run = i;
      }
    }
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
