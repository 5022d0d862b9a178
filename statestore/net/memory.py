"""An in-memory network of in-process nodes, with faults drawn from a seeded generator.

``MemoryNetwork`` holds each node's aiohttp application by address and carries requests to it
through :func:`net.inproc.exchange` (no sockets); :meth:`MemoryNetwork.transport` gives each
caller (node or client) its own ``Transport``, named by its address so that links are
directional. What can go wrong on a link, decided per request from ``random.Random``:

- **partition** (per directed link): a request over a blocked link is refused at once
  (NodeUnavailable); an answer over a blocked link is lost, so the caller times out although
  the node did the work.
- **drop**: the request or the answer is lost (the caller times out; a lost answer means the
  work was done unacknowledged).
- **delay**: up to ``max_delay`` seconds before the request arrives.
- **duplicate**: the request is delivered twice (the caller hears the first answer).
- **cut**: a streaming answer breaks after a random number of bytes.
- **crash**: :meth:`MemoryNetwork.detach` cancels every request the node is serving and
  refuses new ones.

Every fault is appended to ``log`` (simulated time, link, what happened), so a run's faults can
be compared between two runs of one seed. Only the caller's deadline ends a lost request, so a
simulation runs these on simulated time (testing/clock.py).
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from statestore.core.errors import NodeUnavailable, RequestTimeout
from statestore.net.inproc import Answer, exchange
from statestore.net.transport import MAX_ANSWER_BYTES, Response, error_from_answer
from statestore.wire.headers import EPOCH_HEADER

__all__ = ["LinkFaults", "MemoryNetwork", "MemoryTransport"]


@dataclass
class LinkFaults:
    """Probabilities (per request) of each fault on every link."""

    drop: float = 0.0
    duplicate: float = 0.0
    cut: float = 0.0
    delay: float = 0.0
    max_delay: float = 0.5


class MemoryNetwork:
    """The nodes by address, the blocked links and the fault rates; shared by all transports."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.faults = LinkFaults()
        self.log: list[str] = []
        self._apps: dict[str, tuple[web.Application, int]] = {}
        # in insertion order (a set of tasks would iterate in memory-address order)
        self._serving: dict[str, dict[asyncio.Task[None], None]] = {}
        self._blocked: set[tuple[str, str]] = set()

    def note(self, what: str) -> None:
        self.log.append(f"{asyncio.get_running_loop().time():9.3f} {what}")

    # -- nodes -----------------------------------------------------------------------
    def attach(self, address: str, app: web.Application, client_max_size: int) -> None:
        """Serve ``app`` at ``address`` (it is frozen here, as a server would)."""
        app.freeze()
        self._apps[address] = (app, client_max_size)
        self._serving.setdefault(address, {})

    async def detach(self, address: str) -> None:
        """The node at ``address`` is gone: cancel what it was serving, refuse new requests."""
        self._apps.pop(address, None)
        tasks = list(self._serving.pop(address, {}))
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- links -----------------------------------------------------------------------
    def block(self, src: str, dst: str) -> None:
        self._blocked.add((src, dst))

    def unblock(self, src: str, dst: str) -> None:
        self._blocked.discard((src, dst))

    def heal(self) -> None:
        self._blocked.clear()

    def blocked(self, src: str, dst: str) -> bool:
        return (src, dst) in self._blocked

    def transport(self, source: str, timeout: float = 10.0) -> MemoryTransport:
        return MemoryTransport(self, source, timeout)

    # -- one exchange ----------------------------------------------------------------
    async def send(
        self,
        src: str,
        dst: str,
        method: str,
        path: str,
        body: bytes,
        headers: dict[str, str],
        *,
        stream: bool,
    ) -> Answer:
        """Deliver one request and return its answer once the status and headers are in.
        Runs until the caller's deadline when the request or its answer is lost."""
        f, rng = self.faults, self.rng
        link = f"{src}->{dst} {method} {path.split('?')[0]}"
        self._check_reachable(src, dst)
        if f.delay and rng.random() < f.delay:
            wait = rng.uniform(0, f.max_delay)
            self.note(f"delay {wait:.3f}s {link}")
            await asyncio.sleep(wait)
        if f.drop and rng.random() < f.drop:
            self.note(f"drop request {link}")
            await _forever()
        cut = rng.randrange(0, 4096) if stream and f.cut and rng.random() < f.cut else None
        if cut is not None:
            self.note(f"cut after {cut} bytes {link}")
        self._check_reachable(src, dst)  # again: the node may have crashed meanwhile
        answer = Answer(dst, cut)
        self._serve(src, dst, method, path, body, headers, answer)
        if f.duplicate and rng.random() < f.duplicate:
            self.note(f"duplicate {link}")
            self._serve(src, dst, method, path, body, headers, Answer(dst))
        await answer.status
        if (dst, src) in self._blocked or (f.drop and rng.random() < f.drop):
            self.note(f"drop answer {link}")
            answer.close()
            await _forever()
        return answer

    def _check_reachable(self, src: str, dst: str) -> None:
        if (src, dst) in self._blocked or dst not in self._apps:
            raise NodeUnavailable(f"node {dst} is unreachable from {src} (connection refused)")

    def _serve(
        self,
        src: str,
        dst: str,
        method: str,
        path: str,
        body: bytes,
        headers: dict[str, str],
        answer: Answer,
    ) -> None:
        app, max_size = self._apps[dst]
        serving = self._serving[dst]
        task = asyncio.create_task(
            exchange(
                app,
                answer,
                method=method,
                address=dst,
                path=path,
                body=body,
                headers=headers,
                peer=src,
                client_max_size=max_size,
            ),
            name=f"serve {src}->{dst} {method} {path}",
        )
        serving[task] = None

        def done(t: asyncio.Task[None]) -> None:
            serving.pop(t, None)
            if t.cancelled():
                answer.fail(NodeUnavailable(f"node {dst} went away mid-request"))

        task.add_done_callback(done)


async def _forever() -> None:
    await asyncio.Event().wait()


class MemoryTransport:
    """A ``Transport`` for the caller at ``source`` over a :class:`MemoryNetwork`."""

    def __init__(self, network: MemoryNetwork, source: str, timeout: float = 10.0) -> None:
        self.network = network
        self.source = source
        self.timeout = timeout
        self.seen_epoch = 0

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def request(
        self,
        method: str,
        address: str,
        path: str,
        *,
        body: bytes | None = None,
        json_body: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        ok: tuple[int, ...] = (200, 201),
        max_bytes: int = MAX_ANSWER_BYTES,
    ) -> Response:
        hdrs = dict(headers or {})
        if json_body is not None:
            body = json.dumps(json_body).encode()
            hdrs["Content-Type"] = "application/json"
        limit = self.timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):
                answer = await self.network.send(
                    self.source, address, method, path, body or b"", hdrs, stream=False
                )
                data = await answer.read_all()
        except TimeoutError as exc:
            raise RequestTimeout(
                f"{method} {address}{path} took longer than {limit:.1f}s: the node is slow or stuck"
            ) from exc
        status, resp_headers = answer.status.result()
        if len(data) > max_bytes:  # in memory already: the bound as the HTTP transport's
            raise NodeUnavailable(f"{address} answered more than the {max_bytes} bytes expected")
        epoch = self._epoch(resp_headers)
        if status not in ok:
            raise error_from_answer(status, data, address)
        return Response(status, data, epoch)

    async def lookup(
        self, address: str, store: str, body: bytes, *, timeout: float | None = None
    ) -> Response:
        path = f"/v1/stores/{store}/lookup"
        ct = {"Content-Type": "application/json"}
        return await self.request("POST", address, path, body=body, headers=ct, timeout=timeout)

    async def open_stream(
        self, address: str, path: str, body: bytes, *, timeout: float | None = None
    ) -> Answer:
        limit = self.timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):
                answer = await self.network.send(
                    self.source, address, "POST", path, body, {}, stream=True
                )
                status, resp_headers = answer.status.result()
                self._epoch(resp_headers)
                if status != 200:
                    data = await answer.read_all()
                    raise error_from_answer(status, data, address)
        except TimeoutError as exc:
            raise RequestTimeout(
                f"POST {address}{path} took longer than {limit:.1f}s to answer"
            ) from exc
        return answer

    def _epoch(self, headers: Any) -> int:
        epoch = int(headers.get(EPOCH_HEADER, "0") or 0)
        self.seen_epoch = max(self.seen_epoch, epoch)
        return epoch
