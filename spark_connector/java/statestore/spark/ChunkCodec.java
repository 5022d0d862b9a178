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
 *
 * <p>That is the whole layout (format 1, {@code blockSize} 0). The blocked layout (format 2,
 * the default since 0.3.0) cuts a chunk's rows again into blocks by the same rule with
 * {@code blockSize} as the target, each block's msgpack array (no format byte) compressed on
 * its own; the chunk is {@code 0xb2}, the blocks' frames, the index (a msgpack array of two:
 * the entries, {@code [group, first key, frame length, XXH3-64 of the frame, rows]} per
 * block, and a Bloom filter of a snapshot's keys, empty bytes for a delta's: Python's
 * {@code bloom}) and the index's length as 4 bytes little endian. Both layouts are read.
 */
public final class ChunkCodec {
  private ChunkCodec() {}

  public static final int DEFAULT_KEY_GROUPS = 128;
  public static final int DEFAULT_CHUNK_SIZE = 4 * 1024 * 1024;
  public static final int MAX_CHUNK_RAW = 256 * 1024 * 1024;
  static final int FORMAT = 0x01;
  static final int BLOCKED = 0xb2;
  public static final int DEFAULT_BLOCK_SIZE = 16 * 1024;
  /** A snapshot's blocks are {@code blockSize / SNAPSHOT_BLOCKS} (Python's rule and reason). */
  public static final int SNAPSHOT_BLOCKS = 4;
  static final int BLOOM_BITS_PER_KEY = 16;
  static final int BLOOM_PROBES = 3;
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
  public record Chunk(String name, int lo, int hi, byte[] data, long checksum, int rawSize, int rows,
      int indexLen, long indexChecksum) {}

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

  /** {@link #encode(List, List, List, int, int, char, int, int)} with the defaults (a delta). */
  public static List<Chunk> encode(List<byte[]> putKeys, List<byte[]> putValues, List<byte[]> deletes) {
    return encode(putKeys, putValues, deletes, DEFAULT_KEY_GROUPS, DEFAULT_CHUNK_SIZE, 'd',
        MAX_CHUNK_RAW, DEFAULT_BLOCK_SIZE);
  }

  /**
   * Lay rows out by key group and cut them into compressed chunks, as Python's
   * {@code encode_chunks(puts, deletes, groups=, target_size=, kind=, max_raw=)}.
   *
   * @param putKeys distinct keys put (Python's {@code puts} mapping; order does not matter)
   * @param putValues their values, same length
   * @param deletes keys deleted; duplicates are kept, as Python keeps them
   * @param kind {@code 'd'} for a delta, {@code 'w'} for a snapshot a writer commits whole,
   *     {@code 's'} for one a compactor folds: it prefixes chunk names (thinning never drops
   *     a {@code 'w'} snapshot: core/manifest.py, {@code Manifest.whole})
   * @param blockSize the blocked layout's block size (a snapshot's is a quarter of it);
   *     {@code 0} writes whole chunks
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
      int maxRaw,
      int blockSize) {
    if (groups < 1 || groups > 65536) {
      throw new InvalidRequestException("key groups must be in 1..65536, got " + groups);
    }
    if (kind != 'd' && kind != 's' && kind != 'w') {
      throw new InvalidRequestException("chunk kind must be 'd', 's' or 'w', got " + kind);
    }
    if (kind != 'd' && blockSize > 0) {
      blockSize = Math.max(1, blockSize / SNAPSHOT_BLOCKS);
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
        int lo = n > 0 ? group[order[start]] : 0;
        int hi = n > 0 ? group[order[stop - 1]] : groups - 1;
        Chunk chunk;
        if (blockSize > 0) {
          chunk = blocked(kind, chunks.size(), lo, hi, keys, values, group, order, start, stop,
              blockSize, cctx);
        } else {
          rawSize += arrayHeaderSize(2L * n);
          if (rawSize > Integer.MAX_VALUE - 8) {
            throw new PayloadTooLargeException("chunk of " + rawSize + " bytes is over 2 GiB");
          }
          int size = (int) rawSize;
          byte[] raw = new byte[size];
          raw[0] = (byte) FORMAT;
          int at = putRows(raw, 1, keys, values, order, start, stop);
          if (at != size) {
            throw new IllegalStateException("chunk layout: wrote " + at + " of " + size + " bytes");
          }
          byte[] data = compress(cctx, raw, size);
          long digest = checksum(data);
          String name = kind + Integer.toString(chunks.size()) + "-" + hex16(digest);
          chunk = new Chunk(name, lo, hi, data, digest, size, n, 0, 0);
        }
        chunks.add(chunk);
        start = stop;
      }
    } finally {
      giveCtx(cctx);
    }
    return chunks;
  }

  /** Rows {@code [from, to)} of {@code order} as msgpack bins (nil for a delete) at {@code at}. */
  private static int putRows(byte[] raw, int at, byte[][] keys, byte[][] values, int[] order,
      int from, int to) {
    at = putArrayHeader(raw, at, 2L * (to - from));
    for (int i = from; i < to; i++) {
      int r = order[i];
      at = putBin(raw, at, keys[r]);
      if (values[r] == null) {
        raw[at++] = (byte) 0xc0;
      } else {
        at = putBin(raw, at, values[r]);
      }
    }
    return at;
  }

  private static long rowsSize(byte[][] keys, byte[][] values, int[] order, int from, int to) {
    long size = arrayHeaderSize(2L * (to - from));
    for (int i = from; i < to; i++) {
      int r = order[i];
      size += binSize(keys[r].length) + (values[r] == null ? 1 : binSize(values[r].length));
    }
    return size;
  }

  private static byte[] compress(ZstdCompressCtx cctx, byte[] raw, int size) {
    int bound = (int) Math.min(Integer.MAX_VALUE - 8L, Zstd.compressBound(size));
    byte[] dst = new byte[bound];
    int len = cctx.compressByteArray(dst, 0, dst.length, raw, 0, size);
    return Arrays.copyOf(dst, len);
  }

  /** A Bloom filter of the keys of rows {@code [from, to)} of {@code order} (Python's bloom). */
  static byte[] bloom(byte[][] keys, int[] order, int from, int to) {
    long m = Math.max(64, ((long) (to - from) * BLOOM_BITS_PER_KEY + 7) / 8 * 8);
    byte[] bits = new byte[(int) (m / 8)];
    for (int i = from; i < to; i++) {
      long h = Xxh3.hash(keys[order[i]]);
      long h1 = h & 0xffffffffL;
      long h2 = h >>> 32;
      for (int p = 0; p < BLOOM_PROBES; p++) {
        long b = (h1 + p * h2) % m;
        bits[(int) (b >>> 3)] |= (byte) (1 << (b & 7));
      }
    }
    return bits;
  }

  /** Rows {@code [start, stop)} as one blocked chunk (Python's {@code _blocked}). */
  private static Chunk blocked(char kind, int index, int lo, int hi, byte[][] keys, byte[][] values,
      int[] group, int[] order, int start, int stop, int blockSize, ZstdCompressCtx cctx) {
    List<byte[]> frames = new ArrayList<>();
    Msgpack.Writer ix = new Msgpack.Writer(256);
    int blocks = 0;
    long rawTotal = 0;
    long framed = 1;
    Msgpack.Writer entries = new Msgpack.Writer(256);
    int at = start;
    while (at < stop) {
      int end = at;
      long used = 0;
      while (end < stop) {
        int r = order[end];
        long row = (long) ROW_OVERHEAD + keys[r].length + (values[r] == null ? 0 : values[r].length);
        if (end > at && used + row > blockSize) {
          break;
        }
        used += row;
        end++;
        if (used > blockSize) {
          break;
        }
      }
      long size = rowsSize(keys, values, order, at, end);
      if (size > Integer.MAX_VALUE - 8) {
        throw new PayloadTooLargeException("block of " + size + " bytes is over 2 GiB");
      }
      byte[] raw = new byte[(int) size];
      putRows(raw, 0, keys, values, order, at, end);
      byte[] frame = compress(cctx, raw, raw.length);
      frames.add(frame);
      rawTotal += raw.length;
      framed += frame.length;
      entries.arrayHeader(5).integer(group[order[at]]).bin(keys[order[at]]).integer(frame.length)
          .unsigned(checksum(frame)).integer(end - at);
      blocks++;
      at = end;
    }
    ix.arrayHeader(2).arrayHeader(blocks);
    ix.raw(entries.buffer(), 0, entries.size());
    ix.bin(kind != 'd' ? bloom(keys, order, start, stop) : new byte[0]);
    byte[] packed = ix.toByteArray();
    if (framed + packed.length + 4 > Integer.MAX_VALUE - 8 || rawTotal > Integer.MAX_VALUE - 8) {
      throw new PayloadTooLargeException("chunk of " + framed + " bytes is over 2 GiB");
    }
    byte[] data = new byte[(int) framed + packed.length + 4];
    data[0] = (byte) BLOCKED;
    int pos = 1;
    for (byte[] f : frames) {
      System.arraycopy(f, 0, data, pos, f.length);
      pos += f.length;
    }
    System.arraycopy(packed, 0, data, pos, packed.length);
    pos += packed.length;
    for (int i = 0; i < 4; i++) {
      data[pos++] = (byte) (packed.length >>> (8 * i));
    }
    long digest = checksum(data);
    String name = kind + Integer.toString(index) + "-" + hex16(digest);
    return new Chunk(name, lo, hi, data, digest, (int) rawTotal, stop - start, packed.length,
        checksum(packed));
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
    if (data.length > 0 && (data[0] & 0xff) == BLOCKED) {
      return decodeBlocked(data, maxRaw, what);
    }
    byte[] raw = decompress(data, maxRaw, what);
    if (raw.length < 1 || raw[0] != FORMAT) {
      throw new CorruptChunkException("chunk " + what + " has unknown format byte "
          + (raw.length < 1 ? "b''" : String.format("0x%02x", raw[0] & 0xff)));
    }
    return rows(raw, 1, Long.MAX_VALUE, what);
  }

  /** A blocked chunk's index (Python's BlockIndex): each block's first key, place and checksum. */
  public record Index(int[] groups, byte[][] firstKeys, long[] offsets, int[] lengths,
      long[] checksums, int[] rows, long rowsTotal, byte[] keys) {
    /** False only if the chunk surely does not hold {@code key} (its Bloom filter says so). */
    public boolean mayHold(byte[] key) {
      if (keys.length == 0) {
        return true;
      }
      long m = keys.length * 8L;
      long h = Xxh3.hash(key);
      long h1 = h & 0xffffffffL;
      long h2 = h >>> 32;
      for (int p = 0; p < BLOOM_PROBES; p++) {
        long b = (h1 + p * h2) % m;
        if ((keys[(int) (b >>> 3)] & (1 << (b & 7))) == 0) {
          return false;
        }
      }
      return true;
    }

    /** The one block that can hold {@code key} of {@code group}, or -1 if none can. */
    public int find(int group, byte[] key) {
      int lo = 0;
      int hi = groups.length; // first block whose start is past (group, key)
      while (lo < hi) {
        int mid = (lo + hi) >>> 1;
        int c = groups[mid] != group ? Integer.compare(groups[mid], group)
            : Arrays.compareUnsigned(firstKeys[mid], key);
        if (c <= 0) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
      return lo == 0 || !mayHold(key) ? -1 : lo - 1;
    }
  }

  /**
   * Parses a blocked chunk's index ({@code len} bytes at {@code off}); {@code limit} is the
   * bytes of frames it must cover (negative: not checked).
   */
  public static Index parseIndex(byte[] buf, int off, int len, long limit, String what) {
    try {
      Msgpack.Reader in = new Msgpack.Reader(buf, off, len, true);
      if (in.arrayHeader() != 2) {
        throw new CorruptChunkException("chunk " + what + " index is not [entries, filter]");
      }
      long n = in.arrayHeader();
      if (n > len) {
        throw new Msgpack.FormatException("index of " + n + " entries in " + len + " bytes");
      }
      int count = (int) n;
      Index ix = new Index(new int[count], new byte[count][], new long[count], new int[count],
          new long[count], new int[count], 0, null);
      long at = 1;
      long total = 0;
      for (int i = 0; i < count; i++) {
        if (!(in.value() instanceof List<?> e) || e.size() != 5 || !(e.get(1) instanceof byte[] first)) {
          throw new CorruptChunkException("chunk " + what + " index entry " + i + " is malformed");
        }
        long group = nonNegative(e.get(0), what);
        long length = nonNegative(e.get(2), what);
        long rows = nonNegative(e.get(4), what);
        Object sum = e.get(3);
        long checksum = sum instanceof java.math.BigInteger bi ? bi.longValue() : nonNegative(sum, what);
        if (group > 65535 || length < 1 || length > Integer.MAX_VALUE || rows < 1
            || rows > MAX_CHUNK_ROWS) {
          throw new CorruptChunkException("chunk " + what + " index entry " + i + " is malformed");
        }
        if (i > 0 && (group < ix.groups[i - 1]
            || group == ix.groups[i - 1] && Arrays.compareUnsigned(first, ix.firstKeys[i - 1]) < 0)) {
          throw new CorruptChunkException("chunk " + what + " index is not in key order");
        }
        ix.groups[i] = (int) group;
        ix.firstKeys[i] = first;
        ix.offsets[i] = at;
        ix.lengths[i] = (int) length;
        ix.checksums[i] = checksum;
        ix.rows[i] = (int) rows;
        at += length;
        total += rows;
      }
      byte[] keys = in.binOrNil();
      if (keys == null || (keys.length > 0 && keys.length < 8)) {
        throw new CorruptChunkException("chunk " + what + " index has no usable key filter");
      }
      if (!in.atEnd()) {
        throw new Msgpack.FormatException("extra data after the index");
      }
      if (limit >= 0 && at - 1 != limit) {
        throw new CorruptChunkException(
            "chunk " + what + " index covers " + (at - 1) + " bytes of frames, not " + limit);
      }
      return new Index(ix.groups, ix.firstKeys, ix.offsets, ix.lengths, ix.checksums, ix.rows, total,
          keys);
    } catch (Msgpack.FormatException | IndexOutOfBoundsException e) {
      throw new CorruptChunkException(
          "chunk " + what + " index does not decode (" + e.getMessage() + ")", e);
    }
  }

  private static long nonNegative(Object o, String what) {
    if (o instanceof Long l && l >= 0) {
      return l;
    }
    throw new CorruptChunkException("chunk " + what + " index holds " + o + ", not a count");
  }

  /** Verifies and decodes block {@code i} of a blocked chunk, its frame at {@code off}. */
  public static List<Row> decodeBlock(byte[] buf, int off, Index ix, int i, int maxRaw, String what) {
    String block = what + " block " + i;
    byte[] frame = Arrays.copyOfRange(buf, off, off + ix.lengths()[i]);
    if (checksum(frame) != ix.checksums()[i]) {
      throw new CorruptChunkException("chunk " + block + " is corrupt: it does not match its index entry;"
          + " it will be read from another replica");
    }
    long declared = Zstd.getFrameContentSize(frame, 0, frame.length);
    if (declared < 0) {
      throw new CorruptChunkException("chunk " + block + " is not a zstd frame declaring its size");
    }
    byte[] raw = decompress(frame, maxRaw, block);
    List<Row> rows = rows(raw, 0, ix.rows()[i], block);
    if (rows.size() != ix.rows()[i] || !Arrays.equals(rows.get(0).key(), ix.firstKeys()[i])) {
      throw new CorruptChunkException("chunk " + block + " does not hold what its index entry says");
    }
    return rows;
  }

  private static List<Row> decodeBlocked(byte[] data, int maxRaw, String what) {
    if (data.length < 5) {
      throw new CorruptChunkException("chunk " + what + " is too short for a blocked chunk");
    }
    int t = data.length - 4;
    long indexLen = (data[t] & 0xffL) | (data[t + 1] & 0xffL) << 8 | (data[t + 2] & 0xffL) << 16
        | (data[t + 3] & 0xffL) << 24;
    if (indexLen > data.length - 5) {
      throw new CorruptChunkException("chunk " + what + " names an index longer than itself");
    }
    int end = (int) (t - indexLen);
    Index ix = parseIndex(data, end, (int) indexLen, end - 1, what);
    if (ix.rowsTotal() > MAX_CHUNK_ROWS) {
      throw new DecompressionBombException("chunk " + what + " holds more than " + MAX_CHUNK_ROWS
          + " rows: refused as a bomb");
    }
    long budget = maxRaw;
    List<Row> out = new ArrayList<>((int) ix.rowsTotal());
    for (int i = 0; i < ix.offsets().length; i++) {
      int off = (int) ix.offsets()[i];
      long declared = Zstd.getFrameContentSize(data, off, ix.lengths()[i]);
      if (declared < 0 || declared > budget) {
        throw new DecompressionBombException(String.format(
            "chunk %s would decompress past the limit (%d more bytes with %d left); "
                + "raise --max-chunk if this is real data", what, declared, budget));
      }
      budget -= declared;
      out.addAll(decodeBlock(data, off, ix, i, maxRaw, what));
    }
    return out;
  }

  /** The rows of a msgpack array of keys and values at {@code off}, at most {@code maxRows}. */
  private static List<Row> rows(byte[] raw, int off, long maxRows, String what) {
    try {
      Msgpack.Reader in = new Msgpack.Reader(raw, off, raw.length - off, true);
      long n = in.arrayHeader();
      if (n % 2 != 0) {
        throw new CorruptChunkException("chunk " + what + " payload is not a list of key/value pairs");
      }
      if (n / 2 > maxRows) {
        throw new DecompressionBombException(
            "chunk " + what + " holds more than " + maxRows + " rows: refused as a bomb");
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
