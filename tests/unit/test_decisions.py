"""The pure decisions of the async loops, tested from data files (like etcd raft's testdata).

Each file under ``tests/testdata/{reroute,repair,retention}/`` holds cases. A case is::

    # comments (lines starting with '#') and blank lines between cases are kept
    case <a name>
    <input lines>
    ----
    <expected output lines, up to the next blank line>

The test parses the input, runs the pure function and compares its rendered output with the
expected block. To regenerate every expected block after an intended change, run
``STATESTORE_REWRITE=1 .venv/bin/python -m pytest tests/unit/test_decisions.py`` and review the
diff: the input lines and comments are kept, only the blocks after ``----`` are rewritten.

**reroute** (core/reroute.reroute: stream events in, chunks still missing out). Input::

    task <key> holders=<n1,n2,..> [source=<n>|-] [groups=<lo>-<hi>]
                                      the plan's chunks; source defaults to the first holder,
                                      groups to 0-65535
    chunk <key> [from=<n>] [corrupt]  a C frame (or batched read) that checked out, or not
    folded <lo>-<hi>                  an F frame covering those key groups
    covers <key> ...                  a D frame listing the chunks folded in below
    error <hop>                       an E frame naming a failed hop
    end                               the stream ended cleanly
    cut <hop> [timeout]               the stream from <hop> broke (or went quiet)

Output: ``done <keys>`` and ``failed <hops>`` (sorted, omitted when empty), then one
``fetch <key>: <holders in order> [| failed <holders tried last>]`` per missing chunk, in
plan order.

**repair** (core/repair.decide: holdings and ring in, pushes and drops out). Input::

    me <address>
    live <addresses>
    epoch moved|steady                whether the epoch moved since the last pass
    planned                           (optional) within the grace period after a move
    hold <item> owners=<a,b> [previous=<a,b,c>] [pending=<d>]
                                      an item held here: c:<chunk key> or
                                      m:<store>/<version>/<kind>; owners now, replicas before,
                                      pending owners (a node joining or leaving)
    answer <target> has|lacks <item> ... | *
                                      what a target said (* = every item it owns); an owner
                                      with no answer line did not answer
    push-fails <target> <item>        a push that was tried and failed

Output: ``push <target> <item>``, ``skip <target> <item>`` (left to its designated source),
``drop <item>``, ``pending <item>`` lines, then ``outstanding <n>``.

**retention** (core/retention.plan_compaction: chain and floors in, snapshots out). Input::

    every <snapshot_every>
    retain <retain>
    floor <the floor already applied>
    head <version>
    delta <v>[-<v2>] e<epoch> [base=e<b>]   deltas held (a range, all at that epoch; a
                                      version may be held at several epochs); ``base``: the
                                      epoch of the version below each was built on
    snapshot <v>[-<v2>] e<epoch> [base=e<b>]   snapshots held
    rebase <share>                    (optional) rebase_at; 0 (the default): every N deltas
                                      ``bytes=<n>`` on a delta or snapshot line: each one's size

Output: ``snapshot <version> e<epoch> (from <kind>)`` per snapshot to write, in order, then
``floor <n>`` or ``floor unchanged``.

**handover** (core/handover.py and core/quorum.check_write_sets: a move's machine, what to
pull and push, the write rule while nodes move). Input::

    kind join|leave                   start a move
    round listed=<n> missing=<n> [failed= unanswered= unseen= bytes=]
                                      one round's result, fed to the machine
    switch                            the new state is gossiped
    fail <reason>                     the move is given up
    list <source> <item> ...          what a source listed for a joining node
    held <item> ...                   what the joining node holds already
    me <node>                         the leaving node
    targets <item> <a,b,c>            an item's future owners
    answer <target> has|lacks <item> ... | *
    write current=<a,b> future=<a,c> acked=<a,c> w=<W>

Output: per machine event ``round <n>: <phase> copied=<n> bytes=<n>``, ``switched``,
``failed: <reason>`` or ``refused: <why>``; then ``pull <item> from <sources in order>``,
``push <target> <item>`` and ``unanswered <n>``; per write ``write ok`` or
``write refused: <what reached how many>``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statestore.core.errors import QuorumNotReached, VersionNotFound
from statestore.core.handover import Handover, RoundResult, pull_plan, push_plan
from statestore.core.ids import StoreId
from statestore.core.manifest import ChunkRef, Manifest, resolve_chain
from statestore.core.plan import ChunkTask
from statestore.core.quorum import check_write_sets
from statestore.core.repair import Holding, decide, pick_source
from statestore.core.reroute import (
    ChunkArrived,
    Covered,
    FoldedArrived,
    HopFailed,
    StreamCut,
    StreamEnded,
    StreamEvent,
    reroute,
)
from statestore.core.retention import (
    Thinning,
    plan_compaction,
    retention_floor,
    rung_spacing,
)

TESTDATA = Path(__file__).parents[1] / "testdata"
REWRITE = os.environ.get("STATESTORE_REWRITE") == "1"
SID = StoreId("q", 0, 0)


# ---------------------------------------------------------------------------- the file format


@dataclass
class Case:
    name: str
    line: int  # 1-based line of "case"
    input: list[str]
    expected: list[str]
    out_span: tuple[int, int] = (0, 0)  # 0-based [start, end) of the expected lines


@dataclass
class DataFile:
    path: Path
    lines: list[str]
    cases: list[Case] = field(default_factory=list)


def parse(path: Path) -> DataFile:
    """Split a data file into cases (see the module docstring)."""
    lines = path.read_text().splitlines()
    df = DataFile(path, lines)
    i = 0
    while i < len(lines):
        text = lines[i].strip()
        if not text or text.startswith("#"):
            i += 1
            continue
        if not text.startswith("case "):
            raise ValueError(f"{path}:{i + 1}: expected 'case <name>', got {text!r}")
        case = Case(text[5:].strip(), i + 1, [], [])
        i += 1
        while i < len(lines) and lines[i].strip() != "----":
            if lines[i].strip() and not lines[i].strip().startswith("#"):
                case.input.append(lines[i].strip())
            i += 1
        if i == len(lines):
            raise ValueError(f"{path}:{case.line}: case {case.name!r} has no '----'")
        i += 1
        start = i
        while i < len(lines) and lines[i].strip():
            case.expected.append(lines[i].strip())
            i += 1
        case.out_span = (start, i)
        df.cases.append(case)
    return df


def rewrite(df: DataFile, outputs: dict[int, list[str]]) -> None:
    """Write ``outputs`` (by case index) in place of the expected blocks."""
    lines = list(df.lines)
    for idx in sorted(outputs, reverse=True):
        start, end = df.cases[idx].out_span
        lines[start:end] = outputs[idx]
    df.path.write_text("\n".join(lines) + "\n")


def run_file(path: Path, render: Callable[[list[str]], list[str]]) -> None:
    df = parse(path)
    assert df.cases, f"{path} holds no case"
    outputs = {i: render(c.input) for i, c in enumerate(df.cases)}
    if REWRITE:
        rewrite(df, outputs)
        return
    for i, case in enumerate(df.cases):
        got = outputs[i]
        assert got == case.expected, (
            f"{path.name}:{case.line} case {case.name!r}\n"
            + "input:\n  "
            + "\n  ".join(case.input)
            + "\nexpected:\n  "
            + "\n  ".join(case.expected)
            + "\ngot:\n  "
            + "\n  ".join(got)
        )


def _kv(words: list[str]) -> tuple[list[str], dict[str, str]]:
    plain = [w for w in words if "=" not in w]
    return plain, dict(w.split("=", 1) for w in words if "=" in w)


def _range(spec: str) -> range:
    lo, _, hi = spec.partition("-")
    return range(int(lo), int(hi or lo) + 1)


def _epoch(word: str) -> int:
    if not re.fullmatch(r"e\d+", word):
        raise ValueError(f"expected an epoch like e2, got {word!r}")
    return int(word[1:])


# ---------------------------------------------------------------------------------- reroute


def render_reroute(lines: list[str]) -> list[str]:
    tasks: list[ChunkTask] = []
    assignment: dict[str, str] = {}
    events: list[StreamEvent] = []
    for line in lines:
        op, *rest = line.split()
        args, kv = _kv(rest)
        if op == "task":
            holders = tuple(h for h in kv.get("holders", "").split(",") if h)
            groups = _range(kv.get("groups", "0-65535"))
            key = args[0]
            tasks.append(
                ChunkTask(key, 0, 1, key, 0, 1, 1, 1, holders, groups.start, groups.stop - 1)
            )
            source = kv.get("source", holders[0] if holders else "-")
            if source != "-":
                assignment[key] = source
        elif op == "chunk":
            events.append(ChunkArrived(args[0], kv.get("from", ""), "corrupt" not in args))
        elif op == "folded":
            g = _range(args[0])
            events.append(FoldedArrived(g.start, g.stop - 1))
        elif op == "covers":
            events.append(Covered(tuple(args)))
        elif op == "error":
            events.append(HopFailed(args[0]))
        elif op == "end":
            events.append(StreamEnded())
        elif op == "cut":
            events.append(StreamCut(args[0], "timeout" in args[1:]))
        else:
            raise ValueError(f"unknown reroute input {line!r}")
    out = reroute(tasks, assignment, events)
    rendered = []
    if out.done:
        rendered.append("done " + " ".join(sorted(out.done)))
    if out.failed:
        rendered.append("failed " + " ".join(sorted(out.failed)))
    for r in out.missing:
        sound = [a for a in r.order if a not in out.failed]
        last = [a for a in r.order if a in out.failed]
        text = f"fetch {r.key}: " + (" ".join(sound) or "(no sound holder)")
        if last:
            text += " | failed " + " ".join(last)
        rendered.append(text)
    return rendered


# ----------------------------------------------------------------------------------- repair


def _placement_key(item: str) -> str:
    kind, _, rest = item.partition(":")
    if kind == "c":
        return rest
    if kind == "m":
        return rest.rsplit("/", 2)[0]
    raise ValueError(f"an item is c:<key> or m:<store>/<version>/<kind>, not {item!r}")


def render_repair(lines: list[str]) -> list[str]:
    me = ""
    live: list[str] = []
    moved: bool | None = None
    planned = False
    holdings: list[Holding] = []
    raw_answers: list[tuple[str, bool, list[str]]] = []
    failed: list[tuple[str, str]] = []
    for line in lines:
        op, *rest = line.split()
        args, kv = _kv(rest)
        if op == "me":
            me = args[0]
        elif op == "live":
            live = args
        elif op == "epoch":
            if args != ["moved"] and args != ["steady"]:
                raise ValueError(f"epoch moved|steady, not {line!r}")
            moved = args == ["moved"]
        elif op == "planned":
            planned = True
        elif op == "hold":
            owners = tuple(a for a in kv.get("owners", "").split(",") if a)
            previous = tuple(a for a in kv.get("previous", "").split(",") if a)
            pending = tuple(a for a in kv.get("pending", "").split(",") if a)
            item = args[0]
            holdings.append(Holding(item, _placement_key(item), owners, previous, pending))
        elif op == "answer":
            target, verb, *items = args
            if verb not in ("has", "lacks"):
                raise ValueError(f"answer <target> has|lacks ..., not {line!r}")
            raw_answers.append((target, verb == "has", items))
        elif op == "push-fails":
            failed.append((args[0], args[1]))
        else:
            raise ValueError(f"unknown repair input {line!r}")
    if not me or moved is None:
        raise ValueError("a repair case needs 'me' and 'epoch'")
    answers: dict[tuple[str, str], bool] = {}
    for target, has, items in raw_answers:
        asked = [h.item for h in holdings if target in h.owners]
        for item in asked if items == ["*"] else items:
            answers[(target, item)] = has
    d = decide(me, holdings, live, answers, epoch_moved=moved, planned=planned, failed=failed)
    out = [f"push {p.target} {p.item}" for p in d.pushes]
    out += [f"skip {p.target} {p.item}" for p in d.skipped]
    out += [f"drop {i}" for i in d.drops]
    out += [f"pending {i}" for i in d.pending]
    out.append(f"outstanding {d.outstanding}")
    return out


# -------------------------------------------------------------------------------- retention


def _manifest(
    version: int, kind: str, epoch: int, base: int | None = None, size: int = 0
) -> Manifest:
    chunks = (ChunkRef("c", 0, 0, size, size, 1, 0),) if size else ()
    return Manifest(SID, version, kind, epoch, 1, chunks, {}, base)


def render_retention(lines: list[str]) -> list[str]:
    conf: dict[str, float] = {}
    deltas: dict[int, list[Manifest]] = {}
    snaps: dict[int, list[Manifest]] = {}
    for line in lines:
        op, *args = line.split()
        if op in ("every", "retain", "floor", "head", "rebase"):
            conf[op] = float(args[0])
        elif op in ("delta", "snapshot"):
            into = deltas if op == "delta" else snaps
            plain, kv = _kv(args)
            base = _epoch(kv["base"]) if "base" in kv else None
            size = int(kv.get("bytes", 0))
            for v in _range(plain[0]):
                into.setdefault(v, []).append(_manifest(v, op, _epoch(plain[1]), base, size))
        else:
            raise ValueError(f"unknown retention input {line!r}")
    todo = plan_compaction(
        SID,
        int(conf["head"]),
        deltas,
        snaps,
        snapshot_every=int(conf["every"]),
        retain=int(conf["retain"]),
        floor=int(conf.get("floor", 0)),
        rebase_at=conf.get("rebase", 0.0),
    )
    out = [f"snapshot {m.version} e{m.epoch} (from {m.kind})" for m in todo.snapshots]
    out.append("floor unchanged" if todo.floor is None else f"floor {todo.floor}")
    return out


# --------------------------------------------------------------------------------- handover


def _names(text: str) -> list[str]:
    return [a for a in text.split(",") if a]


def render_handover(lines: list[str]) -> list[str]:
    out: list[str] = []
    machine: Handover | None = None
    listings: dict[str, list[str]] = {}
    held: set[str] = set()
    me = ""
    targets: dict[str, list[str]] = {}
    raw_answers: list[tuple[str, bool, list[str]]] = []
    for line in lines:
        op, *rest = line.split()
        args, kv = _kv(rest)
        if op == "kind":
            machine = Handover(args[0])
        elif op in ("round", "switch", "fail"):
            if machine is None:
                raise ValueError(f"{line!r} before 'kind'")
            try:
                if op == "round":
                    machine = machine.after_round(RoundResult(**{k: int(v) for k, v in kv.items()}))
                    out.append(
                        f"round {machine.rounds}: {machine.phase} copied={machine.copied} "
                        f"bytes={machine.bytes}"
                    )
                elif op == "switch":
                    machine = machine.switch()
                    out.append(str(machine.phase))
                else:
                    machine = machine.fail(" ".join(rest))
                    out.append(f"{machine.phase}: {machine.reason}")
            except ValueError as exc:
                out.append(f"refused: {exc}")
        elif op == "list":
            listings[args[0]] = args[1:]
        elif op == "held":
            held |= set(args)
        elif op == "me":
            me = args[0]
        elif op == "targets":
            targets[args[0]] = _names(args[1]) if len(args) > 1 else []
        elif op == "answer":
            target, verb, *items = args
            raw_answers.append((target, verb == "has", items))
        elif op == "write":
            try:
                check_write_sets(
                    "write",
                    set(_names(kv["acked"])),
                    _names(kv["current"]),
                    _names(kv["future"]),
                    int(kv["w"]),
                    [],
                    _names(kv["homes"]) if "homes" in kv else (),
                )
                out.append("write ok")
            except QuorumNotReached as exc:
                out.append("write refused: " + str(exc).split(" (W)")[0])
        else:
            raise ValueError(f"unknown handover input {line!r}")
    if listings:
        out += [f"pull {p.item} from {','.join(p.sources)}" for p in pull_plan(listings, held)]
    if targets:
        answers: dict[tuple[str, str], bool] = {}
        for target, has, items in raw_answers:
            asked = [i for i, ts in targets.items() if target in ts]
            for item in asked if items == ["*"] else items:
                answers[(target, item)] = has
        pushes, unanswered = push_plan(me, targets, answers)
        out += [f"push {p.target} {p.item}" for p in pushes]
        out.append(f"unanswered {unanswered}")
    return out


# ------------------------------------------------------------------------------------ tests

RENDER: dict[str, Callable[[list[str]], list[str]]] = {
    "reroute": render_reroute,
    "repair": render_repair,
    "retention": render_retention,
    "handover": render_handover,
}
FILES = sorted((kind, p) for kind in RENDER for p in (TESTDATA / kind).glob("*.txt") if p.is_file())


@pytest.mark.parametrize(("kind", "path"), FILES, ids=[f"{k}/{p.name}" for k, p in FILES])
def test_data_file(kind: str, path: Path) -> None:
    run_file(path, RENDER[kind])


def test_every_decision_has_data_files() -> None:
    for kind in RENDER:
        assert list((TESTDATA / kind).glob("*.txt")), f"no data files for {kind}"


def test_a_wrong_expectation_fails(tmp_path: Path) -> None:
    """The harness compares: a case whose expected block is wrong fails, and a rewrite
    fixes exactly that block and keeps the rest of the file."""
    path = tmp_path / "x.txt"
    path.write_text(
        "# a comment\ncase one\nhead 3\nevery 9\nretain 9\n----\nfloor 7\n\n"
        "case two\nhead 3\nevery 9\nretain 9\ndelta 1-3 e1\n----\nfloor unchanged\n"
    )
    with pytest.raises(AssertionError, match="case 'one'"):
        run_file(path, render_retention)
    df = parse(path)
    rewrite(df, {0: render_retention(df.cases[0].input)})
    assert path.read_text().splitlines()[6] == "floor unchanged"
    assert path.read_text().startswith("# a comment\ncase one\n")
    run_file(path, render_retention)


# ---------------------------------------------------------------- properties against oracles

NODES = ["n1", "n2", "n3", "n4", "n5"]


@settings(max_examples=300, deadline=None)
@given(
    head=st.integers(1, 40),
    every=st.integers(1, 8),
    retain=st.integers(1, 12),
    floor=st.integers(0, 45) | st.just(0),
    epochs=st.lists(st.integers(1, 3), min_size=40, max_size=40).map(sorted),
    snap_at=st.dictionaries(st.integers(1, 40), st.integers(1, 3), max_size=8),
    gone_below=st.integers(0, 40) | st.just(0),
    rebase=st.sampled_from([0.0, 0.5, 2.0]),
    sizes=st.lists(st.integers(1, 100), min_size=40, max_size=40),
)
def test_retention_keeps_the_last_versions_restorable(
    head: int,
    every: int,
    retain: int,
    floor: int,
    epochs: list[int],
    snap_at: dict[int, int],
    gone_below: int,
    rebase: float,
    sizes: list[int],
) -> None:
    """Oracle: apply the decision (write the snapshots, drop everything below the floor) and
    every one of the last ``retain`` versions that could be restored before still can.
    Epochs rise with versions, as a writer that takes over re-commits from some version on;
    deltas and snapshots weigh at random (``rebase``: core/retention.needs_snapshot)."""
    deltas = {
        v: _manifest(v, "delta", epochs[v - 1], size=sizes[v - 1])
        for v in range(gone_below + 1, head + 1)
    }
    snaps = {v: _manifest(v, "snapshot", e, size=100) for v, e in snap_at.items() if v <= head}
    todo = plan_compaction(
        SID,
        head,
        deltas,
        snaps,
        snapshot_every=every,
        retain=retain,
        floor=floor,
        rebase_at=rebase,
    )

    def restorable(d: dict[int, Manifest], s: dict[int, Manifest]) -> set[int]:
        ok = set()
        for v in range(max(1, head - retain + 1), head + 1):
            try:
                resolve_chain(SID, v, d, s)
            except VersionNotFound:
                continue
            ok.add(v)
        return ok

    before = restorable(deltas, snaps)
    after_snaps = dict(snaps)
    for m in todo.snapshots:
        after_snaps[m.version] = _manifest(m.version, "snapshot", m.epoch)
    if todo.floor is not None:
        assert todo.floor > floor
        assert todo.floor <= max(1, head - retain + 1)
        deltas = {v: m for v, m in deltas.items() if v >= todo.floor}
        after_snaps = {v: m for v, m in after_snaps.items() if v >= todo.floor}
    assert before <= restorable(deltas, after_snaps)
    if todo.snapshots and todo.snapshots[0].version == head:
        # a head snapshot leaves the head's chain without deltas
        assert [m.kind for m in resolve_chain(SID, head, deltas, after_snaps)] == ["snapshot"]


def test_retention_floor_ignores_a_stale_snapshot() -> None:
    """A snapshot older in epoch than its version's re-committed delta is no floor."""
    deltas = {v: _manifest(v, "delta", 2 if v == 5 else 1) for v in range(1, 11)}
    snaps = {5: _manifest(5, "snapshot", 1), 3: _manifest(3, "snapshot", 1)}
    assert retention_floor(10, snaps, 4, deltas) == 3
    assert retention_floor(10, snaps, 4) == 5  # without the deltas nothing says it is stale


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    n_items=st.integers(1, 6),
    moved=st.booleans(),
    planned=st.booleans(),
)
def test_repair_drops_only_what_every_owner_confirmed(
    data: st.DataObject, n_items: int, moved: bool, planned: bool
) -> None:
    """Oracle: an item goes only if this node does not own it (nor will: a pending owner
    keeps its copy), the epoch held, and every
    owner said it holds the item or took a push that did not fail; a push goes only to an
    owner that said it lacks the item."""
    me = "n1"
    live = data.draw(st.sets(st.sampled_from(NODES)))
    holdings = []
    answers: dict[tuple[str, str], bool] = {}
    for i in range(n_items):
        owners = tuple(data.draw(st.lists(st.sampled_from(NODES), max_size=3, unique=True)))
        previous = tuple(data.draw(st.lists(st.sampled_from(NODES), max_size=3, unique=True)))
        pending = tuple(data.draw(st.lists(st.sampled_from(NODES), max_size=1)))
        item = f"c:s/1/k{i}"
        holdings.append(Holding(item, item[2:], owners, previous, pending))
        for o in owners:
            said = data.draw(st.sampled_from([True, False, None]))
            if said is not None:
                answers[(o, item)] = said
    failed = {
        (o, h.item)
        for h in holdings
        for o in h.owners
        if answers.get((o, h.item)) is False and data.draw(st.booleans())
    }
    d = decide(me, holdings, live, answers, epoch_moved=moved, planned=planned, failed=failed)
    pushed = {(p.target, p.item) for p in d.pushes}
    for p in d.pushes + d.skipped:
        assert answers[(p.target, p.item)] is False and p.target != me
    assert not pushed & {(p.target, p.item) for p in d.skipped}
    for h in holdings:
        confirmed = all(
            o == me
            or answers.get((o, h.item)) is True
            or ((o, h.item) in pushed and (o, h.item) not in failed)
            for o in h.owners
        )
        held_for_others = bool(h.owners) and me not in h.owners and me not in h.pending
        should_drop = held_for_others and not moved and confirmed
        assert (h.item in d.drops) == should_drop
        assert (h.item in d.pending) == (held_for_others and not should_drop)
        for o in h.owners:
            if answers.get((o, h.item)) is False and o != me:
                # lacking copies are pushed, unless a planned pass leaves them to the source
                holders = [a for a in h.previous if a in live]
                mine = me not in holders or pick_source(h.key, holders) == me
                assert ((o, h.item) in pushed) == (not planned or mine)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n_tasks=st.integers(1, 6))
def test_reroute_partitions_the_plan(data: st.DataObject, n_tasks: int) -> None:
    """Every chunk is either done or fetched, never both; the order to fetch it holds its
    holders (and planned source), each once, with the failed hops last; a chunk that only
    folded frames of a cut stream carried is done only if all its groups arrived."""
    tasks: list[ChunkTask] = []
    assignment: dict[str, str] = {}
    for i in range(n_tasks):
        holders = tuple(data.draw(st.lists(st.sampled_from(NODES), max_size=4, unique=True)))
        lo = data.draw(st.integers(0, 9))
        hi = data.draw(st.integers(lo, 9))
        tasks.append(ChunkTask(f"k{i}", 0, 1, f"k{i}", 0, 1, 1, 1, holders, lo, hi))
        planned: bool = data.draw(st.booleans())
        if holders and planned:
            assignment[f"k{i}"] = data.draw(st.sampled_from(NODES))
    keys = [t.key for t in tasks] + ["stray"]
    event = st.one_of(
        st.builds(ChunkArrived, st.sampled_from(keys), st.sampled_from(NODES), st.booleans()),
        st.builds(
            lambda a, b: FoldedArrived(min(a, b), max(a, b)), st.integers(0, 9), st.integers(0, 9)
        ),
        st.builds(lambda ks: Covered(tuple(ks)), st.lists(st.sampled_from(keys), max_size=3)),
        st.builds(HopFailed, st.sampled_from(NODES)),
        st.just(StreamEnded()),
        st.builds(StreamCut, st.sampled_from(NODES), st.booleans()),
    )
    events = data.draw(st.lists(event, max_size=12))
    out = reroute(tasks, assignment, events)
    missing = {r.key for r in out.missing}
    assert missing | out.done == {t.key for t in tasks}
    assert not missing & out.done
    clean = any(isinstance(e, StreamEnded) for e in events)
    groups = {g for e in events if isinstance(e, FoldedArrived) for g in range(e.lo, e.hi + 1)}
    covered = {k for e in events if isinstance(e, Covered) for k in e.keys}
    intact = {e.key for e in events if isinstance(e, ChunkArrived) and e.intact}
    for t in tasks:
        via_fold = t.key in covered and (clean or set(range(t.lo, t.hi + 1)) <= groups)
        assert (t.key in out.done) == (t.key in intact or via_fold)
    for r in out.missing:
        t = next(t for t in tasks if t.key == r.key)
        assert len(set(r.order)) == len(r.order)
        src = assignment.get(t.key)
        expected = set(t.holders) | ({src} if src and src not in out.failed else set())
        assert set(r.order) == expected
        flags = [a in out.failed for a in r.order]
        assert flags == sorted(flags)  # sound holders first, failed hops last


@settings(max_examples=80, deadline=None)
@given(
    every=st.integers(1, 6),
    thin=st.integers(2, 25),
    retain=st.integers(3, 40),
    steps=st.lists(st.integers(1, 8), min_size=50, max_size=50),
    fenced=st.lists(st.booleans(), min_size=50, max_size=50),
    whole=st.sets(st.integers(1, 400), max_size=12),
    hidden=st.sets(st.integers(1, 400), max_size=6),
    lagging=st.lists(st.booleans(), min_size=50, max_size=50),
)
def test_thinning_keeps_every_retained_version_and_few_bases(
    every: int,
    thin: int,
    retain: int,
    steps: list[int],
    fenced: list[bool],
    whole: set[int],
    hidden: set[int],
    lagging: list[bool],
) -> None:
    """A store's life under thinning (core/retention.Thinning): commits arrive ``steps`` at
    a time, a compaction pass after each batch (its snapshots sometimes fenced: not
    written), and its floor and thinning line are applied as the nodes apply them. After
    every pass, every one of the last ``retain`` versions still resolves; the store holds at
    most the floor's base, the newest and a rung per ``thin`` versions; and the floor keeps
    up with retention, within a rung (the deltas held stay bounded). The versions in
    ``whole`` are committed as snapshots with no delta (a writer's whole state, as Spark's
    provider sends on forceSnapshotOnCommit or loadEmpty): no line drops one of them, and
    none holds the lines above it down. Where ``lagging`` says so, the pass runs on a
    replica that lacks the snapshots of the whole versions in ``hidden`` committed in the
    last 8 versions (repair has not brought them yet) while the line it draws goes to the
    replicas that hold them."""
    deltas: dict[int, Manifest] = {}
    snaps: dict[int, Manifest] = {}
    floor, line, head = 0, Thinning(0, thin), 0
    for step, skip, lag in zip(steps, fenced, lagging, strict=True):
        for _ in range(step):
            head += 1
            if head in whole:
                snaps[head] = _manifest(head, "snapshot", 2)  # its version's only state
            else:
                deltas[head] = _manifest(head, "delta", 2)
        # a lagging replica lacks the hidden whole snapshots of the last 8 versions
        seen = {
            v: m for v, m in snaps.items() if not (lag and v in hidden & whole and head - v < 8)
        }
        todo = plan_compaction(
            SID,
            head,
            deltas,
            seen,
            snapshot_every=every,
            retain=retain,
            floor=floor,
            thin=line,
        )
        written = () if skip else todo.snapshots
        for m in written:
            snaps[m.version] = _manifest(m.version, "snapshot", m.epoch)
        if skip and todo.snapshots:
            continue  # fenced: the pass stops before its floor and line are sent
        if todo.floor is not None:
            floor = todo.floor
            deltas = {v: m for v, m in deltas.items() if v >= floor}
            snaps = {v: m for v, m in snaps.items() if v >= floor}
        if todo.thin is not None:
            # as a node takes it (NodeStore.apply_thinning): lines and floors never fall
            below, at = max(line.below, todo.thin.below), max(line.floor, todo.thin.floor)
            line = Thinning(below, todo.thin.every, 0, at)
            snaps = {v: m for v, m in snaps.items() if not line.drops(v, floor)}
        for v in range(max(1, head - retain + 1), head + 1):
            resolve_chain(SID, v, deltas, snaps)  # VersionNotFound fails the test
        above = [v for v in snaps if v > max(floor, 1)]  # version 1 holds no line down
        held_whole = whole & set(above)
        # besides rungs and whole versions, only the newest snapshot (what the latest
        # version's restore reads) and, below each whole version, the one that was newest
        # when it was committed (the line is drawn at a floor of the whole version)
        thick = [v for v in above if v % thin and v not in whole]
        assert len(thick) <= 1 + len(held_whole), (floor, sorted(snaps), line, sorted(whole))
        rungs = head // thin - max(floor, 1) // thin
        assert len(above) <= 1 + 2 * len(held_whole) + rungs, (
            floor,
            sorted(snaps),
            line,
        )
        if not lag:  # a lagging replica whose head chain runs through a whole snapshot it
            # lacks plans nothing until repair brings it: the next pass of another does
            assert head - floor <= retain + thin + every + 8, (floor, sorted(snaps))


def test_rung_spacing_is_the_option_or_half_the_retention() -> None:
    """core/retention.rung_spacing: --thin-snapshots, or half the retention when fewer, at
    least snapshot_every; 0 is off."""
    assert rung_spacing(0, 100, 10) == 0
    assert rung_spacing(50, 100, 10) == 50
    assert rung_spacing(50, 12, 2) == 6
    assert rung_spacing(50, 12, 10) == 10


def test_a_line_drops_nothing_at_or_below_the_floor_it_was_drawn_at() -> None:
    """A node whose own floor lags (it missed the gc that raised it) keeps the ring's floor
    snapshot, which may be no rung: the line carries the floor it was drawn at."""
    line = Thinning(below=90, every=50, chunks=90, floor=70)
    assert not line.drops(70, floor=0) and not line.drops_chunks(70, floor=0)
    assert line.drops(80, floor=0) and line.drops_chunks(80, floor=0)
    assert not line.drops(50, floor=0)  # below the line's floor: the floor's gc drops it
    assert not Thinning(90, 50, 60, 0).drops_chunks(80, floor=0)  # the chunks' line


def test_a_dead_branch_above_the_head_draws_no_line() -> None:
    """A snapshot above a newer writer's head is a dead branch's (the old writer went on to
    version 50 at epoch 1; the new one restored 40 and is at 45, epoch 2): the thinning line
    stays at or below the head, so the new writer's bases are not refused as thinned."""
    deltas = {v: [_manifest(v, "delta", 1)] for v in range(1, 51)}
    for v in range(41, 46):
        deltas[v] = [_manifest(v, "delta", 2, base=1 if v == 41 else 2), *deltas[v]]
    snaps = {v: [_manifest(v, "snapshot", 1)] for v in (20, 30, 50)}
    snaps[45] = [_manifest(45, "snapshot", 2, base=2)]
    todo = plan_compaction(
        SID, 45, deltas, snaps, snapshot_every=5, retain=100, floor=0, thin=Thinning(0, 10)
    )
    assert todo.thin is not None and todo.thin.below == 45, todo


def test_a_newer_writer_below_a_dead_branchs_line_folds_only_what_the_line_keeps() -> None:
    """An older writer went on alone to version 14 (epoch 1) and drew a line at 14 (rungs
    every 4); a newer one rewound to 4, committed 5 whole and 6-7 on it (epoch 2). Every node
    that took the line refuses a fold of 7 (a snapshot the line drops), so none is planned:
    the chain waits for 8, a rung. The build before planned 7 on every pass, each refused,
    and the line's second step behind it never ran (tests/ring/test_retention.py)."""
    deltas = {v: [_manifest(v, "delta", 1)] for v in range(1, 15)}
    for v in (6, 7, 8):
        deltas[v] = [_manifest(v, "delta", 2, base=2), *deltas[v]]
    snaps = {v: [_manifest(v, "snapshot", 1)] for v in (4, 8, 12, 14)}
    snaps[5] = [_manifest(5, "snapshot", 2, base=1)]
    line = Thinning(14, 4, 0, 1)
    for head, folded in ((7, []), (8, [8])):
        todo = plan_compaction(
            SID, head, deltas, snaps, snapshot_every=2, retain=100, floor=0, thin=line
        )
        assert [m.version for m in todo.snapshots] == folded, (head, todo)
        assert not any(line.drops(m.version, 0) for m in todo.snapshots)


def test_a_first_version_committed_whole_holds_no_line_down() -> None:
    """A store whose version 1 was committed whole (the SDK's ``snapshot=True``; no delta:
    no line may drop it) thins the snapshots above it before the retention line reaches a
    rung: the line is drawn at floor 1 (version 1 has nothing below it), which keeps version
    1. On the build before the line stayed below version 1, and every snapshot folded above
    it stayed until the floor passed version 1 (~110 versions at the defaults: up to ten
    full copies)."""
    deltas = {v: _manifest(v, "delta", 1) for v in range(2, 41)}
    snaps = {v: _manifest(v, "snapshot", 1) for v in (1, 10, 20, 30, 40)}
    todo = plan_compaction(
        SID, 40, deltas, snaps, snapshot_every=10, retain=100, floor=0, thin=Thinning(0, 50)
    )
    assert todo.floor is None, todo  # nothing to drop below the oldest kept version
    assert todo.thin is not None and todo.thin.below == 40 and todo.thin.floor == 1, todo
    kept = {u: m for u, m in snaps.items() if not todo.thin.drops(u, 0)}
    assert sorted(kept) == [1, 40]
    for v in range(1, 41):
        resolve_chain(SID, v, deltas, kept)


def test_a_version_committed_whole_above_the_floor_holds_no_line_down() -> None:
    """Version 4 committed whole (no delta of it: no line may drop it) in a store of deltas:
    the line is drawn at floor 4, so the snapshots folded above it thin as usual, and the
    one below it (3, the newest when 4 was committed) stays until the floor passes 4. On
    the build before, the line stopped below 4 and kept 10, 20 and 30, a full copy each,
    until the floor passed 4."""
    deltas = {v: _manifest(v, "delta", 1) for v in range(1, 41) if v != 4}
    snaps = {v: _manifest(v, "snapshot", 1) for v in (3, 4, 10, 20, 30, 40)}
    todo = plan_compaction(
        SID, 40, deltas, snaps, snapshot_every=10, retain=100, floor=0, thin=Thinning(0, 50)
    )
    assert todo.thin is not None and todo.thin.below == 40 and todo.thin.floor == 4, todo
    kept = {u: m for u, m in snaps.items() if not todo.thin.drops(u, 0)}
    assert sorted(kept) == [3, 4, 40]
    for v in range(1, 41):
        resolve_chain(SID, v, deltas, kept)


def test_a_compactor_that_lacks_a_version_committed_whole_draws_no_line_through_it() -> None:
    """Versions 12 and 27 committed whole; the compactor lags (repair has not brought it 27
    yet, nor its absent delta: it holds no manifest of 27) but resolves its head through the
    snapshot 35 another node folded. Its line must not drop 27 on the nodes that hold it:
    a version it holds no delta of may be whole there. A hostile review found the build
    before drawing the line at floor 12, which dropped 27 and left 27-34 unrestorable."""
    deltas = {v: _manifest(v, "delta", 1) for v in range(1, 41) if v not in (12, 27)}
    held = {v: _manifest(v, "snapshot", 1) for v in (10, 12, 20, 27, 30, 35)}  # on B and C
    lagging = {v: m for v, m in held.items() if v != 27}  # the compactor, A
    todo = plan_compaction(
        SID, 40, deltas, lagging, snapshot_every=100, retain=100, floor=0, thin=Thinning(12, 50)
    )
    assert todo.thin is not None and todo.thin.floor >= 27, todo
    kept = {u: m for u, m in held.items() if not todo.thin.drops(u, 0)}
    assert 27 in kept, sorted(kept)
    for v in range(1, 41):
        resolve_chain(SID, v, deltas, kept)
