"""The framed row format of the coordinator endpoints (pure), for clients without our codec.

A body is a sequence of records, big-endian (what Java's DataInputStream reads natively)::

    u32 key length | i32 value length (-1 = delete) | key bytes | value bytes

Used by ``POST /v1/stores/.../commit`` and ``GET /v1/stores/.../state`` (docs/api.md), which
the Spark provider speaks so that it needs nothing beyond the JDK.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

from statestore.core.errors import MalformedData

__all__ = ["HEADER", "decode_rows", "encode_puts", "encode_rows"]

HEADER = struct.Struct(">Ii")


def encode_rows(rows: Iterable[tuple[bytes, bytes | None]]) -> Iterator[bytes]:
    """Frame rows; yields pieces to join or stream."""
    pack = HEADER.pack
    for k, v in rows:
        if v is None:
            yield pack(len(k), -1) + k
        else:
            yield pack(len(k), len(v)) + k + v


def encode_puts(keys: list[bytes], values: list[bytes]) -> bytes:
    """Frame many puts at once (no deletes), with the per-row work done in C: what a
    restore streams back, row for row the same bytes as :func:`encode_rows`."""
    heads = map(HEADER.pack, map(len, keys), map(len, values))
    parts: list[bytes] = [b""] * (3 * len(keys))
    parts[0::3] = heads
    parts[1::3] = keys
    parts[2::3] = values
    return b"".join(parts)


def decode_rows(data: bytes) -> tuple[dict[bytes, bytes], list[bytes]]:
    """Parse a framed body into puts and deletes (a later record of a key wins);
    MalformedData names the bad offset. One tight loop: it runs for every coordinated commit."""
    data = bytes(data)
    puts: dict[bytes, bytes] = {}
    deletes: list[bytes] = []
    pos, end = 0, len(data)
    unpack = HEADER.unpack_from
    while pos < end:
        if end - pos < 8:
            raise MalformedData(f"row framing: truncated header at byte {pos}")
        klen, vlen = unpack(data, pos)
        start = pos + 8
        pos = start + klen
        if vlen >= 0:
            stop = pos + vlen
            if stop > end:
                raise MalformedData(f"row framing: record at byte {start - 8} is truncated")
            puts[data[start:pos]] = data[pos:stop]
            pos = stop
        elif vlen == -1 and pos <= end:
            key = data[start:pos]
            deletes.append(key)
            puts.pop(key, None)
        else:
            raise MalformedData(f"row framing: record at byte {start - 8} is truncated")
    if deletes:
        deletes = [k for k in deletes if k not in puts]
    return puts, deletes
