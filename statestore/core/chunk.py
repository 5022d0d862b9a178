"""Key groups and the chunk codec (pure).

A commit's rows are laid out by key group (``xxh3_64(key) % groups``), sorted, and cut into
chunks of about ``target_size`` raw bytes. A chunk covers a contiguous key-group range
``[lo, hi]`` (a group bigger than the target spans several chunks). Its checksum is xxh3-64
of its bytes, so a node can verify a chunk without decompressing it. Decoding refuses frames
that would expand past a limit. Two layouts, both read:

- **Blocked** (format 2, written since 0.3.0): the rows are cut again into blocks of about
  ``block_size`` raw bytes (a snapshot's: a quarter of it, ``SNAPSHOT_BLOCKS``), each a
  msgpack array of alternating keys and values (``None`` marks a delete) compressed on its
  own with zstd level 1. The chunk is the byte ``0xb2``, the blocks' frames one after
  another, the index, and the index's length (4 bytes, little endian). The index is a
  msgpack array of two: the entries, ``[group, first key, frame length, xxh3-64 of the
  frame, rows]`` one per block, and a Bloom filter of the chunk's keys (a snapshot's; empty
  bytes for a delta's), so a read of a key the chunk does not hold
  fetches no block (:func:`bloom`). The manifest names the index's length and checksum
  (``ChunkRef.index_len``, ``index_checksum``), so a reader can fetch the index, then the one
  block a key can be in, by range (``GET /v1/chunks/{key}?offset=&length=``), each verified.
- **Whole** (format 1): one zstd frame of the format byte ``0x01`` and the msgpack array.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import cast

import msgpack
import xxhash
import zstandard

from statestore.core.errors import CorruptChunk, DecompressionBomb, InvalidRequest, PayloadTooLarge

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_KEY_GROUPS",
    "MAX_CHUNK_RAW",
    "MAX_CHUNK_ROWS",
    "SNAPSHOT_BLOCKS",
    "BlockIndex",
    "EncodedChunk",
    "Row",
    "bloom",
    "checksum",
    "decode_block",
    "decode_chunk",
    "decoded_bound",
    "encode_chunks",
    "index_span",
    "key_group",
    "parse_index",
    "verify",
]

DEFAULT_KEY_GROUPS = 128
DEFAULT_CHUNK_SIZE = 4 * 1024 * 1024
MAX_CHUNK_RAW = 256 * 1024 * 1024
# Rows per chunk, on both sides: a 268-byte frame of msgpack nils would otherwise decode to
# hundreds of millions of Python objects (docs/security.md, Hardened endpoints); the encoder
# cuts chunks at this count.
MAX_CHUNK_ROWS = 1 << 20
DEFAULT_BLOCK_SIZE = 16 * 1024
# A snapshot's blocks are ``block_size // SNAPSHOT_BLOCKS``: a snapshot is the base that lazy
# restores and point reads fetch one block at a time, and a batch touching 1% of the keys at
# random touches ~45% of 16 KiB blocks of 250-byte rows but ~14% of 4 KiB ones (for 5% more
# bytes and ~1.5x the decode time of a whole read: docs/benchmarks.md); a delta is read whole.
SNAPSHOT_BLOCKS = 4
BLOOM_BITS_PER_KEY = 16
BLOOM_PROBES = 3  # about 0.5% false positives at 16 bits a key
_FORMAT = b"\x01"
_BLOCKED = b"\xb2"
_TRAILER = 4  # the index's length, little endian
INDEX_OVERHEAD = 1 + _TRAILER  # a blocked chunk's bytes besides its frames and index
_ROW_OVERHEAD = 10

Row = tuple[bytes, bytes | None]


@dataclass(frozen=True)
class EncodedChunk:
    """One compressed chunk, ready to send."""

    name: str
    lo: int
    hi: int
    data: bytes
    checksum: int
    raw_size: int
    rows: int
    # a blocked chunk's index: its length and checksum (0, 0 for a whole chunk)
    index_len: int = 0
    index_checksum: int = 0


def key_group(key: bytes, groups: int) -> int:
    """The key group of ``key`` among ``groups`` groups."""
    return xxhash.xxh3_64_intdigest(key) % groups


def checksum(data: bytes | memoryview) -> int:
    """xxh3-64 of ``data`` (the compressed chunk bytes)."""
    return xxhash.xxh3_64_intdigest(data)


def verify(data: bytes, expected: int, what: str) -> None:
    """Raise CorruptChunk if ``data`` does not have checksum ``expected``."""
    got = checksum(data)
    if got != expected:
        raise CorruptChunk(
            f"chunk {what} is corrupt: checksum {got:016x} != expected {expected:016x}; "
            "it will be read from another replica, and repair rewrites the bad copy"
        )


def _check_bytes(what: str, value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"{what} must be bytes, got {type(value).__name__}")


def encode_chunks(
    puts: Mapping[bytes, bytes],
    deletes: Iterable[bytes],
    *,
    groups: int = DEFAULT_KEY_GROUPS,
    target_size: int = DEFAULT_CHUNK_SIZE,
    kind: str = "d",
    max_raw: int = MAX_CHUNK_RAW,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> list[EncodedChunk]:
    """Lay rows out by key group and cut them into compressed chunks.

    ``kind`` is ``"d"`` for a delta, ``"w"`` for a snapshot a writer commits whole and
    ``"s"`` for one a compactor folds (core/manifest.Manifest.whole); it prefixes chunk
    names. A snapshot's chunks (``s`` or ``w``) are laid out alike.
    ``block_size`` is the blocked layout's block size (a snapshot's is a quarter of it); 0
    writes whole (format 1) chunks.
    Raises InvalidRequest for a key both put and deleted, PayloadTooLarge if one row is
    bigger than ``max_raw`` and TypeError for keys or values that are not bytes.
    """
    # This runs for every commit, so the per-row work is left to C where CPython allows it
    # (map, slicing, accumulate): one hash per key into per-group buckets, each sorted as
    # plain bytes, and chunk cuts found by bisection over the running row sizes.
    table: Mapping[bytes, bytes] = puts
    if not all(type(k) is bytes and type(v) is bytes for k, v in puts.items()):
        table = {_check_bytes("key", k): _check_bytes("value", v) for k, v in puts.items()}
    if table and max(map(len, table)) + max(map(len, table.values())) > max_raw - _ROW_OVERHEAD:
        for k, v in table.items():
            if len(k) + len(v) + _ROW_OVERHEAD > max_raw:
                raise PayloadTooLarge(
                    f"row of {len(k) + len(v)} bytes is over the {max_raw}-byte chunk limit"
                )
    # duplicates kept, as the first codec kept them: same rows in, same chunk bytes out
    gone = [k if type(k) is bytes else _check_bytes("deleted key", k) for k in deletes]
    for key in gone:
        if key in table:
            raise InvalidRequest(
                f"key {key[:64]!r} is both put and deleted in one commit: keep one of the two"
            )
    buckets: list[list[bytes]] = [[] for _ in range(groups)]
    everything = [*table, *gone]
    hashes = map(xxhash.xxh3_64_intdigest, everything)
    for g, k in zip(map(groups.__rmod__, hashes), everything, strict=True):
        buckets[g].append(k)
    for b in buckets:
        b.sort()
    keys = [k for b in buckets for k in b]
    group_of = [g for g, b in enumerate(buckets) for _ in b]
    values = list(map(table.get, keys))  # None for a deleted key
    sizes: Iterable[int] = (
        (len(v) if v else 0 for v in values) if gone else map(len, cast(list[bytes], values))
    )
    ends = list(accumulate(map(_ROW_OVERHEAD.__add__, map(int.__add__, map(len, keys), sizes))))

    snapshot = kind in ("s", "w")
    if snapshot and block_size > 0:
        block_size = max(1, block_size // SNAPSHOT_BLOCKS)
    chunks: list[EncodedChunk] = []
    cctx = zstandard.ZstdCompressor(level=1)
    start = 0
    while start < len(keys) or not chunks:
        # the rows from ``start`` whose running size stays within the target (at least one)
        base = ends[start - 1] if start else 0
        stop = max(start + 1, bisect_right(ends, base + target_size, start))
        stop = min(stop, start + MAX_CHUNK_ROWS)
        n = len(keys[start:stop])
        lo, hi = (group_of[start], group_of[stop - 1]) if n else (0, groups - 1)
        if block_size > 0:
            data, raw_size, index_len, index_sum = _blocked(
                keys, values, group_of, ends, start, start + n, block_size, cctx, snapshot
            )
        else:
            flat: list[bytes | None] = [None] * (2 * n)
            flat[0::2] = keys[start:stop]
            flat[1::2] = values[start:stop]
            raw = _FORMAT + msgpack.packb(flat, use_bin_type=True)
            data, raw_size, index_len, index_sum = cctx.compress(raw), len(raw), 0, 0
        digest = checksum(data)
        name = f"{kind}{len(chunks)}-{digest:016x}"
        chunks.append(EncodedChunk(name, lo, hi, data, digest, raw_size, n, index_len, index_sum))
        start = stop
    return chunks


def _blocked(
    keys: list[bytes],
    values: list[bytes | None],
    group_of: list[int],
    ends: list[int],
    start: int,
    stop: int,
    block_size: int,
    cctx: zstandard.ZstdCompressor,
    filtered: bool,
) -> tuple[bytes, int, int, int]:
    """Rows ``[start, stop)`` as one blocked chunk: (bytes, raw size, index length, index
    checksum). Blocks are cut as chunks are: the rows whose running size stays within
    ``block_size``, at least one. ``filtered``: with a Bloom filter of its keys."""
    parts = [_BLOCKED]
    index: list[list[object]] = []
    raw_size = 0
    at = start
    while at < stop:
        base = ends[at - 1] if at else 0
        end = min(stop, max(at + 1, bisect_right(ends, base + block_size, at, stop)))
        flat: list[bytes | None] = [None] * (2 * (end - at))
        flat[0::2] = keys[at:end]
        flat[1::2] = values[at:end]
        raw = msgpack.packb(flat, use_bin_type=True)
        frame = cctx.compress(raw)
        raw_size += len(raw)
        parts.append(frame)
        index.append([group_of[at], keys[at], len(frame), checksum(frame), end - at])
        at = end
    keyed = bloom(keys[start:stop]) if filtered else b""
    packed = msgpack.packb([index, keyed], use_bin_type=True)
    parts.append(packed)
    parts.append(len(packed).to_bytes(_TRAILER, "little"))
    return b"".join(parts), raw_size, len(packed), checksum(packed)


def bloom(keys: Sequence[bytes]) -> bytes:
    """A Bloom filter of ``keys``: :data:`BLOOM_BITS_PER_KEY` bits a key (at least 64, a
    whole number of bytes), :data:`BLOOM_PROBES` probes ``(h1 + i * h2) mod m`` where h1 and
    h2 are the low and high 32 bits of the key's xxh3-64; bit b is bit ``b & 7`` of byte
    ``b >> 3``. Java's ChunkCodec writes the same bytes."""
    m = max(64, -(-len(keys) * BLOOM_BITS_PER_KEY // 8) * 8)
    bits = bytearray(m // 8)
    for h in map(xxhash.xxh3_64_intdigest, keys):
        h1, h2 = h & 0xFFFFFFFF, h >> 32
        for i in range(BLOOM_PROBES):
            b = (h1 + i * h2) % m
            bits[b >> 3] |= 1 << (b & 7)
    return bytes(bits)


def decoded_bound(data: bytes, max_raw: int = MAX_CHUNK_RAW) -> int:
    """The raw bytes decoding ``data`` (a chunk, either layout) would make at most: its
    frames' declared sizes (``max_raw`` for a frame that declares none), at most ``max_raw``,
    the limit :func:`decode_chunk` holds it to. For a reader that takes a chunk's memory
    from a budget before decoding it, where the raw size it has is a writer's word (a
    manifest's ``raw_size``). Bytes that are no chunk count ``max_raw``: their decode fails."""
    try:
        if data[:1] != _BLOCKED:
            declared = zstandard.frame_content_size(data)
            return max_raw if declared < 0 else min(declared, max_raw)
        index_len = int.from_bytes(data[-_TRAILER:], "little")
        if len(data) < 1 + _TRAILER or index_len > len(data) - 1 - _TRAILER:
            return max_raw
        end = len(data) - _TRAILER - index_len
        index = parse_index(data[end : end + index_len], limit=end - 1)
        view = memoryview(data)
        total = 0
        for at, length in zip(index.offsets, index.lengths, strict=True):
            declared = zstandard.frame_content_size(view[at : at + length])
            total += max_raw if declared < 0 else declared
            if total >= max_raw:
                return max_raw
        return total
    except (zstandard.ZstdError, CorruptChunk):
        return max_raw


def decode_chunk(
    data: bytes, *, max_raw: int = MAX_CHUNK_RAW, what: str = "", max_rows: int = MAX_CHUNK_ROWS
) -> list[Row]:
    """Decompress and decode one chunk (either layout) into its rows, in key-group order.

    Raises DecompressionBomb if it would expand past ``max_raw`` bytes or hold more than
    ``max_rows`` rows, and CorruptChunk if it is not a chunk this version of statestore
    wrote (a key that is not bytes, a value that is neither bytes nor nil).
    """
    if data[:1] != _BLOCKED:
        raw = _decompress(data, max_raw, what)
        if raw[:1] != _FORMAT:
            raise CorruptChunk(f"chunk {what} has unknown format byte {raw[:1]!r}")
        return _rows(memoryview(raw)[1:], max_rows, what)
    if len(data) < 1 + _TRAILER:
        raise CorruptChunk(f"chunk {what} is too short for a blocked chunk")
    index_len = int.from_bytes(data[-_TRAILER:], "little")
    if index_len > len(data) - 1 - _TRAILER:
        raise CorruptChunk(f"chunk {what} names an index longer than itself")
    end = len(data) - _TRAILER - index_len
    index = parse_index(data[end : end + index_len], what=what, limit=end - 1)
    if index.rows_total > max_rows:
        raise DecompressionBomb(f"chunk {what} holds more than {max_rows} rows: refused as a bomb")
    # each block is checked against its entry as a block read checks it (a writer's chunk
    # whose own checksum is right may still disagree with its index), with one context
    rows: list[Row] = []
    view = memoryview(data)
    dctx = zstandard.ZstdDecompressor()
    budget = max_raw  # the raw bytes left for the blocks still to decode
    for i in range(len(index.offsets)):
        at = index.offsets[i]
        frame = view[at : at + index.lengths[i]]
        if checksum(frame) != index.checksums[i]:
            raise CorruptChunk(
                f"chunk {what} block {i} is corrupt: it does not match its index entry"
            )
        size = _declared(frame, budget, what)
        budget -= size
        try:
            raw = dctx.decompress(frame, max_output_size=size)
        except zstandard.ZstdError as exc:
            raise CorruptChunk(f"chunk {what} block {i} does not decompress ({exc})") from exc
        block = _rows(memoryview(raw), index.rows[i], f"{what} block {i}")
        if len(block) != index.rows[i] or block[0][0] != index.starts[i][1]:
            raise CorruptChunk(f"chunk {what} block {i} does not hold what its index entry says")
        rows += block
    return rows


@dataclass(frozen=True)
class BlockIndex:
    """A blocked chunk's index, parsed and checked: where each block is, what it starts with
    and how to verify it."""

    starts: tuple[tuple[int, bytes], ...]  # each block's first (group, key)
    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    checksums: tuple[int, ...]
    rows: tuple[int, ...]
    rows_total: int
    keys: bytes = b""  # the Bloom filter of the chunk's keys (empty: none, may hold any)

    def find(self, group: int, key: bytes) -> int | None:
        """The one block that can hold ``key`` (of ``group``), or None if none can (before
        the first block, or not in the Bloom filter)."""
        i = bisect_right(self.starts, (group, key)) - 1
        if i < 0 or not self.may_hold(key):
            return None
        return i

    def may_hold(self, key: bytes) -> bool:
        """False only if the chunk surely does not hold ``key`` (its Bloom filter says so)."""
        if not self.keys:
            return True
        m = len(self.keys) * 8
        h = xxhash.xxh3_64_intdigest(key)
        h1, h2 = h & 0xFFFFFFFF, h >> 32
        for i in range(BLOOM_PROBES):
            b = (h1 + i * h2) % m
            if not self.keys[b >> 3] & (1 << (b & 7)):
                return False
        return True

    @property
    def nbytes(self) -> int:
        """About the memory it takes, for a cache's budget."""
        return sum(len(k) for _, k in self.starts) + 200 * len(self.offsets) + len(self.keys)


def index_span(size: int, index_len: int) -> tuple[int, int]:
    """(offset, length) of the index in a blocked chunk of ``size`` bytes."""
    return size - _TRAILER - index_len, index_len


def parse_index(data: bytes, *, what: str = "", limit: int | None = None) -> BlockIndex:
    """A blocked chunk's index; ``limit`` is the bytes of frames it may cover (the chunk's
    size less the format byte, index and trailer), checked when given. Raises CorruptChunk."""
    try:
        top = msgpack.unpackb(
            data,
            use_list=True,
            raw=True,
            max_array_len=MAX_CHUNK_ROWS,
            max_map_len=0,
            max_ext_len=0,
        )
    except Exception as exc:
        raise CorruptChunk(f"chunk {what} index does not decode ({exc})") from exc
    if not (
        isinstance(top, list)
        and len(top) == 2
        and isinstance(top[0], list)
        and type(top[1]) is bytes
        and (not top[1] or len(top[1]) >= 8)
    ):
        raise CorruptChunk(f"chunk {what} index is not [entries, filter]")
    entries, keys = top
    starts: list[tuple[int, bytes]] = []
    offsets, lengths, sums, counts = [], [], [], []
    at = 1
    for e in entries:
        if not (
            isinstance(e, list)
            and len(e) == 5
            and type(e[0]) is int
            and type(e[1]) is bytes
            and all(type(x) is int and 0 <= x < 2**64 for x in (e[0], *e[2:]))
            and e[2] > 0
            and e[4] > 0
        ):
            raise CorruptChunk(f"chunk {what} index entry {e!r:.120} is malformed")
        first = (e[0], e[1])
        if starts and first < starts[-1]:  # equal: a key deleted twice, cut between blocks
            raise CorruptChunk(f"chunk {what} index is not in key order")
        starts.append(first)
        offsets.append(at)
        lengths.append(e[2])
        sums.append(e[3])
        counts.append(e[4])
        at += e[2]
    if limit is not None and at - 1 != limit:
        raise CorruptChunk(f"chunk {what} index covers {at - 1} bytes of frames, not {limit}")
    return BlockIndex(
        tuple(starts), tuple(offsets), tuple(lengths), tuple(sums), tuple(counts), sum(counts), keys
    )


def decode_block(
    frame: bytes | memoryview,
    index: BlockIndex,
    i: int,
    *,
    max_raw: int = MAX_CHUNK_RAW,
    what: str = "",
    dctx: zstandard.ZstdDecompressor | None = None,
) -> list[Row]:
    """Verify and decode block ``i`` of a blocked chunk (its frame's bytes) into its rows;
    ``dctx``, a decompression context to use (one thread's: making one costs ~10x
    decompressing a 4 KiB block, so a reader of many blocks keeps one)."""
    if len(frame) != index.lengths[i] or checksum(frame) != index.checksums[i]:
        raise CorruptChunk(
            f"chunk {what} block {i} is corrupt: it does not match its index entry; "
            "it will be read from another replica"
        )
    raw = _decompress(frame, max_raw, f"{what} block {i}", dctx)
    rows = _rows(memoryview(raw), index.rows[i], f"{what} block {i}")
    if len(rows) != index.rows[i] or rows[0][0] != index.starts[i][1]:
        raise CorruptChunk(f"chunk {what} block {i} does not hold what its index entry says")
    return rows


def _declared(frame: bytes | memoryview, budget: int, what: str) -> int:
    """The raw size ``frame`` declares, refused past ``budget`` (blocked chunks declare it)."""
    try:
        declared = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as exc:
        raise CorruptChunk(f"chunk {what} holds a block that is not a zstd frame ({exc})") from exc
    if declared < 0 or declared > budget:
        raise DecompressionBomb(
            f"chunk {what} would decompress past the limit ({declared} more bytes with "
            f"{budget} left); raise --max-chunk if this is real data"
        )
    return int(declared)


def _decompress(
    data: bytes | memoryview,
    max_raw: int,
    what: str,
    dctx: zstandard.ZstdDecompressor | None = None,
) -> bytes:
    try:
        declared = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise CorruptChunk(f"chunk {what} is not a zstd frame ({exc})") from exc
    if declared > max_raw:
        raise DecompressionBomb(
            f"chunk {what} would decompress to {declared} bytes, past the {max_raw}-byte limit; "
            "raise --max-chunk if this is real data"
        )
    try:
        if declared >= 0:
            raw = (dctx if dctx is not None else zstandard.ZstdDecompressor()).decompress(data)
        else:  # no declared size: stream it and stop one byte past the limit
            reader = zstandard.ZstdDecompressor().stream_reader(data)
            parts, total = [], 0
            while total <= max_raw:
                piece = reader.read(min(1 << 20, max_raw + 1 - total))
                if not piece:
                    break
                parts.append(piece)
                total += len(piece)
            if total > max_raw:
                raise DecompressionBomb(
                    f"chunk {what} decompresses past the {max_raw}-byte limit; "
                    "raise --max-chunk if this is real data"
                )
            raw = b"".join(parts)
    except zstandard.ZstdError as exc:
        raise CorruptChunk(f"chunk {what} does not decompress ({exc})") from exc
    return raw


_BYTES = {bytes}
_BYTES_OR_NONE = {bytes, type(None)}


def _rows(raw: memoryview, max_rows: int, what: str) -> list[Row]:
    try:
        flat = msgpack.unpackb(
            raw,
            use_list=True,
            raw=True,
            max_array_len=2 * max_rows,
            max_map_len=0,
            max_ext_len=0,
        )
    except ValueError as exc:
        if "exceeds max" in str(exc):
            raise DecompressionBomb(
                f"chunk {what} holds more than {max_rows} rows: refused as a bomb"
            ) from exc
        raise CorruptChunk(f"chunk {what} payload does not decode ({exc})") from exc
    except Exception as exc:
        raise CorruptChunk(f"chunk {what} payload does not decode ({exc})") from exc
    if not isinstance(flat, list) or len(flat) % 2:
        raise CorruptChunk(f"chunk {what} payload is not a list of key/value pairs")
    keys, values = flat[0::2], flat[1::2]
    if not set(map(type, keys)) <= _BYTES or not set(map(type, values)) <= _BYTES_OR_NONE:
        raise CorruptChunk(f"chunk {what} has a key or value that is not bytes")
    return list(zip(keys, values, strict=True))
