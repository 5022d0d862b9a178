"""Key groups and the chunk codec (pure).

A commit's rows are laid out by key group (``xxh3_64(key) % groups``), sorted, and cut into
chunks of about ``target_size`` raw bytes. A chunk covers a contiguous key-group range
``[lo, hi]`` (a group bigger than the target spans several chunks). Its payload is a format
byte and a msgpack array of alternating keys and values (``None`` marks a delete), compressed
with zstd level 1; its checksum is xxh3-64 of the compressed bytes, so a node can verify a
chunk without decompressing it. Decoding refuses frames that would expand past a limit.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import accumulate
from typing import cast

import msgpack
import xxhash
import zstandard

from statestore.core.errors import CorruptChunk, DecompressionBomb, InvalidRequest, PayloadTooLarge

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_KEY_GROUPS",
    "MAX_CHUNK_RAW",
    "MAX_CHUNK_ROWS",
    "EncodedChunk",
    "Row",
    "checksum",
    "decode_chunk",
    "encode_chunks",
    "key_group",
    "verify",
]

DEFAULT_KEY_GROUPS = 128
DEFAULT_CHUNK_SIZE = 4 * 1024 * 1024
MAX_CHUNK_RAW = 256 * 1024 * 1024
# Rows per chunk, on both sides: a 268-byte frame of msgpack nils would otherwise decode to
# hundreds of millions of Python objects (docs/security.md, Hardened endpoints); the encoder
# cuts chunks at this count.
MAX_CHUNK_ROWS = 1 << 20
_FORMAT = b"\x01"
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


def key_group(key: bytes, groups: int) -> int:
    """The key group of ``key`` among ``groups`` groups."""
    return xxhash.xxh3_64_intdigest(key) % groups


def checksum(data: bytes) -> int:
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
) -> list[EncodedChunk]:
    """Lay rows out by key group and cut them into compressed chunks.

    ``kind`` is ``"d"`` for a delta and ``"s"`` for a snapshot; it prefixes chunk names.
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

    chunks: list[EncodedChunk] = []
    cctx = zstandard.ZstdCompressor(level=1)
    start = 0
    while start < len(keys) or not chunks:
        # the rows from ``start`` whose running size stays within the target (at least one)
        base = ends[start - 1] if start else 0
        stop = max(start + 1, bisect_right(ends, base + target_size, start))
        stop = min(stop, start + MAX_CHUNK_ROWS)
        n = len(keys[start:stop])
        flat: list[bytes | None] = [None] * (2 * n)
        flat[0::2] = keys[start:stop]
        flat[1::2] = values[start:stop]
        lo, hi = (group_of[start], group_of[stop - 1]) if n else (0, groups - 1)
        raw = _FORMAT + msgpack.packb(flat, use_bin_type=True)
        data = cctx.compress(raw)
        digest = checksum(data)
        name = f"{kind}{len(chunks)}-{digest:016x}"
        chunks.append(EncodedChunk(name, lo, hi, data, digest, len(raw), n))
        start = stop
    return chunks


def decode_chunk(
    data: bytes, *, max_raw: int = MAX_CHUNK_RAW, what: str = "", max_rows: int = MAX_CHUNK_ROWS
) -> list[Row]:
    """Decompress and decode one chunk into its rows, in key-group order.

    Raises DecompressionBomb if the frame would expand past ``max_raw`` bytes or hold more
    than ``max_rows`` rows, and CorruptChunk if it is not a chunk this version of statestore
    wrote (a key that is not bytes, a value that is neither bytes nor nil).
    """
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
            raw = zstandard.ZstdDecompressor().decompress(data)
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
    if raw[:1] != _FORMAT:
        raise CorruptChunk(f"chunk {what} has unknown format byte {raw[:1]!r}")
    try:
        flat = msgpack.unpackb(
            memoryview(raw)[1:],
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
    if not all(type(k) is bytes for k in keys) or not all(
        v is None or type(v) is bytes for v in values
    ):
        raise CorruptChunk(f"chunk {what} has a key or value that is not bytes")
    return list(zip(keys, values, strict=True))
