"""A store's head in its two forms, written in one place.

- On disk (a node's ``h:<store>`` key): msgpack ``[epoch, version]``, ordered so that the
  highest head compares highest. This is the stored format; it does not change.
- On the wire (``GET .../head``, ``POST /v1/heads``): a JSON object ``{"version", "epoch"}``.
"""

from __future__ import annotations

from typing import Any

import msgpack

from statestore.core.errors import MalformedData
from statestore.core.ids import MAX_EPOCH, MAX_VERSION
from statestore.core.manifest import Head

__all__ = ["MAX_EPOCH", "decode_stored", "encode_stored", "from_json", "to_json"]


def encode_stored(head: Head) -> bytes:
    data: bytes = msgpack.packb([head.epoch, head.version])
    return data


def decode_stored(raw: bytes) -> Head:
    try:
        epoch, version = msgpack.unpackb(raw)
    except Exception as exc:
        raise MalformedData(f"stored head does not decode ({exc!r})") from exc
    return _checked(version, epoch)


def to_json(head: Head) -> dict[str, int]:
    return {"version": head.version, "epoch": head.epoch}


def from_json(obj: Any) -> Head:
    """A head from its JSON object; MalformedData for anything else."""
    if not isinstance(obj, dict):
        raise MalformedData(f"a head is an object with version and epoch, not {obj!r:.80}")
    return _checked(obj.get("version"), obj.get("epoch"))


def _checked(version: Any, epoch: Any) -> Head:
    ok = (
        type(version) is int
        and type(epoch) is int
        and 1 <= version <= MAX_VERSION
        and 0 <= epoch <= MAX_EPOCH
    )
    if not ok:
        raise MalformedData(f"head version {version!r} / epoch {epoch!r} is out of range")
    return Head(version, epoch)
