"""Tentative commits and their outcomes (pure): Borealis DPC's rule for a state store.

A commit whose writer cannot reach W replicas within its delay bound may, if the caller allows
it, be acknowledged *tentative*: its chunks and manifest are stored, as a **hint**, on the nodes
of the store's preference list that the writer reaches (its replicas first, then fallbacks).
A hint is not a manifest: quorum reads never see it, so stable state is never mixed with
tentative state. After the heal the hint's *reconciler* (the first of its holders that is
alive) hands it to the store's owners through the ordinary write path, fencing check
included, and the outcome is decided once:

- **confirmed**: W owners took it (no writer with a higher epoch had committed meanwhile);
  from then on it is a stable commit like any other;
- **rolled back**: the owners' head has a higher epoch (a newer writer took over while the
  writer was cut off). The versions discarded and the last stable version below them, with
  its source positions, are recorded as an :class:`Outcome`, so the writer knows where to
  replay its sources from (the backtracking paper's "resend exactly what is missing").

Tentative commits of one writer chain: version v built on v - 1 of the same epoch waits for
v - 1's outcome; v - 1 rolled back rolls v back too, replaying from the same point.
Outcomes are kept at the store's owners, first writer wins at each, and read by
``ring.corrections(store)`` (docs/reliability.md, "Tentative commits").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from statestore.core.manifest import Manifest

__all__ = [
    "CONFIRMED",
    "ROLLED_BACK",
    "Correction",
    "Outcome",
    "corrections",
    "hint_order",
    "is_reconciler",
    "merge",
    "switch_after",
    "tentative_line",
]

Verdict = Literal["confirmed", "rolled_back"]
CONFIRMED: Final = "confirmed"
ROLLED_BACK: Final = "rolled_back"


@dataclass(frozen=True)
class Outcome:
    """What became of one tentative commit (store path, version, epoch)."""

    store: str
    version: int
    epoch: int
    outcome: Verdict
    # rolled back: the last stable version below the discarded ones (0: none, replay from
    # the start) and its source positions
    replay_from: int = 0
    positions: dict[str, Any] = field(default_factory=dict)

    def key(self) -> tuple[int, int]:
        return (self.epoch, self.version)


@dataclass(frozen=True)
class Correction:
    """Tentative versions of one writer (``epoch``) that were rolled back after a partition
    healed, and where to replay from: ``replay_from`` is the last stable version below them
    (0: none) and ``positions`` its source positions (what its commit recorded)."""

    store: str
    epoch: int
    versions: tuple[int, ...]
    replay_from: int
    positions: dict[str, Any]


def corrections(outcomes: Iterable[Outcome]) -> list[Correction]:
    """The rolled-back outcomes grouped by writer epoch and replay point, oldest first."""
    groups: dict[tuple[int, int], list[Outcome]] = {}
    for o in outcomes:
        if o.outcome == ROLLED_BACK:
            groups.setdefault((o.epoch, o.replay_from), []).append(o)
    out = []
    for (epoch, replay_from), os in sorted(groups.items()):
        os.sort(key=lambda o: o.version)
        out.append(
            Correction(
                os[0].store,
                epoch,
                tuple(o.version for o in os),
                replay_from,
                dict(os[0].positions),
            )
        )
    return out


def merge(answers: Iterable[Iterable[Outcome]]) -> dict[tuple[int, int], Outcome]:
    """Outcomes from several owners by (epoch, version). Owners record the first verdict they
    are sent and the reconciler sends one verdict per commit, so they agree; should two
    disagree (two reconcilers racing a take-over), rolled back wins: it is the one that
    promises less."""
    out: dict[tuple[int, int], Outcome] = {}
    for answer in answers:
        for o in answer:
            old = out.get(o.key())
            if old is None or (old.outcome == CONFIRMED and o.outcome == ROLLED_BACK):
                out[o.key()] = o
    return out


def is_reconciler(me: str, holders: Sequence[str], live: Iterable[str]) -> bool:
    """Whether ``me`` hands a hint off: the first of its holders that is alive does (the
    others keep their copy for durability and act only when every holder before them is
    down), so one commit has one reconciler while the holders agree who is alive."""
    alive = set(live) | {me}
    for holder in holders:
        if holder in alive:
            return holder == me
    return True  # a holder the writer did not list (none should be): it acts


def switch_after(delay_bound: float) -> float:
    """Seconds a commit allowed to be tentative waits for its stable write (W replicas)
    before it also writes hints: half its bound, so the hints have the other half."""
    return delay_bound / 2


def hint_order(manifests: Iterable[Manifest]) -> list[Manifest]:
    """Hints of one node in hand-off order: by store, then epoch, then version (a writer's
    tentative chain goes oldest first)."""
    return sorted(manifests, key=lambda m: (m.store.path, m.epoch, m.version, m.kind))


def tentative_line(head: tuple[int, int] | None, hints: Iterable[Manifest]) -> list[Manifest]:
    """What a read within a bound applies on top of the stable state it reached (its head,
    ``(epoch, version)``, None for none): the highest ``(epoch, version)`` hint above that
    head, then its bases down while they are hints of the same writer (same epoch, named as
    ``base_epoch``), oldest first; [] when no hint is above the head. A hint of a lower epoch
    than the head is a fenced writer's: never shown."""
    by: dict[tuple[int, int], Manifest] = {}
    for m in hints:
        old = by.get((m.epoch, m.version))
        if old is None or m.kind == "snapshot":
            by[(m.epoch, m.version)] = m
    above = [k for k in by if head is None or k > head]
    if not above:
        return []
    line = [by[max(above)]]
    while True:
        m = line[-1]
        below = (m.epoch, m.version - 1)
        if m.kind != "delta" or m.base_epoch != m.epoch or below not in by:
            break
        if head is not None and below <= head:
            break
        line.append(by[below])
    return line[::-1]
