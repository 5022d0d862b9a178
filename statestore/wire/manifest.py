"""Manifests and chains on the wire and on disk: msgpack maps with a schema field, validated
on decode (a manifest that does not decode is MalformedData, never a crash).

The encoding is part of the on-disk format (nodes store the encoded manifest): it must stay
byte for byte what schema 1 wrote.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from statestore.core.errors import MalformedData
from statestore.core.ids import MAX_EPOCH, StoreId, check_version
from statestore.core.manifest import ChunkRef, Manifest

__all__ = ["SCHEMA", "decode_chain", "decode_manifest", "encode_chain", "encode_manifest"]

SCHEMA = 1


def _to_obj(m: Manifest) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "store": m.store.path,
        "version": m.version,
        "kind": m.kind,
        "epoch": m.epoch,
        "key_groups": m.key_groups,
        "chunks": [[c.name, c.lo, c.hi, c.size, c.raw_size, c.rows, c.checksum] for c in m.chunks],
        "positions": dict(m.positions),
    }


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
        positions = obj.get("positions", {})
        if not isinstance(positions, dict):
            raise MalformedData("manifest positions must be a map")
        chunks = []
        for c in obj["chunks"]:
            name, lo, hi, size, raw_size, rows, digest = c
            ints = (lo, hi, size, raw_size, rows, digest)
            if not (
                isinstance(name, str)
                and all(type(i) is int and 0 <= i < 2**64 for i in ints)
                and lo <= hi < groups
            ):
                raise MalformedData(f"manifest chunk {c!r:.200} is malformed")
            chunks.append(ChunkRef(name, lo, hi, size, raw_size, rows, digest))
        return Manifest(
            StoreId.parse(obj["store"]),
            check_version(obj["version"]),
            kind,
            epoch,
            groups,
            tuple(chunks),
            positions,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise MalformedData(f"manifest is malformed ({exc!r})") from exc


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


def decode_chain(data: bytes) -> list[Manifest]:
    try:
        objs = msgpack.unpackb(data, raw=False)
    except Exception as exc:
        raise MalformedData(f"chain is not valid msgpack ({exc})") from exc
    if not isinstance(objs, list):
        raise MalformedData("chain is not a list of manifests")
    return [_from_obj(o) for o in objs]
