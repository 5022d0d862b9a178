"""``POST /v1/sync/digest`` (node to node): range digests, typed and bounded both ways
(core/digest.py says what they mean).

Request: ``{"seed": S, "ranges": [[lo, hi, count, "xor"], ...]}``: at most
``MAX_DIGEST_RANGES`` inclusive token ranges, sorted and disjoint, each with the asker's
digest (the XOR as 32 hex digits). Answer: ``{"id": NODE, "differ": [[index, leaves], ...]}``,
``leaves`` a list of ``LEAVES`` ``[count, "xor"]`` pairs or null. The asker decodes the
answer as strictly as the peer decodes the request: a peer is a network party too.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from statestore.core.digest import LEAVES, MAX_DIGEST_RANGES, MAX_LEAF_RANGES, TOKEN_MAX, Digest
from statestore.core.errors import InvalidRequest, MalformedData
from statestore.wire.bodies import decode_json

__all__ = [
    "DigestAnswer",
    "DigestRequest",
    "decode_answer",
    "decode_request",
    "encode_answer",
    "encode_request",
]

Token = Annotated[int, Meta(ge=0)]  # and at most TOKEN_MAX (msgspec bounds stop at int64)
Count = Annotated[int, Meta(ge=0, le=2**40)]
Xor = Annotated[str, Meta(min_length=1, max_length=32, pattern=r"^[0-9a-f]+\Z")]
Pair = tuple[Count, Xor]
Leaves = Annotated[list[Pair], Meta(max_length=LEAVES)]


class DigestRequest(msgspec.Struct, frozen=True):
    seed: Token
    ranges: Annotated[list[tuple[Token, Token, Count, Xor]], Meta(max_length=MAX_DIGEST_RANGES)]


class DigestAnswer(msgspec.Struct, frozen=True):
    id: Annotated[str, Meta(max_length=64)]
    differ: Annotated[
        list[tuple[Annotated[int, Meta(ge=0)], Leaves | None]],
        Meta(max_length=MAX_DIGEST_RANGES),
    ]


def _pair(d: Digest) -> list[Any]:
    return [d.count, format(d.xor, "x")]


def _digest(p: Pair) -> Digest:
    return Digest(p[0], int(p[1], 16))


def encode_request(seed: int, ranges: list[tuple[int, int, Digest]]) -> dict[str, Any]:
    return {"seed": seed, "ranges": [[lo, hi, *_pair(d)] for lo, hi, d in ranges]}


def decode_request(data: bytes) -> tuple[int, list[tuple[int, int, Digest]]]:
    """The seed and the asked ranges; InvalidRequest when they are not sorted and disjoint."""
    body = decode_json(data, DigestRequest, "range digests")
    if body.seed > TOKEN_MAX or any(hi > TOKEN_MAX for _, hi, _, _ in body.ranges):
        raise MalformedData("range digests: a seed or token is over 2^64-1")
    ranges = [(lo, hi, _digest((n, x))) for lo, hi, n, x in body.ranges]
    prev = -1
    for lo, hi, _ in ranges:
        if lo > hi or lo <= prev:
            raise InvalidRequest(
                "range digests: ranges must be [lo, hi] with lo <= hi, sorted and disjoint"
            )
        prev = hi
    return body.seed, ranges


def encode_answer(node_id: str, differ: list[tuple[int, list[Digest] | None]]) -> dict[str, Any]:
    return {
        "id": node_id,
        "differ": [[i, None if ls is None else [_pair(d) for d in ls]] for i, ls in differ],
    }


def decode_answer(data: bytes, asked: int) -> dict[int, list[Digest] | None]:
    """A peer's answer to ``asked`` ranges, by range index; MalformedData when it names a
    range not asked, or gives leaves for more ranges than a peer may."""
    body = decode_json(data, DigestAnswer, "range digest answer")
    out: dict[int, list[Digest] | None] = {}
    for i, ls in body.differ:
        if i >= asked:
            raise MalformedData(f"range digest answer names range {i} of {asked}")
        out[i] = None if ls is None else [_digest(p) for p in ls]
    if sum(ls is not None for ls in out.values()) > MAX_LEAF_RANGES:
        raise MalformedData("range digest answer: leaves for more ranges than a peer gives")
    return out
