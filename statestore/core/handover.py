"""Hand-over of ranges when a node joins or leaves (pure): member states, plans, the machine.

A member is in one of four ring states, carried in gossip with its heartbeat (each node is the
only author of its own entry, so its state spreads like its heartbeat):

- ``joining``: it takes its tokens as *pending*: writes already go to it, reads do not; it
  pulls what it will own from the current holders (:func:`pull_plan`).
- ``normal``: it owns its ranges.
- ``leaving``: it still owns (and serves) its ranges while it pushes each item to the nodes
  that will own it once it is gone (:func:`push_plan`).
- ``left``: it owns nothing; its entry stays in the table so that it is not taken back.

Two rings follow from the states (``core/view.py`` builds them): the *read* ring of the live
``normal`` and ``leaving`` members (the current owners) and the *future* ring of the live
``normal`` and ``joining`` members. An item's write replicas are its current owners plus its
pending owners (future owners that do not own it yet), as Cassandra's pending ranges; a write
counts only with W acknowledgements among the current owners *and* W among the future ones
(``core/quorum.check_write_sets``), so it is readable before the switch and after it.

A move goes through :class:`Handover`'s phases: ``streaming`` (rounds of copying) until one
round finds nothing missing, every source answered and every source already routes by the
mover's new state; then ``verified``; the shell gossips the new state (``normal`` for a join,
``left`` for a leave) and the move is ``switched``. Old owners drop what they no longer own
only afterwards, through repair, which keeps a copy until every owner confirmed it
(``core/repair.decide``). docs/design.md, "Moves are hand-overs with two rings"; the
incremental migration paper's hand-over.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

import xxhash

__all__ = [
    "FUTURE_STATES",
    "READ_STATES",
    "Handover",
    "NodeState",
    "Phase",
    "Pull",
    "Push",
    "RoundResult",
    "Sighting",
    "batches",
    "copy_order",
    "pull_plan",
    "push_plan",
    "remove_plan",
    "replace_plan",
]


class NodeState(StrEnum):
    """A member's place in the ring's life (module docstring)."""

    JOINING = "joining"
    NORMAL = "normal"
    LEAVING = "leaving"
    LEFT = "left"


READ_STATES = frozenset({NodeState.NORMAL, NodeState.LEAVING})  # current owners
FUTURE_STATES = frozenset({NodeState.NORMAL, NodeState.JOINING})  # owners once moves finish


class Phase(StrEnum):
    STREAMING = "streaming"
    VERIFIED = "verified"
    SWITCHED = "switched"
    FAILED = "failed"


@dataclass(frozen=True)
class RoundResult:
    """What one round of a move found and did.

    ``missing``: items the new owners lacked at the start of the round (all were tried);
    ``failed``: of those, copies that did not land; ``unanswered``: sources (join) or targets
    (leave) that did not answer; ``unseen``: live members that do not yet route by the mover's
    new state (so a write could still miss the new owner); ``bytes``: bytes copied.
    """

    listed: int
    missing: int
    failed: int = 0
    unanswered: int = 0
    unseen: int = 0
    bytes: int = 0

    @property
    def clean(self) -> bool:
        return not (self.missing or self.failed or self.unanswered or self.unseen)


@dataclass(frozen=True)
class Handover:
    """One node's move (``kind`` join, leave, or rebalance: a change of its token count; or
    remove: a survivor's share of writing a dead member off, ``statestore removenode``) as a
    state machine: rounds in, phase out.

    Nothing here waits: the shell runs a round, feeds its :class:`RoundResult` to
    :meth:`after_round`, and when the phase is ``verified`` gossips the new state and calls
    :meth:`switch`. ``rounds`` counts rounds; ``copied`` and ``bytes`` add up what moved;
    ``last`` is the latest round's result.
    """

    kind: str
    phase: Phase = Phase.STREAMING
    rounds: int = 0
    copied: int = 0
    bytes: int = 0
    reason: str = ""
    last: RoundResult | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("join", "leave", "rebalance", "remove"):
            raise ValueError(
                f"a hand-over is a join, a leave, a rebalance or a removal, not {self.kind!r}"
            )

    def after_round(self, r: RoundResult) -> Handover:
        """The machine after a round. A clean round verifies the copy; any other keeps it
        streaming (a source or target that died costs another round, not the move)."""
        if self.phase is not Phase.STREAMING:
            raise ValueError(f"a {self.phase} hand-over runs no more rounds")
        nxt = replace(
            self,
            rounds=self.rounds + 1,
            copied=self.copied + r.missing - r.failed,
            bytes=self.bytes + r.bytes,
            last=r,
        )
        if r.clean:
            return replace(nxt, phase=Phase.VERIFIED)
        return nxt

    def switch(self) -> Handover:
        """Ownership switched (the new state is gossiped): the move is done."""
        if self.phase is not Phase.VERIFIED:
            raise ValueError(f"only a verified hand-over switches, not a {self.phase} one")
        return replace(self, phase=Phase.SWITCHED)

    def fail(self, reason: str) -> Handover:
        """Give up (the operator's deadline passed, or the ring cannot take the move)."""
        return replace(self, phase=Phase.FAILED, reason=reason)


# -- what to copy -------------------------------------------------------------------------


@dataclass(frozen=True)
class Pull:
    """Fetch ``item`` (``c:<chunk key>`` or ``m:<store>/<version>/<kind>/<epoch>``) from the first
    of ``sources`` that has it."""

    item: str
    sources: tuple[str, ...]


@dataclass(frozen=True)
class Push:
    """Copy ``item`` to ``target``, which said it lacks it."""

    target: str
    item: str


def _rank(item: str, holder: str) -> int:
    return xxhash.xxh64_intdigest(f"{item}|{holder}".encode())


def copy_order(items: Sequence[str]) -> list[int]:
    """The order in which a round copies its ``items`` (indexes into them): by a hash of each
    item's name, not by name.

    Names sort by store, so in name order a round copied each store's chunks in one run: the
    hundreds of tiny chunks of a store of small deltas went one after another, thousands of
    copies a second that the bytes budget hardly slowed, then a store of large snapshots at
    the budget. Every copy is a request on two nodes: a run of tiny ones cost all the CPU
    in a move's first half second, while the bytes budget saved up for a burst after it
    (docs/benchmarks.md). Mixed by hash, the sizes are spread over the round, and with them
    both the copies per second and the bytes."""
    keys = [xxhash.xxh64_intdigest(item.encode()) for item in items]
    return sorted(range(len(items)), key=keys.__getitem__)  # stable: ties keep name order


def batches(keys: Sequence[str], size: int) -> list[list[int]]:
    """Positions ``0..len(keys)-1`` cut into batches of one key each (a manifest's target or
    source: one request copies a batch), at most ``size`` long, each in position order. The
    full batches come in the order they fill (when their last item's turn comes), then the
    partial ones by their last position. Every position is in exactly one batch."""
    if size < 1:
        raise ValueError(f"batch size must be at least 1, not {size}")
    open_: dict[str, list[int]] = {}
    out: list[list[int]] = []
    for p, key in enumerate(keys):
        batch = open_.setdefault(key, [])
        batch.append(p)
        if len(batch) == size:
            out.append(open_.pop(key))
    out += sorted(open_.values(), key=lambda b: b[-1])
    return out


def pull_plan(listings: Mapping[str, Sequence[str]], held: Collection[str]) -> list[Pull]:
    """What a joining node fetches in one round.

    Args:
        listings: per source, the items it holds that the joining node will own.
        held: the items the joining node already holds.

    Returns every listed item not held, once, in item order, with every source that listed
    it, ordered by rendezvous hashing of (item, source): every item has one first source and
    the work spreads evenly over the holders (as ``core/repair.pick_source``); the others are
    the failover order.
    """
    holders: dict[str, list[str]] = {}
    for source, items in listings.items():
        for item in items:
            if item not in held:
                holders.setdefault(item, []).append(source)
    return [
        Pull(item, tuple(sorted(srcs, key=lambda s: (-_rank(item, s), s))))
        for item, srcs in sorted(holders.items())
    ]


def push_plan(
    me: str,
    targets: Mapping[str, Sequence[str]],
    answers: Mapping[tuple[str, str], bool],
) -> tuple[list[Push], int]:
    """What a leaving node pushes in one round.

    Args:
        me: the leaving node.
        targets: per item it holds, the item's future owners (the ring without it).
        answers: ``(target, item) -> holds it`` for every question a target answered.

    Returns the pushes (item order, then target order) and how many (target, item) questions
    went unanswered: those can be neither pushed nor counted as copies, so the round is not
    clean.
    """
    pushes: list[Push] = []
    unanswered = 0
    for item in sorted(targets):
        for t in targets[item]:
            if t == me:
                continue
            has = answers.get((t, item))
            if has is None:
                unanswered += 1
            elif not has:
                pushes.append(Push(t, item))
    return pushes, unanswered


# -- replacing a dead node ------------------------------------------------------------------


@dataclass(frozen=True)
class Sighting:
    """How one member of the ring sees the node to be replaced: its failure-detector
    ``status`` (up, suspect, down), ring ``state``, ``incarnation`` and ``zone``."""

    status: str
    state: str
    incarnation: int
    zone: str = ""
    removal: str = ""  # a removal's mark ("removing", "removed": statestore removenode)
    removed_by: str = ""


def replace_plan(
    target: str, zone: str, sightings: Mapping[str, Sighting | None], asked: int
) -> tuple[str | None, int]:
    """Whether a new node may take over dead node ``target``'s id (so its tokens: placement
    hashes the id), and the incarnation it then takes.

    Args:
        target: the dead node's id (``statestore node --replace ID``).
        zone: the replacement's zone (placement is zone-aware: it must be the dead node's).
        sightings: per member that answered, how it sees ``target`` (None: unknown to it).
        asked: how many members were asked.

    Returns ``(why not, incarnation)``: the reason it may not (None: it may), and one more
    than the highest incarnation any member saw, so the replacement's gossip entry wins over
    the dead node's everywhere. Refused: no member answered; nobody knows ``target``; any
    member sees it up or suspect (it may be alive, or not yet declared down); it owned
    nothing (it was joining or had left: add a node with ``--join`` instead); another zone.
    """
    if not sightings:
        return f"none of the {asked} member(s) asked answered: cannot tell if {target} is dead", 0
    seen = {m: s for m, s in sightings.items() if s is not None}
    if not seen:
        return (
            f"no member of the ring knows a node {target} ({len(sightings)} answered): "
            "give the id `statestore ring` shows for the dead node"
        ), 0
    for s in seen.values():
        if s.removal:
            return (
                f"node {target} is {s.removal} from the ring (statestore removenode): its id "
                "is written off for good; add this node with --join instead"
            ), 0
    for member, s in sorted(seen.items()):
        if s.status != "down":
            return (
                f"node {target} is {s.status} as {member} sees it: only a dead node is "
                "replaced (wait until the ring declares it down, or stop it first; to take "
                "a live node out use statestore decommission)"
            ), 0
    states = {s.state for s in seen.values()}
    if not states <= {NodeState.NORMAL, NodeState.LEAVING}:
        return (
            f"node {target} was {'/'.join(sorted(states))} when it died: it owned nothing "
            "to take over; add a node with --join instead"
        ), 0
    zones = {s.zone for s in seen.values()}
    if zones != {zone}:
        return (
            f"node {target} was in zone {'/'.join(sorted(repr(z) for z in zones))}, this "
            f"node is in {zone!r}: give it the dead node's --zone (placement follows id "
            "and zone)"
        ), 0
    return None, max(s.incarnation for s in seen.values()) + 1


# -- removing a dead node for good ------------------------------------------------------------


def remove_plan(
    target: str,
    sightings: Mapping[str, Sighting | None],
    asked: int,
    survivors: int,
    replicas: int,
    others_down: Sequence[str] = (),
    force: bool = False,
) -> str | None:
    """Why dead node ``target`` may not be removed for good now (``statestore removenode``;
    None: it may).

    Args:
        target: the dead node's id.
        sightings: per member that answered, how it sees ``target`` (None: unknown to it).
        asked: how many members were asked.
        survivors: the live ``normal`` members that would keep its share.
        replicas: R.
        others_down: the other members that are down (not left).
        force: remove it though others are down.

    Refused: no member answered; nobody knows ``target``; it was removed already; any member
    sees it up or suspect (a live node is decommissioned instead); it left the ring already;
    fewer than R survivors would hold its share; another member is down, unless ``force``: a
    commit acknowledged by ``target`` and down members alone (W of its R replicas) is on no
    live node, so the removal cannot re-make it, and it is kept only by the down members,
    whose own removal would lose it. A removal under way (``removing``) is the shell's to
    judge: it knows whether the survivor running it still does."""
    if not sightings:
        return f"none of the {asked} member(s) asked answered: cannot tell if {target} is dead"
    seen = {m: s for m, s in sightings.items() if s is not None}
    if not seen:
        return (
            f"no member of the ring knows a node {target} ({len(sightings)} answered): "
            "give the id `statestore ring` shows for the dead node"
        )
    for s in seen.values():
        if s.removal == "removed":
            return f"node {target} was removed from the ring already (by {s.removed_by})"
    for member, s in sorted(seen.items()):
        if s.status != "down":
            return (
                f"node {target} is {s.status} as {member} sees it: only a dead (down) node is "
                f"removed; a live node is decommissioned instead (statestore decommission "
                f"--node {target}), or stop it and wait until `statestore ring` shows it down"
            )
    if all(s.state == NodeState.LEFT for s in seen.values()):
        return f"node {target} left the ring already (decommissioned): there is nothing to remove"
    if survivors < replicas:
        return (
            f"the ring would keep {survivors} normal live node(s), fewer than the R={replicas} "
            "copies of its share need: add a node first (statestore node --join), or give the "
            f"dead node's place to a new one (statestore node --replace {target})"
        )
    if others_down and not force:
        down = ", ".join(sorted(others_down))
        return (
            f"member(s) {down} are down too: a commit that {target} and they alone "
            f"acknowledged is on no live node, so removing {target} cannot re-make it, and "
            "only they keep it: bring them back first (the removal then copies from them), "
            "or pass --force to remove it anyway (removing them later would lose such a "
            "commit for good)"
        )
    return None
