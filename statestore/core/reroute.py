"""Stream cut-offs (pure): what a recovery stream delivered, and where to fetch the rest.

A line or tree plan streams the whole chain through one ``POST /v1/relay``; a star plan run
by ``run_many`` first reads its chunks in batched streams. Either can stop short: a hop dies
and its parent reports it in an ``E`` frame, the stream is cut mid-way, a chunk arrives
corrupt. The restorer then fetches only what is missing from the other replicas, the hops
that failed last (docs/design.md, Recovery plans). This module is that decision, over the events
the restorer saw; ``net/restorer.py`` performs it.

The rules:

- a chunk frame counts once its checksum holds (``ChunkArrived(intact=True)``);
- folded rows count for a chunk only if a ``D`` frame says the fold included it and either
  the stream ended cleanly or every key group the chunk spans arrived in a folded frame (a
  stream cut after some folded frames vouches for those groups only);
- a hop named in an ``E`` frame, and the root of a stream that broke (not one that merely went
  quiet), is tried last for every missing chunk;
- a missing chunk is fetched from its assigned source first, then its other holders; a holder
  that sent it corrupt is tried after the other sound holders, a failed hop after everyone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from statestore.core.plan import ChunkTask

__all__ = [
    "ChunkArrived",
    "Covered",
    "FoldedArrived",
    "HopFailed",
    "Refetch",
    "Reroute",
    "StreamCut",
    "StreamEnded",
    "StreamEvent",
    "reroute",
]


@dataclass(frozen=True)
class ChunkArrived:
    """A ``C`` frame (or a batched read) delivered ``key`` from ``source``; ``intact`` is
    whether its checksum held."""

    key: str
    source: str = ""
    intact: bool = True


@dataclass(frozen=True)
class FoldedArrived:
    """An ``F`` frame: folded rows of every key group ``lo``..``hi`` (inclusive)."""

    lo: int
    hi: int


@dataclass(frozen=True)
class Covered:
    """A ``D`` frame: the chunks the fold below included."""

    keys: tuple[str, ...]


@dataclass(frozen=True)
class HopFailed:
    """An ``E`` frame, or a batched read that failed: ``hop`` is not to be trusted now."""

    hop: str


@dataclass(frozen=True)
class StreamEnded:
    """The stream ended cleanly: everything ``D`` frames listed was folded in."""


@dataclass(frozen=True)
class StreamCut:
    """The stream from ``hop`` broke (``timed_out``: it went quiet and was abandoned, which
    says nothing against the hop)."""

    hop: str
    timed_out: bool = False


StreamEvent = ChunkArrived | FoldedArrived | Covered | HopFailed | StreamEnded | StreamCut


@dataclass(frozen=True)
class Refetch:
    """One missing chunk and the holders to try, in order."""

    key: str
    order: tuple[str, ...]


@dataclass(frozen=True)
class Reroute:
    """What the events left to do: ``done`` chunks, ``failed`` hops, ``missing`` chunks in
    plan order with where to fetch each."""

    done: frozenset[str]
    failed: frozenset[str]
    missing: tuple[Refetch, ...]


def reroute(
    tasks: Sequence[ChunkTask],
    assignment: Mapping[str, str],
    events: Iterable[StreamEvent],
) -> Reroute:
    """The chunks of ``tasks`` the ``events`` did not deliver, and where to fetch each.

    ``assignment`` maps a chunk key to its planned source. Events about chunks not in
    ``tasks`` are ignored (a relay may forward more than the plan asked for).
    """
    by_key = {t.key: t for t in tasks}
    done: set[str] = set()
    covers: set[str] = set()
    groups: set[int] = set()
    failed: set[str] = set()
    corrupt_from: dict[str, set[str]] = {}
    clean = False
    for e in events:
        if isinstance(e, ChunkArrived):
            if e.key not in by_key:
                continue
            if e.intact:
                done.add(e.key)
            else:
                corrupt_from.setdefault(e.key, set()).add(e.source or assignment.get(e.key, ""))
        elif isinstance(e, FoldedArrived):
            groups.update(range(e.lo, e.hi + 1))
        elif isinstance(e, Covered):
            covers.update(k for k in e.keys if k in by_key)
        elif isinstance(e, HopFailed):
            failed.add(e.hop)
        elif isinstance(e, StreamEnded):
            clean = True
        elif isinstance(e, StreamCut) and not e.timed_out:
            failed.add(e.hop)
    for key in covers:
        t = by_key[key]
        if clean or all(g in groups for g in range(t.lo, t.hi + 1)):
            done.add(key)
    missing = []
    for t in tasks:
        if t.key in done:
            continue
        first = assignment.get(t.key)
        candidates = list(dict.fromkeys(([first] if first else []) + list(t.holders)))
        rotten = corrupt_from.get(t.key, set())
        sound = [a for a in candidates if a not in failed and a not in rotten]
        suspect = [a for a in candidates if a not in failed and a in rotten]
        last = [a for a in t.holders if a in failed]
        missing.append(Refetch(t.key, tuple(sound + suspect + last)))
    return Reroute(frozenset(done), frozenset(failed), tuple(missing))
