"""The node's single storage writer thread, foreground first.

Every storage write runs on one thread (what makes a fencing check atomic with its write).
A hand-over or repair moves hundreds of MiB through that thread, one chunk per write (each an
LMDB transaction with its fsync); in a first-in-first-out queue a client's commit waited
behind every copy queued before it (docs/benchmarks.md, "Elastic ring": commit p99 5-7x
during a move). Here a write is either *foreground* (a client's chunk, manifest or commit,
a delete, a drop: the default) or *background* (a copy another replica or a hand-over sends,
which only adds an item the ring already holds elsewhere). The thread always takes the
oldest foreground write first, then the oldest background one; within a class the order is
kept. Reordering only ever moves a copy later, which is safe: a copy is idempotent and
never removes anything, and whatever decided to drop an item ran on the ring's copies, not on
this queue (a late copy of a dropped item is an extra copy that repair drops again). The one
write that must see every write queued before it, a query's purge (node/tombstones.py), is a
*barrier*: the background writes waiting when it is queued go ahead of it.

Foreground first is not foreground only: under steady client writes a strict priority would
starve repair and hand-over for as long as the writes last, and redundancy lost to a dead
node would never come back. After :data:`FAIR_SHARE` foreground writes in a row while a copy
waits, the oldest copy runs: copies get at least one write in ``FAIR_SHARE + 1`` under any
load, clients at least ``FAIR_SHARE`` of them.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

__all__ = ["FAIR_SHARE", "PriorityWriter"]

T = TypeVar("T")
FAIR_SHARE = 8  # foreground writes in a row, while a copy waits, before the copy runs
_Job = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class PriorityWriter(Executor):
    """One worker thread; :meth:`submit` is foreground, :meth:`submit_background` yields to
    every foreground write queued before it runs."""

    def __init__(self, name: str = "statestore-writer") -> None:
        self._fore: collections.deque[_Job] = collections.deque()
        self._back: collections.deque[_Job] = collections.deque()
        self._cv = threading.Condition()
        self._closed = False
        self._streak = 0  # foreground writes run in a row while a copy waited
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        return self._put(self._fore, fn, args, kwargs)

    def submit_background(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        return self._put(self._back, fn, args, kwargs)

    def submit_barrier(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """A write that runs after everything queued before it, background writes too (a
        query's purge: a copy queued before it must not land after it)."""
        with self._cv:  # an RLock: _put takes it again
            self._fore.extend(self._back)
            self._back.clear()
            return self._put(self._fore, fn, args, kwargs)

    def backlog(self) -> tuple[int, int]:
        """``(foreground, background)`` writes waiting."""
        with self._cv:
            return len(self._fore), len(self._back)

    def _put(
        self,
        queue: collections.deque[_Job],
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Future[Any]:
        fut: Future[Any] = Future()
        with self._cv:
            if self._closed:
                raise RuntimeError("the storage writer is shut down")
            queue.append((fut, fn, args, kwargs))
            self._cv.notify()
        return fut

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._fore and not self._back and not self._closed:
                    self._cv.wait()
                job = self._next()
                if job is None:
                    return  # closed and drained
            fut, fn, args, kwargs = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # handed to the awaiting caller
                fut.set_exception(exc)

    def _next(self) -> _Job | None:
        """The next job (the condition held): foreground first, a copy after a fair share."""
        if self._back and (not self._fore or self._streak >= FAIR_SHARE):
            self._streak = 0
            return self._back.popleft()
        if self._fore:
            self._streak = self._streak + 1 if self._back else 0
            return self._fore.popleft()
        return None

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._cv:
            self._closed = True
            if cancel_futures:
                for queue in (self._fore, self._back):
                    while queue:
                        queue.popleft()[0].cancel()
            self._cv.notify_all()
        if wait and threading.current_thread() is not self._thread:
            self._thread.join()
