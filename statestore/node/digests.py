"""Range digests on the wire (core/digest.py says what they are): the peer's side,
``POST /v1/sync/digest`` (node to node only, as ``/v1/sync/have``), and the asker's,
:func:`narrow`, which repair passes and leave rounds call before listing items.

A peer that does not answer (down, or a node that predates the route) costs nothing but
the digests: its items are listed as before. Answering costs a scan of what this node holds
(its item names and the manifests' epochs) whatever the request's size: the route is for
nodes only (signed with the cluster secret, or an admin token without one), as sync/have.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence

from aiohttp import web

from statestore.core.digest import MAX_DIGEST_RANGES, Digest, answer, fold, group, segments
from statestore.core.digest import narrow as by_leaves
from statestore.core.errors import InvalidRequest, StateStoreError
from statestore.core.identity import NODE_HEADER
from statestore.core.items import ChunkItem, is_manifest
from statestore.core.view import RingView
from statestore.node.auth import allow
from statestore.node.daemon import NODE, Node
from statestore.node.request import read_body
from statestore.wire.digest import decode_answer, decode_request, encode_answer, encode_request

__all__ = ["held_items", "narrow", "register"]

log = logging.getLogger(__name__)
JSON = {"Content-Type": "application/json"}


def held_items(node: Node) -> list[str]:
    """Every item this node holds, named as repair names them, a manifest's name with its
    content digest (core/repair.content_digest): two owners holding one version and epoch
    with different content differ in that range, so its items get listed and compared."""
    out = [ChunkItem(k).name() for k in node.store.chunk_keys()]
    out += [_named(item, d) for item, d in node.store.manifest_digests().items()]
    return out


def _named(item: str, digest: int | None) -> str:
    """An item's name as digested: a manifest's with its content digest."""
    return item if digest is None or not is_manifest(item) else f"{item}#{digest:x}"


async def digest(request: web.Request) -> web.Response:
    node = request.app[NODE]
    allow(request, "admin")
    if request.headers.get(NODE_HEADER) == node.id:
        raise InvalidRequest(f"node {node.id} asked itself for range digests")
    raw = await read_body(request)
    # decoding, a scan of everything held, encoding: in a worker thread, so clients'
    # requests go on (an answer with every range's leaves is 1.4 MB of JSON: tens of ms)
    body = await asyncio.to_thread(_answer, node, raw)
    return web.Response(body=body, content_type="application/json")


def _answer(node: Node, raw: bytes) -> bytes:
    seed, asked = decode_request(raw)
    differ = answer(held_items(node), asked, seed)
    return json.dumps(encode_answer(node.id, differ)).encode()


def register(app: web.Application) -> None:
    app.router.add_post("/v1/sync/digest", digest)


def _request(seed: int, sent: list[tuple[int, int, Digest]]) -> bytes:
    return json.dumps(encode_request(seed, sent)).encode()


def _folded(
    items: Sequence[str], ranges: Sequence[tuple[int, int]], seed: int
) -> tuple[dict[int, list[str]], dict[int, Digest]]:
    grouped = group(items, ranges)
    return grouped, {j: fold(g, seed) for j, g in grouped.items()}


def _settle(
    held: dict[tuple[str, str], bool],
    target: str,
    grouped: Mapping[int, Sequence[str]],
    batch: Sequence[int],
    differ: Mapping[int, Sequence[Digest] | None],
    seed: int,
) -> list[str]:
    """Record in ``held`` the items of ``batch`` the answer shows ``target`` holds; returns
    those still to be listed."""
    same, rest = by_leaves({k: grouped[j] for k, j in enumerate(batch)}, differ, seed)
    held.update(((target, it), True) for it in same)
    return rest


async def narrow(
    node: Node, view: RingView, want: Mapping[str, Sequence[str]]
) -> tuple[dict[tuple[str, str], bool], dict[str, list[str]]]:
    """Before asking ``want`` (target -> items) item by item: the ``(target, item)`` pairs
    that range digests show the target holds, and what is left to ask each target. Off
    (everything left to ask) when the node's ``repair_digests`` is."""
    if not node.config.repair_digests or not len(view.ring):
        return {}, {t: list(items) for t, items in want.items()}
    ranges = segments(view.ring.tokens)
    held: dict[tuple[str, str], bool] = {}
    left: dict[str, list[str]] = {}
    digests = await asyncio.to_thread(node.store.manifest_digests)
    for target, plain in want.items():
        seed = node.rng.getrandbits(64)  # the node's generator: seeded in a simulation
        named = {_named(it, digests.get(it)): it for it in plain}
        items = list(named)
        # grouping and folding every item: in a worker thread, clients' requests go on
        grouped, folded = await asyncio.to_thread(_folded, items, ranges, seed)
        indices = sorted(grouped)
        ask: list[str] = []
        mine: dict[tuple[str, str], bool] = {}
        for i in range(0, len(indices), MAX_DIGEST_RANGES):
            batch = indices[i : i + MAX_DIGEST_RANGES]
            sent = [(*ranges[j], folded[j]) for j in batch]
            try:
                body = await asyncio.to_thread(_request, seed, sent)
                resp = await node.transport.request(
                    "POST", target, "/v1/sync/digest", body=body, headers=JSON
                )
                # decoding a peer's answer (every range's leaves: ~50 ms): off the loop too
                differ = await asyncio.to_thread(decode_answer, resp.body, len(sent))
            except StateStoreError as exc:
                log.debug("range digests from %s failed: %s", target, exc)
                ask.extend(it for j in batch for it in grouped[j])
                continue
            # hashing the differing ranges' items: off the loop too
            rest = await asyncio.to_thread(_settle, mine, target, grouped, batch, differ, seed)
            ask.extend(rest)
        left[target] = [named[it] for it in ask]
        held.update({(target, named[it]): v for (_, it), v in mine.items()})
        node.stats["digest_confirmed"] += len(items) - len(ask)
    return held, left
