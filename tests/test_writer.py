"""The node's storage writer (node/writer.py): one thread, foreground writes before copies,
a barrier after everything queued before it."""

from __future__ import annotations

import threading

import pytest

from statestore.node.writer import PriorityWriter


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
