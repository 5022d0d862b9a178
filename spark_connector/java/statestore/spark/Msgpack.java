package statestore.spark;

import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The msgpack subset the chunk and manifest codecs need, written the way Python's
 * {@code msgpack.packb(obj, use_bin_type=True)} writes it: the smallest integer form
 * (positive fixint, uint8..uint64, negative fixint, int8..int64), fixstr/str8/str16/str32,
 * bin8/bin16/bin32, fixarray/array16/array32, fixmap/map16/map32 (in insertion order),
 * nil, booleans and float64. {@link Reader} reads the same forms back (plus float32) and
 * refuses anything else (ext types) as malformed.
 */
public final class Msgpack {
  private Msgpack() {}

  /** Malformed or unsupported msgpack. */
  public static final class FormatException extends RuntimeException {
    FormatException(String message) {
      super(message);
    }
  }

  private static final BigInteger TWO_64 = BigInteger.ONE.shiftLeft(64);

  /** A growable byte buffer with msgpack writers. */
  public static final class Writer {
    private byte[] buf;
    private int size;

    public Writer() {
      this(256);
    }

    public Writer(int capacity) {
      buf = new byte[Math.max(16, capacity)];
    }

    public int size() {
      return size;
    }

    /** The internal buffer: bytes {@code [0, size())} are what was written. */
    public byte[] buffer() {
      return buf;
    }

    public byte[] toByteArray() {
      return Arrays.copyOf(buf, size);
    }

    public void reset() {
      size = 0;
    }

    private void ensure(int more) {
      long need = (long) size + more;
      if (need > buf.length) {
        if (need > Integer.MAX_VALUE - 8) {
          throw new IllegalStateException("msgpack buffer over 2 GiB");
        }
        buf = Arrays.copyOf(buf, (int) Math.max(need, Math.min(Integer.MAX_VALUE - 8L, buf.length * 2L)));
      }
    }

    public Writer raw(int b) {
      ensure(1);
      buf[size++] = (byte) b;
      return this;
    }

    public Writer raw(byte[] b, int off, int len) {
      ensure(len);
      System.arraycopy(b, off, buf, size, len);
      size += len;
      return this;
    }

    private void be16(int v) {
      ensure(2);
      buf[size++] = (byte) (v >>> 8);
      buf[size++] = (byte) v;
    }

    private void be32(long v) {
      ensure(4);
      buf[size++] = (byte) (v >>> 24);
      buf[size++] = (byte) (v >>> 16);
      buf[size++] = (byte) (v >>> 8);
      buf[size++] = (byte) v;
    }

    private void be64(long v) {
      be32(v >>> 32);
      be32(v);
    }

    public Writer nil() {
      return raw(0xc0);
    }

    public Writer bool(boolean b) {
      return raw(b ? 0xc3 : 0xc2);
    }

    /** A signed 64-bit integer, in its smallest msgpack form. */
    public Writer integer(long v) {
      if (v < -(1L << 5)) {
        if (v < -(1L << 15)) {
          if (v < -(1L << 31)) {
            raw(0xd3);
            be64(v);
          } else {
            raw(0xd2);
            be32(v);
          }
        } else if (v < -(1L << 7)) {
          raw(0xd1);
          be16((int) v);
        } else {
          raw(0xd0);
          raw((int) v);
        }
      } else if (v < (1L << 7)) {
        raw((int) v);
      } else {
        unsigned(v);
      }
      return this;
    }

    /** An unsigned 64-bit integer held in {@code v}'s bits (a checksum), smallest form. */
    public Writer unsigned(long v) {
      if (v >= 0 && v < (1L << 7)) {
        raw((int) v);
      } else if (v >= 0 && v < (1L << 8)) {
        raw(0xcc);
        raw((int) v);
      } else if (v >= 0 && v < (1L << 16)) {
        raw(0xcd);
        be16((int) v);
      } else if (v >= 0 && v < (1L << 32)) {
        raw(0xce);
        be32(v);
      } else {
        raw(0xcf);
        be64(v);
      }
      return this;
    }

    public Writer float64(double d) {
      raw(0xcb);
      be64(Double.doubleToRawLongBits(d));
      return this;
    }

    public Writer str(String s) {
      byte[] b = s.getBytes(StandardCharsets.UTF_8);
      int n = b.length;
      if (n <= 31) {
        raw(0xa0 | n);
      } else if (n <= 0xff) {
        raw(0xd9);
        raw(n);
      } else if (n <= 0xffff) {
        raw(0xda);
        be16(n);
      } else {
        raw(0xdb);
        be32(n);
      }
      return raw(b, 0, n);
    }

    public Writer binHeader(int n) {
      if (n <= 0xff) {
        raw(0xc4);
        raw(n);
      } else if (n <= 0xffff) {
        raw(0xc5);
        be16(n);
      } else {
        raw(0xc6);
        be32(n);
      }
      return this;
    }

    public Writer bin(byte[] b) {
      binHeader(b.length);
      return raw(b, 0, b.length);
    }

    public Writer arrayHeader(long n) {
      if (n <= 15) {
        raw(0x90 | (int) n);
      } else if (n <= 0xffff) {
        raw(0xdc);
        be16((int) n);
      } else {
        raw(0xdd);
        be32(n);
      }
      return this;
    }

    public Writer mapHeader(long n) {
      if (n <= 15) {
        raw(0x80 | (int) n);
      } else if (n <= 0xffff) {
        raw(0xde);
        be16((int) n);
      } else {
        raw(0xdf);
        be32(n);
      }
      return this;
    }

    /**
     * A JSON-like value: null, Boolean, Integer/Long/Short/Byte, BigInteger (within
     * [-2^63, 2^64)), Float/Double (as float64, as Python floats are), String, byte[],
     * List, Map with String keys (in iteration order).
     */
    public Writer value(Object o) {
      if (o == null) {
        return nil();
      } else if (o instanceof Boolean b) {
        return bool(b);
      } else if (o instanceof Long || o instanceof Integer || o instanceof Short || o instanceof Byte) {
        return integer(((Number) o).longValue());
      } else if (o instanceof BigInteger bi) {
        if (bi.bitLength() <= 63) {
          return integer(bi.longValue());
        }
        if (bi.signum() > 0 && bi.compareTo(TWO_64) < 0) {
          return unsigned(bi.longValue());
        }
        throw new IllegalArgumentException("integer " + bi + " does not fit msgpack");
      } else if (o instanceof Double || o instanceof Float) {
        return float64(((Number) o).doubleValue());
      } else if (o instanceof String s) {
        return str(s);
      } else if (o instanceof byte[] b) {
        return bin(b);
      } else if (o instanceof List<?> list) {
        arrayHeader(list.size());
        for (Object e : list) {
          value(e);
        }
        return this;
      } else if (o instanceof Map<?, ?> map) {
        mapHeader(map.size());
        for (Map.Entry<?, ?> e : map.entrySet()) {
          if (!(e.getKey() instanceof String)) {
            throw new IllegalArgumentException("map keys must be strings, got " + e.getKey());
          }
          str((String) e.getKey());
          value(e.getValue());
        }
        return this;
      }
      throw new IllegalArgumentException("cannot encode a " + o.getClass().getName() + " as msgpack");
    }
  }

  /**
   * Reads msgpack from a byte range. Integers come back as Long (BigInteger for uint64 values
   * past Long.MAX_VALUE), str as String (or byte[] with {@link #rawStrings}), bin as byte[],
   * arrays as ArrayList, maps as LinkedHashMap.
   */
  public static final class Reader {
    private final byte[] buf;
    private int pos;
    private final int end;
    private final boolean rawStrings;

    public Reader(byte[] buf, int off, int len, boolean rawStrings) {
      if (off < 0 || len < 0 || off > buf.length - len) {
        throw new IndexOutOfBoundsException("range " + off + "+" + len + " of " + buf.length);
      }
      this.buf = buf;
      this.pos = off;
      this.end = off + len;
      this.rawStrings = rawStrings;
    }

    public int position() {
      return pos;
    }

    public boolean atEnd() {
      return pos >= end;
    }

    private void need(long n) {
      if (n < 0 || n > end - pos) {
        throw new FormatException("msgpack data ends early (needs " + n + " bytes at " + pos + ")");
      }
    }

    public int u8() {
      need(1);
      return buf[pos++] & 0xff;
    }

    private int u16() {
      need(2);
      int v = ((buf[pos] & 0xff) << 8) | (buf[pos + 1] & 0xff);
      pos += 2;
      return v;
    }

    private long u32() {
      need(4);
      long v = ((long) (buf[pos] & 0xff) << 24) | ((buf[pos + 1] & 0xff) << 16)
          | ((buf[pos + 2] & 0xff) << 8) | (buf[pos + 3] & 0xff);
      pos += 4;
      return v;
    }

    private long u64() {
      return (u32() << 32) | u32();
    }

    private int length(long n) {
      if (n > end - pos) {
        throw new FormatException("msgpack length " + n + " runs past the data");
      }
      return (int) n;
    }

    /** Reads a bin or str (as bytes) or nil (as null) at the current position. */
    public byte[] binOrNil() {
      int t = u8();
      int n;
      if (t == 0xc0) {
        return null;
      } else if (t == 0xc4 || t == 0xd9) {
        n = u8();
      } else if (t == 0xc5 || t == 0xda) {
        n = u16();
      } else if (t == 0xc6 || t == 0xdb) {
        n = length(u32());
      } else if ((t & 0xe0) == 0xa0) {
        n = t & 0x1f;
      } else {
        throw new FormatException(String.format("expected bytes or nil, found type byte 0x%02x", t));
      }
      need(n);
      byte[] out = Arrays.copyOfRange(buf, pos, pos + n);
      pos += n;
      return out;
    }

    /** Reads an array header, returning the element count. */
    public long arrayHeader() {
      int t = u8();
      if ((t & 0xf0) == 0x90) {
        return t & 0x0f;
      } else if (t == 0xdc) {
        return u16();
      } else if (t == 0xdd) {
        return u32();
      }
      throw new FormatException(String.format("expected an array, found type byte 0x%02x", t));
    }

    public Object value() {
      int t = u8();
      if (t <= 0x7f) {
        return (long) t;
      } else if (t >= 0xe0) {
        return (long) (byte) t;
      } else if ((t & 0xf0) == 0x80) {
        return map(t & 0x0f);
      } else if ((t & 0xf0) == 0x90) {
        return array(t & 0x0f);
      } else if ((t & 0xe0) == 0xa0) {
        return string(t & 0x1f);
      }
      switch (t) {
        case 0xc0:
          return null;
        case 0xc2:
          return Boolean.FALSE;
        case 0xc3:
          return Boolean.TRUE;
        case 0xc4:
          return bytes(u8());
        case 0xc5:
          return bytes(u16());
        case 0xc6:
          return bytes(length(u32()));
        case 0xca:
          return (double) Float.intBitsToFloat((int) u32());
        case 0xcb:
          return Double.longBitsToDouble(u64());
        case 0xcc:
          return (long) u8();
        case 0xcd:
          return (long) u16();
        case 0xce:
          return u32();
        case 0xcf: {
          long v = u64();
          return v >= 0 ? (Object) v : new BigInteger(Long.toUnsignedString(v));
        }
        case 0xd0:
          return (long) (byte) u8();
        case 0xd1:
          return (long) (short) u16();
        case 0xd2:
          return (long) (int) u32();
        case 0xd3:
          return u64();
        case 0xd9:
          return string(u8());
        case 0xda:
          return string(u16());
        case 0xdb:
          return string(length(u32()));
        case 0xdc:
          return array(u16());
        case 0xdd:
          return array(u32());
        case 0xde:
          return map(u16());
        case 0xdf:
          return map(u32());
        default:
          throw new FormatException(String.format("unsupported msgpack type byte 0x%02x", t));
      }
    }

    private byte[] bytes(int n) {
      need(n);
      byte[] out = Arrays.copyOfRange(buf, pos, pos + n);
      pos += n;
      return out;
    }

    private Object string(int n) {
      byte[] b = bytes(n);
      return rawStrings ? b : new String(b, StandardCharsets.UTF_8);
    }

    private List<Object> array(long n) {
      length(n); // every element takes at least one byte
      List<Object> out = new ArrayList<>((int) n);
      for (long i = 0; i < n; i++) {
        out.add(value());
      }
      return out;
    }

    private Map<Object, Object> map(long n) {
      length(2 * n);
      Map<Object, Object> out = new LinkedHashMap<>();
      for (long i = 0; i < n; i++) {
        Object k = value();
        if (k instanceof byte[]) {
          throw new FormatException("msgpack map keys must not be bytes");
        }
        out.put(k, value());
      }
      return out;
    }
  }
}
