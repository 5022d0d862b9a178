"""Recovery planning (pure): which replica serves each chunk, and the shape of the transfer.

From the chain's chunks, the live holders of each, what is known of the links (throughput and
latency measured from recent transfers) and the restorer's limits, build one of SR3's three
shapes (docs/design.md, Recovery plans):

- **star**: the restorer pulls every chunk from its assigned source, ``fan_in`` at a time;
- **line**: the sources form a path; each hop streams what it receives plus its own chunks to
  the next, and the last hop streams to the restorer (one inbound stream);
- **tree**: the sources form a fan-in tree; each inner hop folds its children's rows with its
  own (a later put or delete of a key replaces the earlier one) so fewer bytes reach the root.

``choose`` predicts the time of each shape with the cost model below and takes the fastest;
:func:`sr3_rule` is SR3's fixed rule, kept to compare against. Nothing here does I/O.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from statestore.core.errors import InvalidRequest, NodeUnavailable

__all__ = [
    "PLANS",
    "SR3_CHUNK_LIMIT",
    "SR3_PATH_LIMIT",
    "ChunkTask",
    "CostModel",
    "Hop",
    "LinkStats",
    "Plan",
    "assign",
    "build",
    "check_plan",
    "choose",
    "folded_estimate",
    "learn_fold_ratio",
    "sr3_rule",
]

PLANS = ("star", "line", "tree", "auto")
SR3_CHUNK_LIMIT = 16 * 1024 * 1024
SR3_PATH_LIMIT = 128


@dataclass(frozen=True)
class ChunkTask:
    """One chunk to transfer: its place in the chain, checksum, size and live holders."""

    key: str
    pos: int  # index of its manifest in the chain (later wins when folding)
    version: int
    name: str
    checksum: int
    size: int
    raw_size: int
    rows: int
    holders: tuple[str, ...]
    lo: int = 0  # key-group range the chunk covers
    hi: int = 65535


@dataclass(frozen=True)
class LinkStats:
    throughput: float = 200e6  # bytes/s from that source
    latency: float = 0.002  # seconds per request


@dataclass(frozen=True)
class CostModel:
    """Rates of this deployment. Defaults were measured on the 2-core development machine
    (docs/benchmarks.md); nodes and clients replace the link figures with measured ones."""

    decode_rate: float = 80e6  # raw bytes/s the restorer decodes and folds
    fold_rate: float = 40e6  # raw bytes/s an inner tree hop decodes, folds and re-encodes
    relay_rate: float = 400e6  # bytes/s one hop can forward
    fold_ratio: float = 0.25  # share of a delta's bytes that are new keys (learned per store)
    startup: float = 0.003  # fixed cost of a streamed plan (hand-over of the plan)


@dataclass(frozen=True)
class Hop:
    """A node in a line or tree: its own chunks and the hops that stream into it."""

    address: str
    chunks: tuple[ChunkTask, ...]
    children: tuple[Hop, ...] = ()

    def all_chunks(self) -> list[ChunkTask]:
        out = list(self.chunks)
        for c in self.children:
            out += c.all_chunks()
        return out

    def depth(self) -> int:
        return 1 + max((c.depth() for c in self.children), default=0)


@dataclass(frozen=True)
class Plan:
    kind: str
    assignment: Mapping[str, str]  # chunk key -> source address
    tasks: tuple[ChunkTask, ...]
    root: Hop | None
    predicted: float
    bytes_in: int  # predicted bytes into the restorer
    reason: str
    predictions: Mapping[str, float] = field(default_factory=dict)
    sr3: str = ""
    # the factors ``predictions`` were scaled by (``build(calibration=...)``): what a finished
    # restore divides by to learn from the raw prediction, whatever was learned meanwhile
    calibration: Mapping[str, float] = field(default_factory=dict)

    def explain(self) -> str:
        lines = [
            f"plan: {self.kind}  ({self.reason})",
            f"chunks: {len(self.tasks)}  bytes: {sum(t.size for t in self.tasks)}  "
            f"predicted: {self.predicted:.3f}s  bytes into restorer: ~{self.bytes_in}",
            "predicted per plan: "
            + ", ".join(f"{k} {v:.3f}s" for k, v in sorted(self.predictions.items())),
            f"SR3's fixed rule would pick: {self.sr3}",
        ]
        per: dict[str, list[ChunkTask]] = {}
        for t in self.tasks:
            per.setdefault(self.assignment[t.key], []).append(t)
        for addr in sorted(per):
            ts = per[addr]
            lines.append(f"  source {addr}: {len(ts)} chunks, {sum(t.size for t in ts)} bytes")
        if self.root is not None:
            lines.append("graph (data flows up to the restorer):")
            lines += _draw(self.root, "  restorer <- ")
        return "\n".join(lines)


def _draw(hop: Hop, prefix: str) -> list[str]:
    out = [f"{prefix}{hop.address} ({len(hop.chunks)} own chunks)"]
    for child in hop.children:
        out += _draw(child, " " * (len(prefix) - 3) + "   <- ")
    return out


def assign(
    tasks: Sequence[ChunkTask],
    links: Mapping[str, LinkStats],
    load: Mapping[str, float] | None = None,
    replicas: int = 3,
    avoid: Collection[str] = (),
) -> dict[str, str]:
    """Pick a source for every chunk among its first ``replicas`` holders, biggest chunks
    first, each to the holder that would finish it soonest (its queued bytes over its
    throughput); a holder in ``avoid`` (a leaving member) only when it is the only one.
    Raises NodeUnavailable for a chunk with no live holder."""
    queued: dict[str, float] = dict(load or {})
    out: dict[str, str] = {}
    for t in sorted(tasks, key=lambda t: (-t.size, t.key)):
        if not t.holders:
            raise NodeUnavailable(f"chunk {t.key} has no live holder: wait for the ring to heal")
        choices = t.holders[:replicas]
        best = min(
            [h for h in choices if h not in avoid] or choices,
            key=lambda h: ((queued.get(h, 0.0) + t.size) / links.get(h, LinkStats()).throughput, h),
        )
        queued[best] = queued.get(best, 0.0) + t.size
        out[t.key] = best
    return out


def _by_source(
    tasks: Sequence[ChunkTask], assignment: Mapping[str, str]
) -> dict[str, list[ChunkTask]]:
    per: dict[str, list[ChunkTask]] = {}
    for t in tasks:
        per.setdefault(assignment[t.key], []).append(t)
    return per


def _line(per: Mapping[str, list[ChunkTask]], links: Mapping[str, LinkStats]) -> Hop:
    # The hop nearest the restorer (best link) is last; the rest in a stable order before it.
    order = sorted(per, key=lambda a: (links.get(a, LinkStats()).throughput, a))
    hop: Hop | None = None
    for addr in order:
        hop = Hop(addr, tuple(per[addr]), (hop,) if hop is not None else ())
    assert hop is not None
    return hop


def _tree(per: Mapping[str, list[ChunkTask]], fan_in: int) -> Hop:
    # Heaviest source at the root (its rows fold in last and least often); children in
    # breadth-first order, ``fan_in`` per inner hop.
    order = sorted(per, key=lambda a: (-sum(t.size for t in per[a]), a))

    def make(i: int) -> Hop:
        kids = [make(j) for j in range(fan_in * i + 1, fan_in * i + fan_in + 1) if j < len(order)]
        return Hop(order[i], tuple(per[order[i]]), tuple(kids))

    return make(0)


def _folded_bytes(tasks: Sequence[ChunkTask], model: CostModel) -> tuple[int, int]:
    """Estimated (compressed, raw) bytes after folding the whole chain: the base (the
    snapshot, or version 1) survives whole, each later delta adds ``fold_ratio`` of its
    bytes as new keys (the rest overwrites keys already there)."""
    if not tasks:
        return 0, 0
    base = min(t.pos for t in tasks)
    comp = raw = 0.0
    for t in tasks:
        share = 1.0 if t.pos == base else model.fold_ratio
        comp += share * t.size
        raw += share * t.raw_size
    return int(comp), int(raw)


def _predict(
    kind: str,
    tasks: Sequence[ChunkTask],
    assignment: Mapping[str, str],
    root: Hop | None,
    links: Mapping[str, LinkStats],
    ingress: float | None,
    fan_in: int,
    model: CostModel,
) -> tuple[float, int]:
    cap = ingress if ingress else math.inf
    per = _by_source(tasks, assignment)
    total = sum(t.size for t in tasks)
    raw = sum(t.raw_size for t in tasks)
    if not tasks:
        return 0.0, 0
    decode = raw / model.decode_rate
    if kind == "star":
        slowest = max(
            sum(t.size for t in ts) / links.get(a, LinkStats()).throughput for a, ts in per.items()
        )
        waves = math.ceil(len(tasks) / fan_in)
        lat = max(links.get(a, LinkStats()).latency for a in per)
        return max(total / cap, slowest, decode) + waves * lat, total
    assert root is not None
    hops = len(per)
    lat = sum(links.get(a, LinkStats()).latency for a in per)
    if kind == "line":
        rate = min([cap, model.relay_rate] + [links.get(a, LinkStats()).throughput for a in per])
        return max(total / rate, decode) + lat + model.startup * hops, total
    # tree: inner hops decode and fold their subtree (level by level, store-and-forward),
    # then the root's folded stream crosses the restorer's link.
    folded, folded_raw = _folded_bytes(tasks, model)
    levels: list[float] = []

    def walk(h: Hop, depth: int) -> None:
        if h.children:
            sub = h.all_chunks()
            cost = sum(t.raw_size for t in sub) / model.fold_rate
            cost += sum(t.size for t in sub) / model.relay_rate
            while len(levels) <= depth:
                levels.append(0.0)
            levels[depth] = max(levels[depth], cost)
        for c in h.children:
            walk(c, depth + 1)

    walk(root, 0)
    root_rate = min(cap, links.get(root.address, LinkStats()).throughput)
    t = sum(levels) + folded / root_rate + folded_raw / model.decode_rate
    return t + lat + model.startup * hops, folded


def folded_estimate(tasks: Sequence[ChunkTask], model: CostModel) -> int:
    return _folded_bytes(tasks, model)[0]


def learn_fold_ratio(tasks: Sequence[ChunkTask], folded_bytes: int) -> float | None:
    """The fold ratio a tree restore actually showed, for the next plan of the same store."""
    if not tasks:
        return None
    base = min(t.pos for t in tasks)
    base_bytes = sum(t.size for t in tasks if t.pos == base)
    delta_bytes = sum(t.size for t in tasks if t.pos != base)
    if delta_bytes <= 0:
        return None
    return min(1.0, max(0.0, (folded_bytes - base_bytes) / delta_bytes))


def check_plan(plan: object) -> str:
    """``plan`` if it names a plan; InvalidRequest listing the plans otherwise."""
    if not isinstance(plan, str) or plan not in PLANS:
        raise InvalidRequest(f"restore plan {plan!r} is not one of {', '.join(PLANS)}")
    return plan


def sr3_rule(tasks: Sequence[ChunkTask]) -> str:
    """SR3's fixed rule: star below 16 MB chunks, line for recovery paths longer than 128
    (here: chunks to move), tree otherwise."""
    if not tasks or max(t.size for t in tasks) < SR3_CHUNK_LIMIT:
        return "star"
    if len(tasks) > SR3_PATH_LIMIT:
        return "line"
    return "tree"


def build(
    kind: str,
    tasks: Sequence[ChunkTask],
    *,
    links: Mapping[str, LinkStats] | None = None,
    load: Mapping[str, float] | None = None,
    ingress: float | None = None,
    fan_in: int = 16,
    tree_fan_in: int = 2,
    replicas: int = 3,
    model: CostModel | None = None,
    calibration: Mapping[str, float] | None = None,
    avoid: Collection[str] = (),
    folds: bool = True,
) -> Plan:
    """Build the plan ``kind`` (``star``, ``line``, ``tree`` or ``auto``); ``avoid``: holders
    asked only for the chunks no other of the first ``replicas`` holds (:func:`assign`).
    Without ``folds`` no tree is built (``tree`` is planned as a line, ``auto`` chooses
    between star and line): a tree's folded rows cannot be checked by whoever receives them,
    so a restorer that cannot authenticate its hops does not ask for them.

    ``calibration`` scales each shape's predicted time by how far off its recent predictions
    were (actual / predicted, measured by the restorer), so auto learns this deployment.
    """
    check_plan(kind)
    if fan_in < 1 or tree_fan_in < 1:
        raise InvalidRequest("fan-in must be at least 1")
    links = links or {}
    model = model or CostModel()
    assignment = assign(tasks, links, load, replicas, avoid)
    per = _by_source(tasks, assignment)
    roots: dict[str, Hop | None] = {"star": None}
    if per:
        roots["line"] = _line(per, links)
        if folds:
            roots["tree"] = _tree(per, tree_fan_in)
    predictions: dict[str, tuple[float, int]] = {}
    for k, r in roots.items():
        t, b = _predict(k, tasks, assignment, r, links, ingress, fan_in, model)
        predictions[k] = (t * (calibration or {}).get(k, 1.0), b)
    sr3 = sr3_rule(tasks)
    if kind == "auto":
        chosen = choose({k: v[0] for k, v in predictions.items()})
        others = ", ".join(
            f"{k} {v[0]:.3f}s" for k, v in sorted(predictions.items()) if k != chosen
        )
        why = f"auto: predicted {predictions[chosen][0]:.3f}s vs {others or 'nothing else'}"
        if ingress:
            why += f"; ingress capped at {ingress / 1e6:.0f} MB/s"
    elif kind == "tree" and per and not folds:
        chosen = "line"
        why = "asked for tree (a line: the hops' folds cannot be checked here)"
    else:
        chosen = kind if kind in roots else "star"
        why = f"asked for {kind}" + ("" if chosen == kind else " (no sources: star)")
    time_, bytes_in = predictions[chosen]
    return Plan(
        chosen,
        assignment,
        tuple(tasks),
        roots[chosen],
        time_,
        bytes_in,
        why,
        {k: v[0] for k, v in predictions.items()},
        sr3,
        dict(calibration or {}),
    )


def choose(predicted: Mapping[str, float]) -> str:
    """The fastest predicted shape; ties go to the simpler one (star, then line, then tree)."""
    rank = {"star": 0, "line": 1, "tree": 2}
    return min(predicted, key=lambda k: (round(predicted[k], 6), rank.get(k, 9)))
