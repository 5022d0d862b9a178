"""Reading a stream of recovery frames (wire/frames.py) from any transport's stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Protocol

from statestore.core.errors import MalformedData, NodeUnavailable
from statestore.wire.frames import HEADER, KINDS, MAX_META, decode_meta

__all__ = ["ByteReader", "Frame", "read_frames"]

Frame = tuple[bytes, dict[str, Any], bytes, bytes]  # kind, meta, data, the frame's bytes


class ByteReader(Protocol):
    """What a transport's stream offers: ``readexactly`` as ``asyncio.StreamReader`` has it
    (IncompleteReadError at the end, NodeUnavailable when the connection breaks)."""

    async def readexactly(self, n: int) -> bytes: ...


async def read_frames(reader: ByteReader, max_data: int) -> AsyncIterator[Frame]:
    """Frames until the stream ends cleanly between two frames.

    Raises:
        MalformedData: a frame header or meta that is not ours.
        NodeUnavailable: the stream was cut mid-frame or the connection broke.
    """
    while True:
        try:
            try:
                head = await reader.readexactly(HEADER.size)
            except asyncio.IncompleteReadError as exc:
                if not exc.partial:
                    return
                raise
            kind, mlen, dlen = HEADER.unpack(head)
            if kind not in KINDS or mlen > MAX_META or dlen > max_data:
                raise MalformedData(
                    f"relay frame header is invalid (kind {kind!r}, {mlen}+{dlen} bytes)"
                )
            meta_raw = await reader.readexactly(mlen)
            data = await reader.readexactly(dlen) if dlen else b""
        except asyncio.IncompleteReadError as exc:
            raise NodeUnavailable(f"relay stream was cut mid-frame ({exc})") from exc
        yield kind, decode_meta(meta_raw), data, head + meta_raw + data
