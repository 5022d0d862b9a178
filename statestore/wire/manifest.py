"""Manifests and chains on the wire and on disk: msgpack maps with a schema field, validated
on decode (a manifest that does not decode is MalformedData, never a crash).

The encoding is part of the on-disk format (nodes store the encoded manifest): it must stay
byte for byte what schema 1 wrote. A blocked chunk (core/chunk.py, 0.3.0) is named by nine
fields, the last two its index's length and checksum; a whole chunk by seven, as before.
``base_epoch`` (core/manifest.py, "Lineage") came later, as
an optional last key written only when set: a manifest without one encodes exactly as before,
and readers that predate it (older nodes and clients) ignore it; the Java ``ManifestCodec``
writes and reads it byte for byte as here (tests/ring/test_java_codec.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import msgpack
import msgspec

from statestore.core.errors import InvalidRequest, InvalidStoreId, MalformedData
from statestore.core.ids import MAX_EPOCH, StoreId, check_version, chunk_key, parse_chunk_key
from statestore.core.manifest import MAX_POSITIONS_BYTES, ChunkRef, Manifest

__all__ = [
    "SCHEMA",
    "decode_chain",
    "decode_copies",
    "decode_manifest",
    "encode_chain",
    "encode_copies",
    "encode_manifest",
    "manifest_epoch",
]

SCHEMA = 1


def _to_obj(m: Manifest) -> dict[str, Any]:
    obj = {
        "schema": SCHEMA,
        "store": m.store.path,
        "version": m.version,
        "kind": m.kind,
        "epoch": m.epoch,
        "key_groups": m.key_groups,
        "chunks": [_chunk_fields(c) for c in m.chunks],
        "positions": dict(m.positions),
    }
    if m.base_epoch is not None:
        obj["base_epoch"] = m.base_epoch
    return obj


def _chunk_fields(c: ChunkRef) -> list[Any]:
    fields: list[Any] = [c.name, c.lo, c.hi, c.size, c.raw_size, c.rows, c.checksum]
    if c.blocked:
        fields += [c.index_len, c.index_checksum]
    return fields


def _from_obj(obj: Any) -> Manifest:
    try:
        if not isinstance(obj, dict):
            raise MalformedData("manifest is not a map")
        if obj.get("schema") != SCHEMA:
            raise MalformedData(
                f"manifest schema {obj.get('schema')!r} is not supported (this node speaks "
                f"{SCHEMA}): upgrade the older side"
            )
        kind = obj["kind"]
        if kind not in ("delta", "snapshot"):
            raise MalformedData(f"manifest kind {kind!r} is not delta or snapshot")
        epoch = obj["epoch"]
        groups = obj["key_groups"]
        if type(epoch) is not int or not 0 <= epoch <= MAX_EPOCH:
            raise MalformedData(f"manifest epoch {epoch!r:.40} is not in 0..{MAX_EPOCH}")
        if type(groups) is not int or not 1 <= groups <= 65536:
            raise MalformedData(f"manifest key_groups {groups!r} is not in 1..65536")
        base_epoch = obj.get("base_epoch")
        if base_epoch is not None and (
            type(base_epoch) is not int or not 0 <= base_epoch <= MAX_EPOCH
        ):
            raise MalformedData(f"manifest base_epoch {base_epoch!r:.40} is not in 0..{MAX_EPOCH}")
        positions = obj.get("positions", {})
        if not isinstance(positions, dict):
            raise MalformedData("manifest positions must be a map")
        _check_positions(positions)
        if not isinstance(obj["store"], str):
            raise MalformedData(f"manifest store {obj['store']!r:.40} is not a store path")
        store = StoreId.parse(obj["store"])
        version = check_version(obj["version"])
        chunks = []
        for c in obj["chunks"]:
            if not isinstance(c, list) or len(c) not in (7, 9):
                raise MalformedData(f"manifest chunk {c!r:.200} is malformed")
            name, lo, hi, size, raw_size, rows, digest = c[:7]
            index_len, index_sum = c[7:] or (0, 0)
            ints = (lo, hi, size, raw_size, rows, digest, index_len, index_sum)
            if not (
                isinstance(name, str)
                and all(type(i) is int and 0 <= i < 2**64 for i in ints)
                and lo <= hi < groups
                and (len(c) == 7 or 0 < index_len <= size - 5)
            ):
                raise MalformedData(f"manifest chunk {c!r:.200} is malformed")
            try:  # a name a chunk can have: put_manifest and readers turn it into a key
                parse_chunk_key(chunk_key(store, version, name))
            except InvalidStoreId as exc:
                raise MalformedData(f"manifest chunk name {name!r:.80} is malformed") from exc
            chunks.append(
                ChunkRef(name, lo, hi, size, raw_size, rows, digest, index_len, index_sum)
            )
        return Manifest(
            store,
            version,
            kind,
            epoch,
            groups,
            tuple(chunks),
            positions,
            base_epoch,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise MalformedData(f"manifest is malformed ({exc!r})") from exc


def _check_positions(positions: dict[Any, Any]) -> None:
    """Positions are what the commit took (core/commit): a JSON object within the size limit
    (a restore answers them in a header; statestore-fuzz found bytes and NaN accepted here,
    and a 500 on the restore that followed)."""
    try:
        text = json.dumps(positions, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise MalformedData(f"manifest positions are not a JSON object ({exc})") from exc
    if len(text) > MAX_POSITIONS_BYTES:
        raise MalformedData(
            f"manifest positions are {len(text)} bytes; the limit is {MAX_POSITIONS_BYTES}"
        )


def encode_manifest(m: Manifest) -> bytes:
    data: bytes = msgpack.packb(_to_obj(m), use_bin_type=True)
    return data


def decode_manifest(data: bytes) -> Manifest:
    try:
        obj = msgpack.unpackb(data, raw=False)
    except Exception as exc:
        raise MalformedData(f"manifest is not valid msgpack ({exc})") from exc
    return _from_obj(obj)


def encode_chain(chain: Sequence[Manifest]) -> bytes:
    data: bytes = msgpack.packb([_to_obj(m) for m in chain], use_bin_type=True)
    return data


def join_chain(encoded: Sequence[bytes]) -> bytes:
    """:func:`encode_chain` of manifests already encoded (:func:`encode_manifest`): the same
    bytes (a msgpack array is its header and its items), each manifest encoded once however
    many chains name it."""
    header: bytes = msgpack.Packer().pack_array_header(len(encoded))
    return header + b"".join(encoded)


def decode_chain(data: bytes) -> list[Manifest]:
    try:
        objs = msgpack.unpackb(data, raw=False)
    except Exception as exc:
        raise MalformedData(f"chain is not valid msgpack ({exc})") from exc
    if not isinstance(objs, list):
        raise MalformedData("chain is not a list of manifests")
    return [_from_obj(o) for o in objs]


def encode_copies(raws: Sequence[bytes | None]) -> bytes:
    """Manifests as stored (node/replica.py), many in one body: a msgpack array of their
    encoded bytes, nil for one that is absent (``/v1/sync/manifests``, docs/api.md)."""
    data: bytes = msgpack.packb(list(raws), use_bin_type=True)
    return data


def decode_copies(data: bytes, limit: int) -> list[bytes | None]:
    """The encoded manifests of :func:`encode_copies`, each still to be decoded
    (:func:`decode_manifest` validates it). MalformedData when the body is not such an
    array, InvalidRequest when it holds more than ``limit`` (told by its header, before
    anything is built)."""
    try:
        u = msgpack.Unpacker(max_buffer_size=len(data) + 1)
        u.feed(data)
        n = u.read_array_header()
    except Exception as exc:
        raise MalformedData(f"manifest copies: not a msgpack array ({exc})") from exc
    if n > limit:
        raise InvalidRequest(
            f"manifest copies: {n} in one request, over the limit of {limit}; split them"
        )
    try:
        return msgspec.msgpack.decode(data, type=list[bytes | None])
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        raise MalformedData(f"manifest copies: not a msgpack array of manifests ({exc})") from exc


def manifest_epoch(data: bytes) -> int:
    """The epoch of an encoded manifest, read without decoding its chunks (the key comes
    before them): repair names every manifest a node holds by its epoch on each pass."""
    try:
        u = msgpack.Unpacker(raw=False)
        u.feed(data)
        for _ in range(u.read_map_header()):
            if u.unpack() == "epoch":
                epoch = u.unpack()
                if type(epoch) is int and 0 <= epoch <= MAX_EPOCH:
                    return epoch
                break
            u.skip()
    except Exception as exc:
        raise MalformedData(f"manifest is not valid msgpack ({exc})") from exc
    return decode_manifest(data).epoch  # no usable epoch key: the full check says why
