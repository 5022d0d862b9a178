"""Reading a request's body within the node's limits (one place for every handler), the
slowest a body or an answer that holds memory may move (:data:`MIN_RATE`,
:class:`PacedAnswer`), work that stops when its requester leaves
(:func:`while_requester_stays`), and the node-signature shell around it: who a signed
request was addressed to, its body checked against its signed digest, and the proof a node
signs onto its answer (core/identity)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiohttp import web

from statestore.core.errors import SlowRequest
from statestore.core.ids import StoreId, parse_uint
from statestore.core.membership import is_self_alias
from statestore.node.auth import Principal
from statestore.node.daemon import NODE, Node

__all__ = [
    "MIN_RATE",
    "PacedAnswer",
    "addressed_to",
    "prove_answer",
    "read_body",
    "read_signed_body",
    "store_of",
    "while_requester_stays",
]

T = TypeVar("T")

# the slowest a transfer that holds memory may move, besides the node's body timeout: a
# commit's body (node/api.py) and an answer built in memory (a restore's state, a tree hop's
# fold, :class:`PacedAnswer`). 1 Mbit/s: far below any link a state store's writer or reader
# uses (a 64 MiB one gets 512 s more), and a peer that trickles or stops reading gives its
# share of the memory budget back within minutes
MIN_RATE = 128 << 10
# how often work that waits on other nodes checks that its requester is still connected
REQUESTER_CHECK = 1.0


class PacedAnswer:
    """Writes of a streamed answer that the reader must take within the body timeout plus
    what was written at :data:`MIN_RATE`. Past that the connection is aborted and
    :meth:`write` says so (False): the handler stops writing and returns its response, and
    what the request held (its lease, its state) is given back. Never an exception after the
    headers went out: an error answer written into a started stream would garble it."""

    def __init__(self, request: web.Request, resp: web.StreamResponse, grace: float) -> None:
        self._request = request
        self._resp = resp
        self._deadline = asyncio.get_running_loop().time() + grace
        self.cut = False

    async def write(self, data: bytes) -> bool:
        if self.cut:
            return False
        self._deadline += len(data) / MIN_RATE
        try:
            async with asyncio.timeout_at(self._deadline):
                await self._resp.write(data)
            return True
        except TimeoutError:
            self.abort()
            return False

    async def end(self) -> None:
        """The answer's end (its last chunk), unless it was cut."""
        if not self.cut:
            try:
                async with asyncio.timeout_at(self._deadline):
                    await self._resp.write_eof()
            except TimeoutError:
                self.abort()

    def abort(self) -> None:
        self.cut = True
        transport = self._request.transport
        if transport is not None:
            transport.abort()


async def while_requester_stays(request: web.Request, work: Awaitable[T]) -> T | None:
    """``work``'s result, or None once the connection of the request it serves has closed:
    ``work`` is then cancelled. aiohttp does not cancel a handler whose client left, so a
    relay hop waiting on a child that answered its headers and then stalled (a paused or
    wedged node) waited for ever, holding its share of the memory budget and its children's
    connections; with this, a hop lives no longer than its parent does, and the restorer at
    the top gives up on a quiet stream (net/restorer.py). A request with no transport (the
    in-process network of the simulator and the tests, net/inproc.py) is not watched."""
    if request.transport is None:
        return await work
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=REQUESTER_CHECK)
            if done:
                return task.result()
            transport = request.transport
            if transport is None or transport.is_closing():
                return None
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait({task})  # its end, not its exception; our own cancel stands
            if not task.cancelled():
                task.exception()  # retrieved: it ended on its own way, unasked


def store_of(request: web.Request) -> StoreId:
    """The store a route's path names (``{query}/{operator}/{partition}/{name}``), checked.
    Clients name the same few stores request after request: each is checked once, and
    4,096 are kept (a bad one raises, and is not kept)."""
    mi = request.match_info
    return _store_id(mi["query"], mi["operator"], mi["partition"], mi["name"])


@functools.lru_cache(maxsize=4096)
def _store_id(query: str, operator: str, partition: str, name: str) -> StoreId:
    return StoreId(
        query,
        parse_uint(operator, "store operator", 2**31 - 1),
        parse_uint(partition, "store partition", 2**31 - 1),
        name,
    )


async def read_body(request: web.Request) -> bytes:
    """The request body, within ``--max-body`` and the node's body timeout."""
    if request.content.is_eof():  # all of it arrived with the headers: no wait, no timer
        return await request.read()
    limit = request.app[NODE].config.body_timeout
    try:
        async with asyncio.timeout(limit):
            return await request.read()
    except TimeoutError as exc:
        raise SlowRequest(
            f"request body did not arrive within {limit:.0f}s: send it at once, or faster"
        ) from exc


def addressed_to(node: Node) -> Callable[[str], bool]:
    """Whether a signed request's destination (``HOST:PORT``) names ``node``: its advertised
    address, or its port on one of its host's names and addresses or a loopback name
    (core/membership.is_self_alias). Nothing names a node that has not started yet."""
    membership = node.membership
    if membership is None:
        return lambda _address: False
    return lambda address: is_self_alias(address, node.address, membership.own_hosts)


async def read_signed_body(request: web.Request, who: Principal) -> None:
    """For a request whose headers a node signed (``who``), read its body (cached for the
    handler) and raise Unauthenticated unless it is the body the signature declared."""
    if who.kind == "node":
        request.app[NODE].access.check_body(who, request, await read_body(request))


def prove_answer(
    request: web.Request, who: Principal, resp: web.StreamResponse
) -> web.StreamResponse:
    """``resp`` with this node's proof of it (core/identity.answer_headers), when a signed
    node asked for one; answers streamed or already sent cannot be, and carry none (the
    asker then refuses them)."""
    if isinstance(resp, web.Response) and not resp.prepared and isinstance(resp.body, bytes):
        access = request.app[NODE].access
        resp.headers.update(access.answer_proof(who, request, resp.status, resp.body))
    return resp
