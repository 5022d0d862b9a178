"""Repair decisions (pure): who copies what after the ring changed, and what may go.

When a node is lost, each lost copy is made by exactly one surviving holder, chosen by
rendezvous hashing over the item's previous replicas that are still alive, so that the work
spreads evenly and nobody needs to coordinate (docs/design.md, Repair).

:func:`decide` is one repair pass of a node as a function of its inputs: the items it holds
with their current and previous replicas, the live set, what each replica reported it lacks,
whether the epoch moved since the last pass, and which pushes failed. It answers the pushes to
make and the local copies that may be dropped: a copy this node no longer owns goes only once
every current owner confirmed it (held it, or took our push), and never in a pass where the
epoch moved, so a half-formed view never costs a copy. A copy a node will own once a join or
leave finishes (a pending owner) is never dropped: a joining node keeps what it streamed, and
an old owner drops only after the switch (core/handover.py). ``node/repair.py`` asks the replicas,
performs the pushes and the drops.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import xxhash

from statestore.core.errors import NodeUnavailable
from statestore.core.view import RingView

__all__ = [
    "Holding",
    "Push",
    "RepairDecision",
    "acknowledged",
    "content_digest",
    "decide",
    "mine_to_push",
    "pick_source",
]


def pick_source(key: str, holders: Sequence[str]) -> str:
    """The one holder that re-replicates ``key`` (rendezvous hashing): every holder computes
    the same answer without talking, and the work spreads evenly over the holders."""
    if not holders:
        raise NodeUnavailable(f"item {key} has no live holder to copy it from")
    return max(holders, key=lambda h: (xxhash.xxh64_intdigest(f"{key}|{h}".encode()), h))


def mine_to_push(view: RingView, live: Collection[str], key: str, me: str) -> bool:
    """Whether node ``me`` is the one to push ``key`` to its owners: the holder
    :func:`pick_source` names among the item's previous replicas still alive, or any node
    that holds it for another reason (a hand-off)."""
    return _mine(key, view.previous_replicas(key), live, me)


def _mine(key: str, previous: Sequence[str], live: Collection[str], me: str) -> bool:
    holders = [a for a in previous if a in live]
    if me not in holders:
        return True
    return pick_source(key, holders) == me


@dataclass(frozen=True)
class Holding:
    """One item this node holds and where the ring puts it.

    ``item`` is its name (``c:<chunk key>`` or ``m:<store>/<version>/<kind>/<epoch>``,
    core/items.py; opaque here); ``key`` is what placement hashes (the chunk key, or the
    store path for a manifest: the item's ``placement_key``); ``owners`` are its replicas at
    the current epoch, ``previous`` its replicas on the ring that still counted the down
    nodes; ``pending`` its pending owners while nodes join or leave (future owners that do
    not own it yet, core/handover.py): a pending owner keeps its copy.
    """

    item: str
    key: str
    owners: tuple[str, ...]
    previous: tuple[str, ...]
    pending: tuple[str, ...] = ()


@dataclass(frozen=True)
class Push:
    """Copy ``item`` to ``target``, which reported it lacks it."""

    target: str
    item: str


@dataclass(frozen=True)
class RepairDecision:
    """The outcome of one pass.

    ``pushes`` in holding order; ``skipped``: lacking copies left to their designated source
    (a planned pass); ``drops``: local copies every current owner confirmed; ``pending``:
    copies held for others that may not go yet. ``pending + skipped`` non-zero asks for
    another pass soon.
    """

    pushes: tuple[Push, ...]
    skipped: tuple[Push, ...]
    drops: tuple[str, ...]
    pending: tuple[str, ...]

    @property
    def outstanding(self) -> int:
        return len(self.pending) + len(self.skipped)


def decide(
    me: str,
    holdings: Sequence[Holding],
    live: Collection[str],
    answers: Mapping[tuple[str, str], bool],
    *,
    epoch_moved: bool,
    planned: bool = False,
    failed: Collection[tuple[str, str]] = (),
) -> RepairDecision:
    """One repair pass of node ``me``.

    Args:
        me: this node's address.
        holdings: the items it holds, with their owners and previous replicas.
        live: the addresses of the live members.
        answers: ``(target, item) -> whether target holds item``, for every question a target
            answered; an owner that did not answer (down, or its batch failed) confirms
            nothing and is pushed nothing.
        epoch_moved: the ring's epoch changed since the last pass: nothing is dropped.
        planned: within the grace period after the epoch moved, a lacking copy is pushed only
            by its designated source (:func:`pick_source` over its live previous replicas).
        failed: pushes ``(target, item)`` that were tried and failed (the shell calls this
            again after pushing, to learn the drops).
    """
    failed_ = set(failed)
    pushes: list[Push] = []
    skipped: list[Push] = []
    drops: list[str] = []
    pending: list[str] = []
    for h in holdings:
        confirmed = 0
        for target in h.owners:
            if target == me:
                continue
            has = answers.get((target, h.item))
            if has is None:
                continue
            if not has:
                push = Push(target, h.item)
                if planned and not _mine(h.key, h.previous, live, me):
                    skipped.append(push)
                    continue
                pushes.append(push)
                if (target, h.item) in failed_:
                    continue
            confirmed += 1
        if me in h.owners or me in h.pending or not h.owners:
            continue
        if confirmed >= len(h.owners) and not epoch_moved:
            drops.append(h.item)
        else:
            pending.append(h.item)
    return RepairDecision(tuple(pushes), tuple(skipped), tuple(drops), tuple(pending))


def content_digest(kind: str, checksums: Sequence[int]) -> int:
    """A manifest's content as one number (its kind and its chunks' checksums, what
    ``Manifest.same_content`` compares): two replicas holding one version and epoch compare
    it to find content that differs (``/v1/sync/have``)."""
    text = kind + ":" + ",".join(f"{c:x}" for c in checksums)
    # 63 bits (a JSON integer every peer decodes); 0 means "not known" on the wire
    return (xxhash.xxh64_intdigest(text.encode()) >> 1) or 1


def acknowledged(held: Sequence[int | None], write_quorum: int) -> int | None:
    """Of the content digests the owners hold at one version, kind and epoch (None: an owner
    that holds none or did not answer), the one W of them hold: the acknowledged content.
    None when no content is at W (nothing to reconcile to yet)."""
    counts: dict[int, int] = {}
    for d in held:
        if d is not None:
            counts[d] = counts.get(d, 0) + 1
    best = [d for d, n in counts.items() if n >= write_quorum]
    return best[0] if len(best) == 1 else None
