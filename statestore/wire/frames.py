"""Frames of a streamed recovery plan (pure): what hops send each other and the restorer.

::

    frame := kind (1 byte) | u32 meta length | u32 data length | meta (msgpack map) | data

- ``C`` a chunk as stored (still compressed): meta ``{"k": key, "p": chain position}``
- ``F`` folded rows: data = zstd(msgpack [key, pos, value, ...]), value nil = delete; meta
  ``{"hop", "g": [lo, hi]}``: the key groups this frame completes (frames are cut at group
  boundaries, in group order)
- ``D`` hop stats ``{"hop", "depth", "own", "in", "out"}``; a tree hop sends one with
  ``"covers": [chunk keys folded in]`` *before* its F frames, so a restorer whose stream is
  cut knows which chunks the key groups it did receive already include
- ``E`` a hop failed: meta ``{"hop", "error"}``; the restorer fetches what is missing

Hop plans travel as msgpack too (:func:`encode_hop` / :func:`decode_hop`).
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import zstandard

from statestore.core.errors import (
    DecompressionBomb,
    InvalidRequest,
    MalformedData,
    PayloadTooLarge,
)
from statestore.core.ids import StoreId, check_chunk_name, check_version, chunk_key
from statestore.core.plan import ChunkTask, Hop

__all__ = [
    "HEADER",
    "MAX_HOP_CHUNKS",
    "MAX_PLAN_BYTES",
    "MAX_PLAN_CHUNKS",
    "decode_folded",
    "decode_hop",
    "decode_meta",
    "encode_folded",
    "encode_frame",
    "encode_hop",
    "hop_store",
]

HEADER = struct.Struct(">cII")
MAX_META = 16 * 1024 * 1024
KINDS = (b"C", b"F", b"D", b"E")
# A relay plan decodes to ~70x its size in Python objects (docs/security.md, Hardened endpoints):
# its body, each hop's chunk list and the chunk tasks of the whole plan are bounded before any is
# built. A real plan names each chunk once, about 50 bytes a task: 1 MiB holds ~20,000 tasks (80 GiB
# of 4 MiB chunks); past these a restorer's relay fails and it fetches the chunks star-wise.
MAX_PLAN_BYTES = 1 << 20
MAX_HOP_CHUNKS = 16384
MAX_PLAN_CHUNKS = 32768


def encode_frame(kind: bytes, meta: dict[str, Any], data: bytes = b"") -> bytes:
    m: bytes = msgpack.packb(meta, use_bin_type=True)
    return HEADER.pack(kind, len(m), len(data)) + m + data


def decode_meta(raw: bytes) -> dict[str, Any]:
    try:
        obj = msgpack.unpackb(raw, raw=False)
    except Exception as exc:
        raise MalformedData(f"frame meta does not decode ({exc})") from exc
    if not isinstance(obj, dict):
        raise MalformedData("frame meta is not a map")
    return obj


def encode_folded(rows: list[tuple[bytes, int, bytes | None]]) -> bytes:
    flat: list[Any] = []
    for k, pos, v in rows:
        flat += (k, pos, v)
    data: bytes = zstandard.ZstdCompressor(level=1).compress(msgpack.packb(flat, use_bin_type=True))
    return data


def decode_folded(data: bytes, max_raw: int) -> list[tuple[bytes, int, bytes | None]]:
    """Folded rows as (key, chain position, value or None). Raises DecompressionBomb past
    ``max_raw`` and MalformedData for anything but a zstd frame of such triples."""
    try:
        size = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:  # not a zstd frame at all (statestore-fuzz)
        raise MalformedData(f"folded frame is not a zstd frame ({exc})") from exc
    if size < 0 or size > max_raw:
        raise DecompressionBomb(f"folded frame declares {size} bytes; the limit is {max_raw}")
    try:
        flat = msgpack.unpackb(zstandard.ZstdDecompressor().decompress(data), raw=True)
    except Exception as exc:
        raise MalformedData(f"folded frame does not decode ({exc})") from exc
    if not isinstance(flat, list) or len(flat) % 3:
        raise MalformedData("folded frame is not a list of key, position, value triples")
    keys, positions, values = flat[0::3], flat[1::3], flat[2::3]
    # what a fold relies on (statestore-fuzz): bytes keys, integer positions, bytes or nil
    if not (
        all(type(k) is bytes for k in keys)
        and all(type(p) is int and 0 <= p < 2**32 for p in positions)
        and all(v is None or type(v) is bytes for v in values)
    ):
        raise MalformedData("folded frame has a key, position or value of the wrong type")
    return list(zip(keys, positions, values, strict=True))


def _hop_obj(hop: Hop) -> dict[str, Any]:
    return {
        "a": hop.address,
        "c": [
            [t.pos, t.version, t.name, t.checksum, t.size, t.raw_size, t.rows] for t in hop.chunks
        ],
        "k": [_hop_obj(c) for c in hop.children],
    }


def encode_hop(store: StoreId, hop: Hop, fold: bool, depth: int = 0, groups: int = 0) -> bytes:
    data: bytes = msgpack.packb(
        {
            "v": 1,
            "store": store.path,
            "fold": fold,
            "depth": depth,
            "groups": groups,
            "hop": _hop_obj(hop),
        },
        use_bin_type=True,
    )
    return data


def _hop_from(store: StoreId, obj: Any, budget: list[int], seen: set[str]) -> Hop:
    """One hop of a plan. ``budget`` counts down [hops, chunk tasks] for the whole plan;
    ``seen`` holds the chunk keys named so far: a chunk named again (in this hop or another)
    is dropped, so a plan cannot make a node read and send one chunk many times."""
    budget[0] -= 1
    if budget[0] < 0:
        raise MalformedData("relay plan has too many hops")
    try:
        tasks = obj["c"]
        if not isinstance(tasks, list) or len(tasks) > MAX_HOP_CHUNKS:
            raise PayloadTooLarge(
                f"relay plan hop lists {len(tasks) if isinstance(tasks, list) else '?'} "
                f"chunks: the limit is {MAX_HOP_CHUNKS} per hop; split the restore"
            )
        budget[1] -= len(tasks)
        if budget[1] < 0:
            raise PayloadTooLarge(
                f"relay plan lists more than {MAX_PLAN_CHUNKS} chunks in all: split the restore"
            )
        chunks = []
        for pos, version, name, digest, size, raw_size, rows in tasks:
            fields = (pos, version, digest, size, raw_size, rows)
            # within 0..2**64 as a manifest's are: a negative raw size or row count would be
            # a negative claim on the node's memory budget (node/relay.py)
            if not all(type(i) is int and 0 <= i < 1 << 64 for i in fields):
                raise ValueError("chunk task fields must be integers in 0..2**64")
            if type(name) is not str:
                raise ValueError("chunk task names must be strings")
            key = chunk_key(store, check_version(version), check_chunk_name(name))
            if key in seen:
                continue
            seen.add(key)
            chunks.append(
                ChunkTask(
                    key,
                    int(pos),
                    int(version),
                    str(name),
                    int(digest),
                    int(size),
                    int(raw_size),
                    int(rows),
                    (),
                )
            )
        return Hop(
            str(obj["a"]),
            tuple(chunks),
            tuple(_hop_from(store, k, budget, seen) for k in obj["k"]),
        )
    except PayloadTooLarge:
        raise
    except (KeyError, TypeError, ValueError, OverflowError, InvalidRequest) as exc:
        raise MalformedData(f"relay plan hop is malformed ({exc!r:.200})") from exc


def hop_store(data: bytes) -> StoreId:
    """The store a hop plan is for, read without building the plan: the top-level map's
    other values are skipped, not decoded, so a node can authorize the plan's query before
    it spends memory on it. Raises MalformedData, PayloadTooLarge or InvalidStoreId."""
    if len(data) > MAX_PLAN_BYTES:
        raise PayloadTooLarge(
            f"relay plan is {len(data)} bytes: the limit is {MAX_PLAN_BYTES}; split the restore"
        )
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=MAX_PLAN_BYTES)
    unpacker.feed(data)
    try:
        n = unpacker.read_map_header()
        for _ in range(n):
            key = unpacker.unpack()
            if key == "store":
                value = unpacker.unpack()
                if not isinstance(value, str):
                    break
                return StoreId.parse(value)
            unpacker.skip()
    except InvalidRequest:
        raise
    except Exception as exc:
        raise MalformedData(f"relay plan does not decode ({exc!r:.200})") from exc
    raise MalformedData("relay plan names no store: a plan is a map with a store path")


def decode_hop(data: bytes) -> tuple[StoreId, Hop, bool, int, int]:
    """Parse a hop plan: (store, hop, fold, depth, key groups). Raises MalformedData or
    InvalidStoreId."""
    if len(data) > MAX_PLAN_BYTES:
        raise PayloadTooLarge(
            f"relay plan is {len(data)} bytes: the limit is {MAX_PLAN_BYTES}; split the restore"
        )
    obj = decode_meta(data)
    if obj.get("v") != 1:
        raise MalformedData(f"relay plan version {obj.get('v')!r} is not supported")
    store = StoreId.parse(str(obj.get("store")))
    depth, groups = obj.get("depth", 0), obj.get("groups", 0)
    if type(depth) is not int or type(groups) is not int:
        raise MalformedData("relay plan depth and groups must be integers")
    if not (0 <= depth <= 1024 and 0 <= groups <= 65536):
        raise MalformedData(f"relay plan depth {depth} or groups {groups} is out of range")
    hop = _hop_from(store, obj.get("hop"), [4096, MAX_PLAN_CHUNKS], set())
    return store, hop, bool(obj.get("fold")), depth, groups
