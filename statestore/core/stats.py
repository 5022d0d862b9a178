"""What a restore did (pure): one typed record, also readable as a mapping.

The SDK documents ``st.stats["reason"]`` and friends, so :class:`RestoreStats` is a
``Mapping[str, Any]`` over its fields (plus ``bytes``, the same as ``bytes_in``); code inside
the package uses the attributes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["RestoreStats"]


@dataclass(eq=False)
class RestoreStats(Mapping[str, Any]):
    """One restore: the plan and why, predicted and actual time, and what moved where."""

    plan: str = ""  # star | line | tree
    reason: str = ""  # why the planner chose it
    predicted_seconds: float = 0.0
    sr3_rule: str = ""  # what SR3's fixed rule would have chosen
    chunks: int = 0  # chunks in the plan
    chain: int = 0  # manifests in the chain (snapshot + deltas)
    bytes_in: int = 0  # bytes that reached the restorer
    rerouted: int = 0  # chunks a stream did not deliver, fetched again with failover
    failovers: int = 0  # holders skipped on error, timeout or checksum mismatch
    batched: int = 0  # chunks a restore_many stream delivered beforehand
    seconds: float = 0.0
    hops: list[dict[str, Any]] = field(default_factory=list)  # per hop: depth, own, in, out
    failed_hops: list[dict[str, Any]] = field(default_factory=list)  # hop, error
    bytes_by_node: dict[str, int] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return self.bytes_in

    def _keys(self) -> list[str]:
        return [f.name for f in fields(self)] + ["bytes"]

    def __getitem__(self, key: str) -> Any:
        if key not in self._keys():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    def as_dict(self) -> dict[str, Any]:
        return dict(self.items())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self.items()) == dict(other.items())

    __hash__ = None  # type: ignore[assignment]
