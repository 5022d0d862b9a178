"""The statestore client SDK: ``RingClient`` (blocking) and ``AsyncRingClient`` (asyncio).

::

    from client import RingClient, StoreId
    with RingClient(["127.0.0.1:7400"]) as ring:
        sid = StoreId(query="q1", operator=0, partition=3, name="default")
        ring.commit(sid, version=1, puts={b"k": b"v"}, deletes=[], positions={"src-0": 42}, epoch=1)
        st = ring.restore(sid, version=1)
        with ring.open(sid) as lazy:  # a Mapping that fetches key groups as they are read
            lazy[b"k"]

Errors come from one tree (``StateStoreError`` and below), re-exported here.
"""

from statestore.core.errors import (
    AccessDenied,
    CorruptChunk,
    DecompressionBomb,
    DelayBoundExceeded,
    Forbidden,
    InvalidRequest,
    InvalidStoreId,
    MalformedData,
    NodeUnavailable,
    NotFound,
    PayloadTooLarge,
    QuorumNotReached,
    QuotaExceeded,
    RequestTimeout,
    StaleEpoch,
    StateStoreError,
    StoreNotFound,
    TentativeRolledBack,
    TlsFailed,
    Unauthenticated,
    Unavailable,
    VersionConflict,
    VersionNotFound,
)
from statestore.core.ids import StoreId
from statestore.core.manifest import Head
from statestore.core.tentative import Correction, Outcome
from statestore.core.view import RingView

from ._async import AsyncRingClient
from ._core import CommitResult, RestoredState
from ._open import AsyncLazyState, LazyState
from ._sync import RingClient

__all__ = [
    "AccessDenied",
    "AsyncLazyState",
    "AsyncRingClient",
    "CommitResult",
    "Correction",
    "CorruptChunk",
    "DecompressionBomb",
    "DelayBoundExceeded",
    "Forbidden",
    "Head",
    "InvalidRequest",
    "InvalidStoreId",
    "LazyState",
    "MalformedData",
    "NodeUnavailable",
    "NotFound",
    "Outcome",
    "PayloadTooLarge",
    "QuorumNotReached",
    "QuotaExceeded",
    "RequestTimeout",
    "RestoredState",
    "RingClient",
    "RingView",
    "StaleEpoch",
    "StateStoreError",
    "StoreId",
    "StoreNotFound",
    "TentativeRolledBack",
    "TlsFailed",
    "Unauthenticated",
    "Unavailable",
    "VersionConflict",
    "VersionNotFound",
]
