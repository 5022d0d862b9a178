"""The I/O-free core both clients share: argument checks, commit layout, result types."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from statestore.core.commit import build_commit
from statestore.core.errors import InvalidRequest
from statestore.core.ids import StoreId
from statestore.core.plan import PLANS

__all__ = ["PLANS", "CommitResult", "RestoredState", "build_commit", "check_plan", "parse_seeds"]


def parse_seeds(seeds: Iterable[str] | str) -> list[str]:
    items = [seeds] if isinstance(seeds, str) else list(seeds)
    out = []
    for s in items:
        for part in str(s).split(","):
            part = part.strip()
            if not part:
                continue
            host, sep, port = part.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"seed {part!r} is not HOST:PORT, e.g. 127.0.0.1:7400")
            out.append(part)
    if not out:
        raise ValueError("give at least one seed HOST:PORT of a running node")
    return out


def check_plan(plan: str) -> str:
    if plan not in PLANS:
        raise InvalidRequest(f"restore plan {plan!r} is not one of {', '.join(PLANS)}")
    return plan


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


@dataclass
class RestoredState(Mapping[bytes, bytes]):
    """A restored version of a store: a read-only mapping of bytes to bytes."""

    data: dict[bytes, bytes]
    version: int
    epoch: int
    positions: dict[str, Any]
    plan: str
    stats: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: bytes) -> bytes:
        return self.data[key]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)
