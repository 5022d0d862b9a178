"""The framed row format of the coordinator endpoints (pure), for clients without our codec.

A body is a sequence of records, big-endian (what Java's DataInputStream reads natively)::

    u32 key length | i32 value length (-1 = delete) | key bytes | value bytes

Used by ``POST /v1/stores/.../commit`` and ``GET /v1/stores/.../state`` (docs/api.md), which
the Spark provider speaks so that it needs nothing beyond the JDK.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

from .errors import MalformedData

__all__ = ["HEADER", "decode_rows", "encode_rows"]

HEADER = struct.Struct(">Ii")


def encode_rows(rows: Iterable[tuple[bytes, bytes | None]]) -> Iterator[bytes]:
    """Frame rows; yields pieces to join or stream."""
    pack = HEADER.pack
    for k, v in rows:
        if v is None:
            yield pack(len(k), -1) + k
        else:
            yield pack(len(k), len(v)) + k + v


def decode_rows(data: bytes) -> tuple[dict[bytes, bytes], list[bytes]]:
    """Parse a framed body into puts and deletes; MalformedData names the bad offset."""
    puts: dict[bytes, bytes] = {}
    deletes: list[bytes] = []
    mv = memoryview(data)
    pos, end = 0, len(data)
    unpack = HEADER.unpack_from
    while pos < end:
        if end - pos < HEADER.size:
            raise MalformedData(f"row framing: truncated header at byte {pos}")
        klen, vlen = unpack(mv, pos)
        pos += HEADER.size
        need = klen + max(vlen, 0)
        if vlen < -1 or end - pos < need:
            raise MalformedData(f"row framing: record at byte {pos - HEADER.size} is truncated")
        key = bytes(mv[pos : pos + klen])
        pos += klen
        if vlen < 0:
            deletes.append(key)
            puts.pop(key, None)
        else:
            puts[key] = bytes(mv[pos : pos + vlen])
            pos += vlen
    deletes = [k for k in deletes if k not in puts]
    return puts, deletes
