"""Foreground first on a node: the storage writer (node/writer.py: one thread, foreground
writes before copies, a barrier after everything queued before it) and the gate copies wait
at for clients' requests in flight (node/foreground.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from statestore.core.errors import NotFound
from statestore.net.http import HttpTransport
from statestore.node.foreground import ForegroundGate
from statestore.node.writer import FAIR_SHARE, PriorityWriter
from tests.ringkit import config, eventually


def _blocked(writer: PriorityWriter) -> threading.Event:
    """Occupy the thread until the returned event is set, so what follows queues up."""
    gate, started = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        gate.wait(10)

    writer.submit(hold)
    assert started.wait(10)
    return gate


def test_foreground_writes_go_before_queued_copies_and_order_holds_within_a_class() -> None:
    writer = PriorityWriter()
    done: list[str] = []
    gate = _blocked(writer)
    futures = [writer.submit_background(done.append, f"copy{i}") for i in range(3)]
    futures += [writer.submit(done.append, f"client{i}") for i in range(3)]
    assert writer.backlog() == (3, 3)
    gate.set()
    for f in futures:
        f.result(10)
    assert done == ["client0", "client1", "client2", "copy0", "copy1", "copy2"]
    writer.shutdown()


def test_a_copy_is_not_starved_by_steady_foreground_writes() -> None:
    """Repair and hand-over copies get one write in FAIR_SHARE + 1 under any client load."""
    writer = PriorityWriter()
    done: list[str] = []
    gate = _blocked(writer)
    futures = [writer.submit_background(done.append, f"copy{i}") for i in range(2)]
    futures += [writer.submit(done.append, f"client{i}") for i in range(3 * FAIR_SHARE)]
    gate.set()
    for f in futures:
        f.result(10)
    first, second = done.index("copy0"), done.index("copy1")
    assert first == FAIR_SHARE and second == 2 * FAIR_SHARE + 1
    assert [x for x in done if x.startswith("client")] == [
        f"client{i}" for i in range(3 * FAIR_SHARE)
    ]
    writer.shutdown()


def test_a_barrier_runs_after_every_write_queued_before_it() -> None:
    writer = PriorityWriter()
    done: list[str] = []
    gate = _blocked(writer)
    futures = [
        writer.submit_background(done.append, "copy-before"),
        writer.submit(done.append, "client-before"),
        writer.submit_barrier(done.append, "purge"),
        writer.submit_background(done.append, "copy-after"),
        writer.submit(done.append, "client-after"),
    ]
    gate.set()
    for f in futures:
        f.result(10)
    assert done.index("purge") > done.index("copy-before")
    assert done.index("purge") > done.index("client-before")
    assert done.index("purge") < done.index("copy-after")
    writer.shutdown()


def test_errors_reach_the_caller_and_the_thread_goes_on() -> None:
    writer = PriorityWriter()

    def fail() -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        writer.submit(fail).result(10)
    assert writer.submit_background(lambda: 7).result(10) == 7
    writer.shutdown()


def test_shutdown_drains_then_refuses() -> None:
    writer = PriorityWriter()
    done: list[int] = []
    gate = _blocked(writer)
    futures = [writer.submit_background(done.append, i) for i in range(5)]
    gate.set()
    writer.shutdown(wait=True)
    assert done == [0, 1, 2, 3, 4] and all(f.done() for f in futures)
    with pytest.raises(RuntimeError):
        writer.submit(done.append, 9)


async def test_a_copy_waits_for_clients_in_flight_within_its_limit_and_period() -> None:
    gate = ForegroundGate()
    await asyncio.wait_for(gate.wait(), 1)  # idle: at once
    assert gate.yielded == 0
    gate.begin()
    gate.begin()
    waiting = asyncio.create_task(gate.wait(limit=30))
    await asyncio.sleep(0.05)
    gate.end()
    await asyncio.sleep(0.05)
    assert not waiting.done()  # one request still in flight
    gate.end()
    await asyncio.wait_for(waiting, 1)
    assert gate.yielded == 1 and gate.busy == 0
    gate.begin()  # a client request that never ends: the copy goes ahead after its limit,
    await asyncio.wait_for(gate.wait(limit=0.05, period=30), 5)
    assert gate.yielded == 2
    await asyncio.wait_for(gate.wait(limit=30, period=30), 1)  # and the next at once
    assert gate.yielded == 2
    gate.end()


async def test_a_sources_copy_waits_for_its_clients_and_is_not_counted(tmp_path: Path) -> None:
    """A real node (HTTP on port 0) whose chunk reads take 0.3 s: a client's read in flight
    is counted; a hand-over's read (``?copy=1``) sent meanwhile waits for it (``yielded``)
    and is not counted itself."""
    from statestore.node.server import start_node, stop_node

    node, runner = await start_node(config(tmp_path, "n", inject_delay=0.3))
    transport = HttpTransport()
    key = "q/0/0/s/1/d0-0123456789abcdef"
    try:
        client = asyncio.create_task(transport.request("GET", node.address, f"/v1/chunks/{key}"))
        await eventually(lambda: node.foreground.busy == 1, "the client's read counted")
        copy = asyncio.create_task(
            transport.request("GET", node.address, f"/v1/chunks/{key}?copy=1")
        )
        await eventually(lambda: node.foreground.yielded == 1, "the copy waiting")
        with pytest.raises(NotFound):
            await client
        # the copy is served after the client (0.3 s), and not counted while it runs
        await eventually(lambda: node.foreground.busy == 0 and not copy.done(), "copy uncounted")
        with pytest.raises(NotFound):
            await copy
        assert node.foreground.busy == 0 and node.foreground.yielded == 1
    finally:
        await transport.close()
        await stop_node(node, runner)


async def test_a_manifest_copy_waits_for_a_clients_manifest_on_a_real_node(tmp_path: Path) -> None:
    """A hand-over or repair sends manifests as copies (``?copy=1``), thousands in a round:
    they queue behind a client's manifest as chunk copies do, not beside it (a join's
    manifests used to go through the writer as client writes: the pending owner's commit
    p99 was its copy's, docs/benchmarks.md)."""
    from statestore.core.ids import StoreId
    from statestore.core.manifest import Manifest
    from statestore.node.server import start_node, stop_node
    from statestore.node.writer import PriorityWriter
    from statestore.wire.manifest import encode_manifest

    node, runner = await start_node(config(tmp_path, "n", replicas=1, write_quorum=1))
    assert isinstance(node.writer, PriorityWriter)
    landed: list[str] = []
    for name in ("put_manifest", "copy_manifest"):
        real = getattr(node.store, name)

        def spy(m: Manifest, *args: object, _real: Callable[..., bool] = real) -> bool:
            landed.append("client" if m.store.partition else "copy")
            return _real(m, *args)

        setattr(node.store, name, spy)
    transport = HttpTransport()
    headers = {"Content-Type": "application/msgpack"}

    async def put(partition: int, copy: bool) -> None:
        m = Manifest(StoreId("q", 0, partition), 1, "snapshot", 1, 8, (), {})
        path = f"/v1/manifests/{m.store.path}/1/snapshot" + ("?copy=1" if copy else "")
        await transport.request("PUT", node.address, path, body=encode_manifest(m), headers=headers)

    gate = _blocked(node.writer)
    try:
        copy = asyncio.create_task(put(0, copy=True))
        await eventually(lambda: node.writer.backlog() == (0, 1), "the copy queued")
        client = asyncio.create_task(put(1, copy=False))
        await eventually(lambda: node.writer.backlog() == (1, 1), "the client's write queued")
        gate.set()
        await asyncio.gather(copy, client)
        assert landed == ["client", "copy"]
    finally:
        gate.set()
        await transport.close()
        await stop_node(node, runner)
