"""Hints and outcomes of tentative commits (core/tentative.py) in their stored and wire forms.

- A hint on disk (a node's ``n:`` key): msgpack ``[manifest bytes, [holder, ...]]``.
- Holders on the wire: ``?holders=HOST:PORT,...`` on ``PUT /v1/hints/...`` (at most 16).
- An outcome on the wire and on disk (``x:`` key): the JSON object
  ``{"store", "version", "epoch", "outcome", "replay_from", "positions"}``; a batch is
  ``{"outcomes": [...]}`` (at most 1,000), typed and bounded here like every other body.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgpack
import msgspec
from msgspec import Meta

from statestore.core.address import parse_address
from statestore.core.errors import InvalidRequest, MalformedData
from statestore.core.ids import MAX_EPOCH, MAX_VERSION, StoreId
from statestore.core.manifest import Manifest
from statestore.core.tentative import Outcome
from statestore.wire.bodies import decode_json, decode_positions
from statestore.wire.manifest import decode_manifest, encode_manifest

__all__ = [
    "MAX_HOLDERS",
    "MAX_OUTCOMES",
    "decode_hint",
    "decode_outcomes",
    "encode_hint",
    "encode_outcomes",
    "outcome_json",
    "parse_holders",
]

MAX_HOLDERS = 16
MAX_OUTCOMES = 1000


def encode_hint(m: Manifest, holders: list[str]) -> bytes:
    data: bytes = msgpack.packb([encode_manifest(m), list(holders)], use_bin_type=True)
    return data


def decode_hint(raw: bytes) -> tuple[Manifest, list[str]]:
    try:
        manifest, holders = msgpack.unpackb(raw, raw=False)
    except Exception as exc:
        raise MalformedData(f"stored hint does not decode ({exc!r})") from exc
    if not isinstance(manifest, bytes) or not isinstance(holders, list):
        raise MalformedData("stored hint is not [manifest, holders]")
    return decode_manifest(manifest), [str(h) for h in holders]


def parse_holders(text: str | None) -> list[str]:
    """``HOST:PORT,...``: the nodes a writer stored a hint on, in its preference order."""
    if not text:
        raise InvalidRequest("holders: name the nodes the hint went to (HOST:PORT,...)")
    holders = text.split(",")
    if len(holders) > MAX_HOLDERS:
        raise InvalidRequest(f"holders: at most {MAX_HOLDERS} nodes, got {len(holders)}")
    for h in holders:
        parse_address(h, what="holder")
    return holders


class _OutcomeBody(msgspec.Struct, frozen=True):
    store: Annotated[str, Meta(min_length=1, max_length=1000)]
    version: Annotated[int, Meta(ge=1, le=MAX_VERSION)]
    epoch: Annotated[int, Meta(ge=0, le=MAX_EPOCH)]
    outcome: Literal["confirmed", "rolled_back"]
    replay_from: Annotated[int, Meta(ge=0, le=MAX_VERSION)] = 0
    positions: dict[str, Any] = {}


class _OutcomesBody(msgspec.Struct, frozen=True):
    outcomes: Annotated[list[_OutcomeBody], Meta(max_length=MAX_OUTCOMES)]


def outcome_json(o: Outcome) -> dict[str, Any]:
    return {
        "store": o.store,
        "version": o.version,
        "epoch": o.epoch,
        "outcome": o.outcome,
        "replay_from": o.replay_from,
        "positions": o.positions,
    }


def encode_outcomes(outcomes: list[Outcome]) -> bytes:
    return msgspec.json.encode({"outcomes": [outcome_json(o) for o in outcomes]})


def decode_outcomes(data: bytes, store: StoreId | None = None) -> list[Outcome]:
    """A batch of outcomes; MalformedData for a bad body, or one naming another store than
    ``store`` (when given)."""
    body = decode_json(data, _OutcomesBody, "outcomes", '{"outcomes": [...]}')
    out = []
    for b in body.outcomes:
        StoreId.parse(b.store)
        if store is not None and b.store != store.path:
            raise MalformedData(f"outcomes: an outcome of {b.store} sent for {store}")
        if b.outcome == "confirmed" and (b.replay_from or b.positions):
            raise MalformedData("outcomes: a confirmed commit has no replay point")
        if b.replay_from >= b.version:
            raise MalformedData(
                f"outcomes: replay_from {b.replay_from} is not below version {b.version}"
            )
        positions = decode_positions(msgspec.json.encode(b.positions), "outcome positions")
        out.append(Outcome(b.store, b.version, b.epoch, b.outcome, b.replay_from, positions))
    return out
