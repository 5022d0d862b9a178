"""Reading a request's body within the node's limits (one place for every handler), sending
an answer that holds memory at a pace (:class:`PacedAnswer`), and the node-signature shell
around it: who a signed request was addressed to, its body checked against its signed
digest, and the proof a node signs onto its answer (core/identity)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from aiohttp import web

from statestore.core.errors import SlowRequest
from statestore.core.ids import StoreId, parse_uint
from statestore.core.membership import is_self_alias
from statestore.node.auth import Principal
from statestore.node.daemon import NODE, Node

__all__ = [
    "ANSWER_MIN_RATE",
    "PacedAnswer",
    "addressed_to",
    "prove_answer",
    "read_body",
    "read_signed_body",
    "store_of",
]

# the slowest an answer that holds memory (a restore's state, a tree hop's fold) may be read,
# besides the node's body timeout: as for commit bodies (node/api.py, COMMIT_MIN_RATE), a
# reader that stops reading must not hold its share of the memory budget for ever
ANSWER_MIN_RATE = 128 << 10


class PacedAnswer:
    """Writes of a streamed answer that the reader must take within the body timeout plus
    what was written at :data:`ANSWER_MIN_RATE`. Past that the connection is aborted and
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
        self._deadline += len(data) / ANSWER_MIN_RATE
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
