"""RingClient: the blocking SDK (scripts, Spark executors), over AsyncRingClient.

It owns one event loop on a private thread and runs the async client there. This is
deliberate: a restore fans out over many nodes at once, and one async implementation of the
read and write paths is easier to keep right than a second, threaded one.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from statestore.core.ids import StoreId
from statestore.core.manifest import Head
from statestore.core.plan import Plan
from statestore.core.tentative import Correction, Outcome
from statestore.core.view import RingView

from ._async import AsyncRingClient
from ._core import CommitResult, RestoredState
from ._open import DEFAULT_OPEN_CACHE, LazyState

__all__ = ["RingClient"]

T = TypeVar("T")


class RingClient:
    """Blocking twin of :class:`AsyncRingClient`; same arguments, same errors."""

    def __init__(self, seeds: Iterable[str] | str, **options: Any) -> None:
        self._async = AsyncRingClient(seeds, **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="statestore-client", daemon=True
        )
        self._thread.start()
        try:
            self._call(self._async.connect())
        except BaseException:
            self._shutdown()
            raise

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _shutdown(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._call(self._async.close())
        finally:
            self._shutdown()

    def __enter__(self) -> RingClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def commit(
        self,
        store: StoreId,
        version: int,
        puts: Mapping[bytes, bytes],
        deletes: Iterable[bytes] = (),
        positions: Mapping[str, Any] | None = None,
        epoch: int = 0,
        *,
        snapshot: bool = False,
        base_epoch: int | None = None,
        consistency: str = "quorum",
        delay_bound: float | None = None,
        allow_tentative: bool = False,
    ) -> CommitResult:
        """:meth:`AsyncRingClient.commit` (``base_epoch``: the epoch of the restored
        ``version - 1`` this commit builds on; by default what this client last restored or
        committed of the store, if that was ``version - 1``; ``consistency`` one, quorum or
        all; ``delay_bound`` seconds; ``allow_tentative=True``: acknowledged tentative by the
        nodes it reaches when W replicas did not answer within half the bound)."""
        return self._call(
            self._async.commit(
                store,
                version,
                puts,
                deletes,
                positions,
                epoch,
                snapshot=snapshot,
                base_epoch=base_epoch,
                consistency=consistency,
                delay_bound=delay_bound,
                allow_tentative=allow_tentative,
            )
        )

    def restore(
        self,
        store: StoreId,
        version: int | None = None,
        *,
        plan: str = "auto",
        progress: Callable[[int], None] | None = None,
        key_groups: range | None = None,
        consistency: str = "quorum",
        delay_bound: float | None = None,
    ) -> RestoredState:
        """:meth:`AsyncRingClient.restore` (``consistency`` one, quorum or all: how many
        replicas the head and chain reads hear from; ``delay_bound`` seconds)."""
        return self._call(
            self._async.restore(
                store,
                version,
                plan=plan,
                progress=progress,
                key_groups=key_groups,
                consistency=consistency,
                delay_bound=delay_bound,
            )
        )

    def restore_many(
        self,
        stores: Sequence[StoreId | tuple[StoreId, int]],
        *,
        plan: str = "auto",
        progress: Callable[[int], None] | None = None,
        key_groups: range | None = None,
    ) -> list[RestoredState]:
        return self._call(
            self._async.restore_many(stores, plan=plan, progress=progress, key_groups=key_groups)
        )

    def explain(self, store: StoreId, version: int | None = None, plan: str = "auto") -> Plan:
        return self._call(self._async.explain(store, version, plan))

    def get(self, store: StoreId, key: bytes, version: int | None = None) -> bytes | None:
        return self._call(self._async.get(store, key, version))

    def open(
        self,
        store: StoreId,
        version: int | None = None,
        *,
        cache_bytes: int = DEFAULT_OPEN_CACHE,
        lookups: bool | None = None,
    ) -> LazyState:
        """:meth:`AsyncRingClient.open`: a version (default: the latest) of ``store`` as a
        read-only ``Mapping[bytes, bytes]`` that fetches key groups as they are read."""
        lazy = self._call(
            self._async.open(store, version, cache_bytes=cache_bytes, lookups=lookups)
        )
        return LazyState(lazy, self._call)

    def latest(self, store: StoreId) -> Head:
        return self._call(self._async.latest(store))

    def versions(self, store: StoreId) -> list[int]:
        return self._call(self._async.versions(store))

    def ring(self) -> RingView:
        return self._call(self._async.ring())

    def outcomes(self, store: StoreId) -> list[Outcome]:
        """:meth:`AsyncRingClient.outcomes`: what became of the store's tentative commits."""
        return self._call(self._async.outcomes(store))

    def corrections(self, store: StoreId) -> list[Correction]:
        """:meth:`AsyncRingClient.corrections`: rolled-back tentative commits, with the
        version and source positions to replay from."""
        return self._call(self._async.corrections(store))
