package statestore.spark;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;

import org.apache.spark.unsafe.Platform;

/**
 * XXH3-64 with seed 0 and the default secret, as {@code xxhash.xxh3_64_intdigest} computes it
 * (key groups and chunk checksums of {@code statestore/core/chunk.py}). Written from the XXH3
 * specification, scalar path: 0, 1-3, 4-8, 9-16, 17-128 and 129-240 bytes, and the long
 * path (stripes of 64 bytes, blocks of 16 stripes, the last partial block and last stripe).
 * Results are unsigned 64-bit values held in a {@code long}.
 */
public final class Xxh3 {
  private Xxh3() {}

  private static final VarHandle LE64 =
      MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
  private static final VarHandle LE32 =
      MethodHandles.byteArrayViewVarHandle(int[].class, ByteOrder.LITTLE_ENDIAN);

  static final long PRIME32_1 = 0x9E3779B1L;
  static final long PRIME32_2 = 0x85EBCA77L;
  static final long PRIME32_3 = 0xC2B2AE3DL;
  static final long PRIME64_1 = 0x9E3779B185EBCA87L;
  static final long PRIME64_2 = 0xC2B2AE3D27D4EB4FL;
  static final long PRIME64_3 = 0x165667B19E3779F9L;
  static final long PRIME64_4 = 0x85EBCA77C2B2AE63L;
  static final long PRIME64_5 = 0x27D4EB2F165667C5L;
  private static final long PRIME_MX1 = 0x165667919E3779F9L;
  private static final long PRIME_MX2 = 0x9FB21C651E98DF25L;

  private static final int STRIPE_LEN = 64;
  private static final int SECRET_CONSUME_RATE = 8;
  private static final int SECRET_SIZE_MIN = 136;

  /** The default 192-byte secret (kSecret of the reference implementation). */
  private static final byte[] SECRET = bytes(
      0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
      0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
      0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
      0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
      0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
      0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
      0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
      0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
      0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
      0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
      0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
      0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e);

  // secret words used by the short paths, read once
  private static final long S_0TO16 = r64(SECRET, 56) ^ r64(SECRET, 64);
  private static final long S_1TO3 = (r32(SECRET, 0) ^ r32(SECRET, 4)) & 0xFFFFFFFFL;
  private static final long S_4TO8 = r64(SECRET, 8) ^ r64(SECRET, 16);
  private static final long S_9TO16_LO = r64(SECRET, 24) ^ r64(SECRET, 32);
  private static final long S_9TO16_HI = r64(SECRET, 40) ^ r64(SECRET, 48);

  private static byte[] bytes(int... v) {
    byte[] b = new byte[v.length];
    for (int i = 0; i < v.length; i++) {
      b[i] = (byte) v[i];
    }
    return b;
  }

  static long r64(byte[] b, int off) {
    return (long) LE64.get(b, off);
  }

  private static final boolean LITTLE = ByteOrder.nativeOrder() == ByteOrder.LITTLE_ENDIAN;

  /**
   * {@link #r64} without the bounds check, for the long path's stripes only: {@link #hash}
   * checked the range, and every stripe lies in it (the view handle's check on each word
   * took a third of a commit's checksum time).
   */
  private static long stripe64(byte[] b, int off) {
    return LITTLE ? Platform.getLong(b, Platform.BYTE_ARRAY_OFFSET + off) : r64(b, off);
  }

  static int r32(byte[] b, int off) {
    return (int) LE32.get(b, off);
  }

  /** XXH3-64 of all of {@code data}. */
  public static long hash(byte[] data) {
    return hash(data, 0, data.length);
  }

  /** XXH3-64 of {@code data[off, off + len)}. */
  public static long hash(byte[] data, int off, int len) {
    if (off < 0 || len < 0 || off > data.length - len) {
      throw new IndexOutOfBoundsException("range " + off + "+" + len + " of " + data.length);
    }
    if (len <= 16) {
      return len0to16(data, off, len);
    }
    if (len <= 128) {
      return len17to128(data, off, len);
    }
    if (len <= 240) {
      return len129to240(data, off, len);
    }
    return hashLong(data, off, len);
  }

  /** {@code hash(data) % groups} with the hash read as unsigned, as Python computes it. */
  public static int keyGroup(byte[] key, int groups) {
    return (int) Long.remainderUnsigned(hash(key), groups);
  }

  /** The high 64 bits of the unsigned 128-bit product of {@code a} and {@code b}. */
  static long unsignedMultiplyHigh(long a, long b) {
    return Math.multiplyHigh(a, b) + ((a >> 63) & b) + ((b >> 63) & a);
  }

  private static long mul128Fold64(long a, long b) {
    return (a * b) ^ unsignedMultiplyHigh(a, b);
  }

  static long xxh64Avalanche(long h) {
    h ^= h >>> 33;
    h *= PRIME64_2;
    h ^= h >>> 29;
    h *= PRIME64_3;
    h ^= h >>> 32;
    return h;
  }

  private static long avalanche(long h) {
    h ^= h >>> 37;
    h *= PRIME_MX1;
    h ^= h >>> 32;
    return h;
  }

  private static long len0to16(byte[] in, int off, int len) {
    if (len > 8) {
      long lo = S_9TO16_LO ^ r64(in, off);
      long hi = S_9TO16_HI ^ r64(in, off + len - 8);
      long acc = len + Long.reverseBytes(lo) + hi + mul128Fold64(lo, hi);
      return avalanche(acc);
    }
    if (len >= 4) {
      long in1 = r32(in, off) & 0xFFFFFFFFL;
      long in2 = r32(in, off + len - 4) & 0xFFFFFFFFL;
      long acc = S_4TO8 ^ (in2 | (in1 << 32));
      acc ^= Long.rotateLeft(acc, 49) ^ Long.rotateLeft(acc, 24);
      acc *= PRIME_MX2;
      acc ^= (acc >>> 35) + len;
      acc *= PRIME_MX2;
      return acc ^ (acc >>> 28);
    }
    if (len > 0) {
      int c1 = in[off] & 0xFF;
      int c2 = in[off + (len >> 1)] & 0xFF;
      int c3 = in[off + len - 1] & 0xFF;
      long combined = ((c1 << 16) | (c2 << 24) | c3 | (len << 8)) & 0xFFFFFFFFL;
      return xxh64Avalanche(combined ^ S_1TO3);
    }
    return xxh64Avalanche(S_0TO16);
  }

  private static long mix16(byte[] in, int off, int secretOff) {
    long lhs = r64(SECRET, secretOff) ^ r64(in, off);
    long rhs = r64(SECRET, secretOff + 8) ^ r64(in, off + 8);
    return mul128Fold64(lhs, rhs);
  }

  private static long len17to128(byte[] in, int off, int len) {
    long acc = len * PRIME64_1;
    long accEnd;
    acc += mix16(in, off, 0);
    accEnd = mix16(in, off + len - 16, 16);
    if (len > 32) {
      acc += mix16(in, off + 16, 32);
      accEnd += mix16(in, off + len - 32, 48);
      if (len > 64) {
        acc += mix16(in, off + 32, 64);
        accEnd += mix16(in, off + len - 48, 80);
        if (len > 96) {
          acc += mix16(in, off + 48, 96);
          accEnd += mix16(in, off + len - 64, 112);
        }
      }
    }
    return avalanche(acc + accEnd);
  }

  private static long len129to240(byte[] in, int off, int len) {
    long acc = len * PRIME64_1;
    int rounds = len / 16;
    for (int i = 0; i < 8; i++) {
      acc += mix16(in, off + 16 * i, 16 * i);
    }
    acc = avalanche(acc);
    for (int i = 8; i < rounds; i++) {
      acc += mix16(in, off + 16 * i, 16 * (i - 8) + 3);
    }
    acc += mix16(in, off + len - 16, SECRET_SIZE_MIN - 17);
    return avalanche(acc);
  }

  /** The secret as little-endian words at every 8-byte offset (the stripes' keys). */
  private static final long[] SECRET_WORDS = words(0, 24);

  /** The keys of the last stripe, read at the unaligned offset the reference uses. */
  private static final long[] LAST_KEYS = words(SECRET.length - STRIPE_LEN - 7, 8);

  private static long[] words(int from, int n) {
    long[] w = new long[n];
    for (int i = 0; i < n; i++) {
      w[i] = r64(SECRET, from + 8 * i);
    }
    return w;
  }

  /**
   * The long path. The eight lanes are locals, not an array, and every stripe goes through
   * one loop: written with a {@code long[]} accumulator and a stripe method (the reference's
   * shape), JDK 17's C2 now and then compiled it to a wrong sum for every long input hashed
   * after the compilation (chunk names differing from Python's, in 2-7% of the runs of
   * tests/ring/test_java_codec.py; never under C1, and not SuperWord's doing).
   */
  private static long hashLong(byte[] in, int off, int len) {
    final int stripesPerBlock = (SECRET.length - STRIPE_LEN) / SECRET_CONSUME_RATE;
    final int blockLen = STRIPE_LEN * stripesPerBlock;
    final int blocks = (len - 1) / blockLen;
    final int fullStripes = blocks * stripesPerBlock;
    // the stripes of the full blocks, those of the last partial block, then the last stripe
    final int total = fullStripes + (len - 1 - blockLen * blocks) / STRIPE_LEN + 1;
    long a0 = PRIME32_3;
    long a1 = PRIME64_1;
    long a2 = PRIME64_2;
    long a3 = PRIME64_3;
    long a4 = PRIME64_4;
    long a5 = PRIME32_2;
    long a6 = PRIME64_5;
    long a7 = PRIME32_1;
    for (int t = 0; t < total; t++) {
      final int p;
      final long[] keys;
      final int k;
      if (t < total - 1) {
        int s = t < fullStripes ? t % stripesPerBlock : t - fullStripes;
        int block = t < fullStripes ? t / stripesPerBlock : blocks;
        p = off + block * blockLen + s * STRIPE_LEN;
        keys = SECRET_WORDS;
        k = s;
      } else {
        p = off + len - STRIPE_LEN;
        keys = LAST_KEYS;
        k = 0;
      }
      long v0 = stripe64(in, p);
      long v1 = stripe64(in, p + 8);
      long v2 = stripe64(in, p + 16);
      long v3 = stripe64(in, p + 24);
      long v4 = stripe64(in, p + 32);
      long v5 = stripe64(in, p + 40);
      long v6 = stripe64(in, p + 48);
      long v7 = stripe64(in, p + 56);
      long k0 = v0 ^ keys[k];
      long k1 = v1 ^ keys[k + 1];
      long k2 = v2 ^ keys[k + 2];
      long k3 = v3 ^ keys[k + 3];
      long k4 = v4 ^ keys[k + 4];
      long k5 = v5 ^ keys[k + 5];
      long k6 = v6 ^ keys[k + 6];
      long k7 = v7 ^ keys[k + 7];
      a0 += v1 + (k0 & 0xFFFFFFFFL) * (k0 >>> 32);
      a1 += v0 + (k1 & 0xFFFFFFFFL) * (k1 >>> 32);
      a2 += v3 + (k2 & 0xFFFFFFFFL) * (k2 >>> 32);
      a3 += v2 + (k3 & 0xFFFFFFFFL) * (k3 >>> 32);
      a4 += v5 + (k4 & 0xFFFFFFFFL) * (k4 >>> 32);
      a5 += v4 + (k5 & 0xFFFFFFFFL) * (k5 >>> 32);
      a6 += v7 + (k6 & 0xFFFFFFFFL) * (k6 >>> 32);
      a7 += v6 + (k7 & 0xFFFFFFFFL) * (k7 >>> 32);
      if (t < fullStripes && t % stripesPerBlock == stripesPerBlock - 1) {
        // the end of a full block: scramble with the last 64 bytes of the secret
        final int w = (SECRET.length - STRIPE_LEN) / 8;
        a0 = scramble(a0, w);
        a1 = scramble(a1, w + 1);
        a2 = scramble(a2, w + 2);
        a3 = scramble(a3, w + 3);
        a4 = scramble(a4, w + 4);
        a5 = scramble(a5, w + 5);
        a6 = scramble(a6, w + 6);
        a7 = scramble(a7, w + 7);
      }
    }
    long result = len * PRIME64_1;
    result += mul128Fold64(a0 ^ r64(SECRET, 11), a1 ^ r64(SECRET, 19));
    result += mul128Fold64(a2 ^ r64(SECRET, 27), a3 ^ r64(SECRET, 35));
    result += mul128Fold64(a4 ^ r64(SECRET, 43), a5 ^ r64(SECRET, 51));
    result += mul128Fold64(a6 ^ r64(SECRET, 59), a7 ^ r64(SECRET, 67));
    return avalanche(result);
  }

  private static long scramble(long a, int word) {
    a ^= a >>> 47;
    a ^= SECRET_WORDS[word];
    return a * PRIME32_1;
  }
}
