"""The history of a simulated run, and the checker that judges it (docs/reliability.md).

Every client operation is recorded with the logical time it began and ended (a counter, so
"A ended before B began" is exact): commit attempts with their version, epoch, delta digest and
the state the writer expects at that version, and their outcome (``ack``, ``refused`` for a
fencing or conflict refusal, ``failed`` when unavailable: unknown whether it took effect);
head reads and restores with what they returned. :func:`check` then holds the run to four
promises:

``lost`` / ``wrong-bytes``
    Every acknowledged commit restores byte for byte. A restore that began after the ack
    must return exactly the acknowledged state; at the end of a run (everything healed and
    repaired, so a quorum of every replica set is up) every acknowledged version within the
    retention window must restore. An ack is *superseded*, and so exempt, once a writer with a
    higher epoch acknowledged a version whose lineage does not hold it: a version at or below
    it (that writer took over from an older head and rewrote history from there, which is
    what fencing allows), or a later version built on another epoch's commit of its version
    (a writer that took over from a refused commit's manifest). A commit's lineage is the
    commit, then the commit of version - 1 at its base epoch (what the writer restored or
    last committed), and so on down; restoring a version returns the state on the head's
    lineage (core/manifest.py, "Lineage"), so the two rules agree.
``head-went-back``
    A store's head never goes back: a read that began after an ack of (epoch, version)
    returns a head at least as high (heads order by epoch, then version); StoreNotFound
    counts as no head at all.
``two-contents``
    No (store, version) is acknowledged with two contents at one epoch. (Across epochs, a
    higher epoch may replace a version: a lower epoch's ack after a higher epoch's commit
    was acknowledged is a ``fenced-ack``; two commits that overlap in time may be
    acknowledged in either order, as the lower one took effect first.)
``fenced-ack``
    A fenced writer never gets an acknowledgement: a commit that began after a higher epoch's
    commit to the same store was acknowledged must be refused (or fail).

Tentative commits (core/tentative.py) are recorded with the outcome ``tentative``, and the
verdicts the ring gave them at the end of the run (everything healed) in
``History.verdicts``. A confirmed one is held to every promise above as an acknowledgement
that ended when its verdict was read (so a fenced writer's tentative commit that was
confirmed is a ``fenced-ack``); besides:

``undecided``
    Every tentative commit ends confirmed or rolled back.
``rolled-back-kept``
    A rolled-back commit is not the store's final head, and its correction's replay point is
    below it.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

__all__ = ["CommitOp", "History", "ReadOp", "Violation", "check", "digest"]


def digest(puts: Mapping[bytes, bytes], deletes: list[bytes]) -> str:
    """A short, order-free fingerprint of a delta (what a version's content is)."""
    h = hashlib.blake2b(digest_size=8)
    for k in sorted(puts):
        h.update(b"p%d:%s%d:%s" % (len(k), k, len(puts[k]), puts[k]))
    for k in sorted(deletes):
        h.update(b"d%d:%s" % (len(k), k))
    return h.hexdigest()


@dataclass(frozen=True)
class CommitOp:
    writer: str
    store: str
    version: int
    epoch: int
    delta: str
    state: Mapping[bytes, bytes]
    start: int
    end: int
    outcome: str  # "ack" | "tentative" | "refused" | "failed"
    error: str = ""
    base_epoch: int | None = None  # the epoch of version - 1 the writer built on (None: v1)

    def line(self) -> str:
        tail = f" ({self.error})" if self.error else ""
        return (
            f"[{self.start}-{self.end}] commit {self.writer} {self.store} v{self.version} "
            f"e{self.epoch}{'' if self.base_epoch is None else f'/b{self.base_epoch}'} "
            f"{self.delta} -> {self.outcome}{tail}"
        )


@dataclass(frozen=True)
class ReadOp:
    kind: str  # "head" | "restore"
    store: str
    version: int | None  # asked for; None: the latest
    start: int
    end: int
    head: tuple[int, int] | None = None  # (epoch, version) returned
    state: Mapping[bytes, bytes] | None = None
    error: str = ""
    final: bool = False  # at the end of the run, everything healed

    def line(self) -> str:
        asked = "latest" if self.version is None else f"v{self.version}"
        got = self.error or (f"e{self.head[0]} v{self.head[1]}" if self.head else "")
        if self.state is not None and not self.error:
            got += f" {len(self.state)} keys"
        final = " final" if self.final else ""
        return f"[{self.start}-{self.end}] {self.kind}{final} {self.store} {asked} -> {got}"


@dataclass(frozen=True)
class Violation:
    kind: str
    store: str
    version: int
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.store} v{self.version}: {self.detail}"


@dataclass
class History:
    """The operations of one run, in the order they ended."""

    commits: list[CommitOp] = field(default_factory=list)
    reads: list[ReadOp] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    # (store, version, epoch) -> (verdict, replay_from) of tentative commits, read at the end
    verdicts: dict[tuple[str, int, int], tuple[str, int]] = field(default_factory=dict)
    verdict_time: int = 0
    _clock: int = 0

    def now(self) -> int:
        """A new logical time (call it when an operation begins and when it ends)."""
        self._clock += 1
        return self._clock

    def add_commit(self, op: CommitOp) -> None:
        self.commits.append(op)
        self.lines.append(op.line())

    def add_read(self, op: ReadOp) -> None:
        self.reads.append(op)
        self.lines.append(op.line())

    def acked(self) -> list[CommitOp]:
        return [c for c in self.commits if c.outcome == "ack"]

    def add_verdicts(self, verdicts: dict[tuple[str, int, int], tuple[str, int]]) -> None:
        self.verdict_time = self.now()
        self.verdicts.update(verdicts)
        for (store, version, epoch), (verdict, replay_from) in sorted(verdicts.items()):
            tail = f", replay from v{replay_from}" if verdict == "rolled_back" else ""
            self.lines.append(
                f"[{self.verdict_time}] verdict {store} v{version} e{epoch}: {verdict}{tail}"
            )

    def stable(self) -> list[CommitOp]:
        """Acknowledged commits and confirmed tentative ones, these as acknowledgements that
        ended when their verdict was read."""
        confirmed = [
            replace(c, outcome="ack", end=self.verdict_time)
            for c in self.commits
            if c.outcome == "tentative"
            and self.verdicts.get((c.store, c.version, c.epoch), ("",))[0] == "confirmed"
        ]
        return self.acked() + confirmed


def _lineage(c: CommitOp, attempts: Mapping[tuple[str, int, int], CommitOp]) -> dict[int, int]:
    """version -> epoch along ``c``'s line of descent, as far as the history says."""
    out = {c.version: c.epoch}
    cur: CommitOp | None = c
    while cur is not None and cur.base_epoch is not None and cur.version > 1:
        out[cur.version - 1] = cur.base_epoch
        cur = attempts.get((cur.store, cur.version - 1, cur.base_epoch))
    return out


def _superseded(
    c: CommitOp,
    acks: list[CommitOp],
    attempts: Mapping[tuple[str, int, int], CommitOp],
    before: int | None = None,
) -> bool:
    """A higher epoch acknowledged a version whose lineage does not hold ``c``: a version at
    or below ``c``, or a later one built on another epoch's ``c.version`` (if ``before``:
    began before that logical time)."""
    for d in acks:
        if d.store != c.store or d.epoch <= c.epoch or (before is not None and d.start >= before):
            continue
        if d.version <= c.version:
            return True
        line = _lineage(d, attempts)
        if c.version in line and line[c.version] != c.epoch:
            return True
    return False


def _adopted(
    store: str,
    version: int,
    above: int,
    state: Mapping[bytes, bytes],
    commits: Sequence[CommitOp],
    acks: list[CommitOp],
    before: int,
) -> bool:
    """Whether ``state`` is that of an attempt at ``version`` of an epoch above ``above``,
    begun before ``before``, that an acknowledged commit's lineage holds: a new writer's
    commit in flight during the read, which the history then built on (its writer may have
    been told it failed: statestore-sim seed 248256219581612). Fencing at work, as a higher
    epoch's acknowledged rewrite is (:func:`_superseded`)."""
    attempts = {(c.store, c.version, c.epoch): c for c in commits}
    for a in commits:
        if a.store != store or a.version != version or a.epoch <= above or a.start >= before:
            continue
        if dict(a.state) != dict(state):
            continue
        if any(d.store == store and _lineage(d, attempts).get(version) == a.epoch for d in acks):
            return True
    return False


def check(history: History) -> list[Violation]:
    """Every broken promise of the run, in a stable order (empty: the run was correct)."""
    acks = history.stable()
    attempts = {(c.store, c.version, c.epoch): c for c in history.commits}
    out: list[Violation] = _tentative(history)
    by_version: dict[tuple[str, int], list[CommitOp]] = defaultdict(list)
    for c in acks:
        by_version[(c.store, c.version)].append(c)

    for (store, version), cs in sorted(by_version.items()):
        for a in cs:
            for b in cs:
                if a.delta == b.delta or a.epoch > b.epoch:
                    continue
                if a.epoch == b.epoch and a.start < b.start:
                    out.append(
                        Violation(
                            "two-contents",
                            store,
                            version,
                            f"epoch {a.epoch} acknowledged both {a.delta} and {b.delta}",
                        )
                    )

    for c in acks:
        fencer = next(
            (d for d in acks if d.store == c.store and d.epoch > c.epoch and d.end < c.start),
            None,
        )
        if fencer is not None:
            out.append(
                Violation(
                    "fenced-ack",
                    c.store,
                    c.version,
                    f"writer {c.writer} (epoch {c.epoch}) was acknowledged after epoch "
                    f"{fencer.epoch} committed v{fencer.version}",
                )
            )

    for r in history.reads:
        before = [c for c in acks if c.store == r.store and c.end < r.start]
        if r.version is None and before and (r.head is not None or r.error == "StoreNotFound"):
            top = max(before, key=lambda c: (c.epoch, c.version))
            seen = r.head or (0, 0)  # StoreNotFound: no version at all
            if seen < (top.epoch, top.version):
                out.append(
                    Violation(
                        "head-went-back",
                        r.store,
                        seen[1],
                        f"{r.kind} at [{r.start}] saw e{seen[0]} v{seen[1]} after "
                        f"e{top.epoch} v{top.version} was acknowledged",
                    )
                )
        asked = r.version if r.version is not None else (r.head[1] if r.head else None)
        if r.kind != "restore" or asked is None:
            continue
        known = [c for c in before if c.version == asked]
        if not known:
            continue
        want = max(known, key=lambda k: k.epoch)
        if _superseded(want, acks, attempts, before=r.end):
            continue
        if r.error:
            if r.final:
                out.append(Violation("lost", r.store, asked, f"final restore failed: {r.error}"))
        elif (
            r.state is not None
            and dict(r.state) != dict(want.state)
            and not _adopted(r.store, asked, want.epoch, r.state, history.commits, acks, r.end)
        ):
            out.append(
                Violation(
                    "wrong-bytes",
                    r.store,
                    asked,
                    f"restore at [{r.start}] differs from the state acknowledged at "
                    f"[{want.end}] (epoch {want.epoch}): {_diff(want.state, r.state)}",
                )
            )
    return out


def _tentative(history: History) -> list[Violation]:
    out = []
    finals = {r.store: r.head for r in history.reads if r.final and r.version is None}
    for c in history.commits:
        if c.outcome != "tentative":
            continue
        verdict = history.verdicts.get((c.store, c.version, c.epoch))
        if verdict is None:
            out.append(
                Violation(
                    "undecided",
                    c.store,
                    c.version,
                    f"tentative commit of epoch {c.epoch} at [{c.end}] was never confirmed "
                    "nor rolled back",
                )
            )
        elif verdict[0] == "rolled_back" and (
            finals.get(c.store) == (c.epoch, c.version) or verdict[1] >= c.version
        ):
            out.append(
                Violation(
                    "rolled-back-kept",
                    c.store,
                    c.version,
                    f"epoch {c.epoch}'s tentative commit was reported rolled back (replay "
                    f"from v{verdict[1]}) but is the final head, or replays from itself",
                )
            )
    return out


def _diff(want: Mapping[bytes, bytes], got: Mapping[bytes, bytes]) -> str:
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    changed = sorted(k for k in set(want) & set(got) if want[k] != got[k])
    return f"{len(missing)} keys missing, {len(extra)} extra, {len(changed)} changed" + (
        f" (first: {(missing + extra + changed)[0]!r})" if missing or extra or changed else ""
    )
