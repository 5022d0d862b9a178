"""The I/O-free core both clients share: argument checks, commit layout, result types."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from statestore.core.address import parse_seeds
from statestore.core.commit import build_commit
from statestore.core.errors import InvalidRequest
from statestore.core.ids import StoreId
from statestore.core.plan import PLANS, check_plan
from statestore.core.stats import RestoreStats

__all__ = ["PLANS", "CommitResult", "RestoredState", "build_commit", "check_plan", "parse_seeds"]


def check_store(store: object) -> StoreId:
    if not isinstance(store, StoreId):
        raise InvalidRequest(
            f"store must be a StoreId(query, operator, partition, name), got {store!r}"
        )
    return store


@dataclass(frozen=True)
class CommitResult:
    store: StoreId
    version: int
    epoch: int
    kind: str
    chunks: int
    bytes: int
    raw_bytes: int
    tentative: bool = False  # acknowledged by the nodes reached, not W (core/tentative.py)


@dataclass
class RestoredState(Mapping[bytes, bytes]):
    """A restored version of a store: a read-only mapping of bytes to bytes."""

    data: dict[bytes, bytes]
    version: int
    epoch: int
    positions: dict[str, Any]
    plan: str
    stats: RestoreStats = field(default_factory=RestoreStats)
    tentative: bool = False  # within a bound: what the nodes that answered hold, not a quorum

    def __getitem__(self, key: bytes) -> bytes:
        return self.data[key]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)
