"""The simulator: seeded fault schedules over the real node code, and the history checker.

No timing assertions: the schedules run on simulated time (statestore/testing/clock.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from aiohttp import web

from statestore.core.errors import NodeUnavailable, RequestTimeout
from statestore.net.memory import LinkFaults, MemoryNetwork
from statestore.node.api import build_app
from statestore.node.daemon import Node
from statestore.testing.cli import derive, main
from statestore.testing.clock import run_simulated
from statestore.testing.disk import Disk
from statestore.testing.history import CommitOp, History, ReadOp, check
from statestore.testing.schedule import run_schedule

S = "sim/0/0/s"


def test_fifty_schedules_find_nothing() -> None:
    found = []
    for i in range(50):
        outcome = run_schedule(derive(7, i))
        assert outcome.commits > 0
        found += [f"seed {outcome.seed}: {v}" for v in outcome.violations]
    assert found == []


def test_a_seed_replays_exactly() -> None:
    seed = derive(3, 11)
    first, second = run_schedule(seed), run_schedule(seed)
    assert first.log == second.log
    assert first.violations == second.violations
    assert len(first.log) > 20


def test_a_seed_replays_exactly_in_another_process() -> None:
    """Nothing in a run may depend on the process: not string hashing (set order), not an
    unseeded generator (a repair pass's digest seed once came from ``random``, and a seed
    that had found a bug stopped finding it, or found it again, run by run)."""
    import os
    import subprocess
    import sys

    def replay(hash_seed: str) -> str:
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        args = [sys.executable, "-m", "statestore.testing.cli", "--replay", "263719285619475"]
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
        return done.stdout

    first = replay("1")
    assert first.count("\n") > 100
    assert [replay("2"), replay("3")] == [first, first]


def test_different_seeds_differ() -> None:
    assert run_schedule(derive(3, 1)).log != run_schedule(derive(3, 2)).log


def _liar(node: Node) -> web.Application:
    """A node that acknowledges manifests without storing them."""

    @web.middleware
    async def ack_without_storing(request: web.Request, handler: object) -> web.StreamResponse:
        if request.method == "PUT" and request.path.startswith("/v1/manifests/"):
            await request.read()
            return web.json_response({"stored": True}, status=201)
        return await handler(request)  # type: ignore[operator, no-any-return]

    app = build_app(node)
    app.middlewares.insert(0, ack_without_storing)
    return app


def test_the_checker_catches_a_ring_that_acknowledges_without_storing() -> None:
    outcome = run_schedule(derive(5, 0), app_factory=_liar)
    assert outcome.acks > 0
    assert "lost" in {v.kind for v in outcome.violations}


def _commit(version: int, epoch: int, delta: str, start: int, end: int, **kw: object) -> CommitOp:
    state = kw.pop("state", {b"k": delta.encode()})
    outcome = str(kw.pop("outcome", "ack"))
    return CommitOp("w", S, version, epoch, delta, state, start, end, outcome, **kw)  # type: ignore[arg-type]


def _restore(version: int, start: int, **kw: object) -> ReadOp:
    return ReadOp("restore", S, version, start, start + 1, **kw)  # type: ignore[arg-type]


def _head(start: int, epoch: int, version: int) -> ReadOp:
    return ReadOp("head", S, None, start, start + 1, (epoch, version))


def _refused(version: int, epoch: int, delta: str, start: int, end: int, **kw: object) -> CommitOp:
    return CommitOp(
        "z",
        S,
        version,
        epoch,
        delta,
        {b"k": delta.encode()},
        start,
        end,
        "refused",
        "StaleEpoch",
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("commits", "reads", "kinds"),
    [
        # the simulator's bug (docs/reliability.md, "Lineage"): w3's refused v1 (epoch 2) must
        # not shadow the acknowledged one (epoch 1) that epoch 3 built its v2 on
        (
            [_commit(1, 1, "a", 1, 2), _refused(1, 2, "b", 3, 4),
             _commit(2, 3, "c", 5, 6, base_epoch=1, state={b"k": b"a", b"c": b"c"})],
            [_restore(1, 7, head=(2, 1), state={b"k": b"b"}),
             _restore(2, 9, head=(3, 2), state={b"k": b"b", b"c": b"c"})],
            {"wrong-bytes"},
        ),
        # the same, restored right
        (
            [_commit(1, 1, "a", 1, 2), _refused(1, 2, "b", 3, 4),
             _commit(2, 3, "c", 5, 6, base_epoch=1, state={b"k": b"a", b"c": b"c"})],
            [_restore(1, 7, head=(1, 1), state={b"k": b"a"}, final=True),
             _restore(2, 9, head=(3, 2), state={b"k": b"a", b"c": b"c"}, final=True)],
            set(),
        ),
        # a writer that took over from a refused commit's manifest (its v2, epoch 2) and was
        # acknowledged: the acknowledged v2 of epoch 1 is off the head's lineage, superseded
        (
            [_commit(1, 1, "a", 1, 2), _commit(2, 1, "b", 3, 4, base_epoch=1),
             _refused(2, 2, "x", 5, 6, base_epoch=1),
             _commit(3, 3, "c", 7, 8, base_epoch=2, state={b"k": b"x", b"c": b"c"})],
            [_restore(2, 9, head=(2, 2), state={b"k": b"x"}, final=True)],
            set(),
        ),
    ],
)  # fmt: skip
def test_the_checker_follows_lineage(
    commits: list[CommitOp], reads: list[ReadOp], kinds: set[str]
) -> None:
    h = History(commits=commits, reads=reads)
    assert {v.kind for v in check(h)} == kinds


NO_DISK: dict[str, float] = {}
DISK = {"disk_faults": 0.15, "skew": 5.0}  # the 1,000-schedule run's options


@pytest.mark.parametrize(
    ("seed", "options"),
    [
        # wrong-bytes: a refused v2 (epoch 3) shadowed the acknowledged one
        (252360137555522, NO_DISK),
        (238242064682876, NO_DISK),  # wrong-bytes: epoch 3's v5 built on v4 of epoch 1
        (163285530910507, NO_DISK),  # lost: the retention window is the top version's
        (263719285619475, NO_DISK),  # head-went-back: an isolated node's view, one chain answer
        (228670791545873, NO_DISK),  # the same, found again on the code before the fix
        # head-went-back: v4, v5 acknowledged by two home replicas; a reader whose view called
        # one of them down read a quorum of owners (one a stand-in that never held the store)
        (197272725224341, {"tentative": 0.5}),
        # lost: a flipped bit in the chunk names of one replica's manifest of v2 (it still
        # decoded, and repair compares checksums only) left v2-v6 unreadable; the scrub now
        # checks that a manifest's chunk names and checksums agree (node/scrub.py)
        (265420417866632, DISK),
        # head-went-back after a wipe: the node restarted empty as a new member at the same
        # address, the store's owners moved with no hand-over, and a read quorum of the new
        # owners missed an acknowledged v2; it now takes the old member's place and streams
        # its share first (node/moves/startup.check_returning)
        (250014316491786, DISK),
        # a hang, not a violation: a joining node fetched two manifests below its floor every
        # round (a source with a lower floor listed them; a copy below the floor is not kept),
        # so no round was clean and none paused: the join looped without end, and simulated
        # time stood still; what lies below the floor now counts as held (node/moves/join.py)
        (87846624326268, DISK),
        # head-went-back: v7 acknowledged by one home replica and a stand-in, read from the
        # two other home replicas once the crashed one was back (run seed 372000)
        (21317839338017, DISK),
        # lost: a rotted manifest of a higher epoch copied over the good ones (run 372005)
        (240856282107648, DISK),
        # the checker: a read of a new writer's in-flight v4, later built on (run 372015)
        (248256219581612, DISK),
    ],
)  # fmt: skip
def test_found_seeds_replay_clean(seed: int, options: dict[str, float]) -> None:
    """Schedules that found the bugs fixed in docs/reliability.md, as regressions, with the
    options they were found with: ``tentative`` (the share of commits allowed to be
    tentative), ``disk_faults`` (the share of steps that hit a disk), ``skew`` (seconds)."""
    assert run_schedule(seed, **options).violations == []


@pytest.mark.parametrize(
    ("commits", "reads", "kinds"),
    [
        # a clean history: an ack, then a matching restore and head
        (
            [_commit(1, 1, "a", 1, 2)],
            [_restore(1, 3, head=(1, 1), state={b"k": b"a"}), _head(5, 1, 1)],
            set(),
        ),
        # the restore returns other bytes
        ([_commit(1, 1, "a", 1, 2)], [_restore(1, 3, head=(1, 1), state={b"k": b"x"})], {"wrong-bytes"}),  # noqa: E501
        # the final restore of an acknowledged version fails
        ([_commit(1, 1, "a", 1, 2)], [_restore(1, 3, error="VersionNotFound", final=True)], {"lost"}),  # noqa: E501
        # a head read after the ack of v2 sees v1
        ([_commit(1, 1, "a", 1, 2), _commit(2, 1, "b", 3, 4)], [_head(5, 1, 1)], {"head-went-back"}),  # noqa: E501
        # one epoch, one version, two contents
        ([_commit(1, 1, "a", 1, 2), _commit(1, 1, "b", 3, 4)], [], {"two-contents"}),
        # epoch 1 began after epoch 2's commit was acknowledged, and was acknowledged
        ([_commit(1, 2, "b", 1, 2), _commit(1, 1, "a", 3, 4)], [], {"fenced-ack"}),
        # epoch 1's commit overlaps epoch 2's and ends later: it took effect first, no violation
        ([_commit(1, 1, "a", 1, 6), _commit(1, 2, "b", 2, 3)], [], set()),
        # a new writer's v2 (epoch 2, in flight, told it failed) read while epoch 1's v2 was
        # acknowledged, then built on by epoch 3's acknowledged v3: fencing at work
        (
            [
                _commit(2, 1, "a", 1, 2),
                _commit(2, 2, "b", 3, 8, state={b"k": b"b"}, base_epoch=1, outcome="failed"),
                _commit(3, 3, "c", 9, 10, base_epoch=2),
            ],
            [_restore(2, 5, head=(2, 2), state={b"k": b"b"})],
            set(),
        ),
        # the same read with no acknowledged commit built on epoch 2's v2: wrong bytes
        (
            [
                _commit(2, 1, "a", 1, 2),
                _commit(2, 2, "b", 3, 8, state={b"k": b"b"}, base_epoch=1, outcome="failed"),
            ],
            [_restore(2, 5, head=(2, 2), state={b"k": b"b"})],
            {"wrong-bytes"},
        ),
        # a higher epoch rewriting v1 after taking over is fencing at work, not a violation
        (
            [_commit(1, 1, "a", 1, 2), _commit(1, 2, "b", 3, 4, state={b"k": b"b"})],
            [_restore(1, 5, head=(2, 1), state={b"k": b"b"}, final=True)],
            set(),
        ),
    ],
)  # fmt: skip
def test_the_checker_on_fabricated_histories(
    commits: list[CommitOp], reads: list[ReadOp], kinds: set[str]
) -> None:
    h = History(commits=commits, reads=reads)
    assert {v.kind for v in check(h)} == kinds


def test_the_memory_network_refuses_drops_and_cuts() -> None:
    import random

    async def scenario() -> list[str]:
        net = MemoryNetwork(random.Random(1))

        async def small(request: web.Request) -> web.Response:
            return web.json_response({"ok": True})

        async def big(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse()
            await resp.prepare(request)
            for _ in range(100):
                await resp.write(b"x" * 100)
            await resp.write_eof()
            return resp

        app = web.Application()
        app.router.add_get("/small", small)
        app.router.add_post("/big", big)
        net.attach("n:1", app, 1 << 20)
        t = net.transport("c", timeout=1.0)
        seen = [str((await t.request("GET", "n:1", "/small")).json())]
        stream = await t.open_stream("n:1", "/big", b"")
        seen.append(str(len(await stream.readexactly(10_000))))
        net.block("c", "n:1")
        with pytest.raises(NodeUnavailable):
            await t.request("GET", "n:1", "/small")
        net.heal()
        net.block("n:1", "c")  # the answer is lost: the caller times out
        with pytest.raises(RequestTimeout):
            await t.request("GET", "n:1", "/small")
        net.heal()
        net.faults = LinkFaults(cut=1.0)
        stream = await t.open_stream("n:1", "/big", b"")
        with pytest.raises((NodeUnavailable, asyncio.IncompleteReadError)):
            await stream.readexactly(10_000)
        seen.append(str(asyncio.get_running_loop().time() >= 1.0))
        return seen

    assert run_simulated(scenario) == ["{'ok': True}", "10000", "True"]


def test_the_cli_reports_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--schedules", "3", "--seed", "2", "--no-progress"]) == 0
    assert "3 schedules" in capsys.readouterr().out


def _tentative(version: int, epoch: int, delta: str, start: int, end: int) -> CommitOp:
    return replace(_commit(version, epoch, delta, start, end), outcome="tentative")


@pytest.mark.parametrize(
    ("commits", "verdicts", "final_head", "kinds"),
    [
        # confirmed and restored at the end: clean
        ([_tentative(1, 1, "a", 1, 2)], {1: ("confirmed", 0)}, (1, 1), set()),
        # never decided
        ([_tentative(1, 1, "a", 1, 2)], {}, (1, 1), {"undecided"}),
        # confirmed, but the final restore of its version fails: lost like an ack
        ([_tentative(1, 1, "a", 1, 2)], {1: ("confirmed", 0)}, None, {"lost"}),
        # rolled back, yet the final head
        ([_tentative(1, 1, "a", 1, 2)], {1: ("rolled_back", 0)}, (1, 1), {"rolled-back-kept"}),
        # a fenced writer's tentative commit (epoch 1 began after epoch 2's ack) confirmed
        (
            [_commit(1, 2, "b", 1, 2), _tentative(2, 1, "a", 3, 4)],
            {2: ("confirmed", 0)},
            (2, 1),
            {"fenced-ack"},
        ),
        # ... and rolled back, replaying from v1: what is promised
        (
            [_commit(1, 2, "b", 1, 2), _tentative(2, 1, "a", 3, 4)],
            {2: ("rolled_back", 1)},
            (2, 1),
            set(),
        ),
    ],
)  # fmt: skip
def test_the_checker_on_tentative_histories(
    commits: list[CommitOp],
    verdicts: dict[int, tuple[str, int]],
    final_head: tuple[int, int] | None,
    kinds: set[str],
) -> None:
    h = History(commits=commits)
    h.add_verdicts(
        {
            (S, v, c.epoch): verdicts[v]
            for c in commits
            for v in [c.version]
            if v in verdicts and c.outcome == "tentative"
        }
    )
    top = max((c for c in commits if c.outcome == "tentative"), key=lambda c: c.version)
    if final_head is None:
        h.add_read(_restore(top.version, h.now() + 1, error="VersionNotFound", final=True))
    else:
        state = {b"k": b"b"} if final_head[0] == 2 else dict(top.state)
        h.add_read(
            ReadOp("restore", S, None, h.now() + 1, h.now() + 2, final_head, state, final=True)
        )
    assert {v.kind for v in check(h)} == kinds


def test_schedules_with_tentative_commits_keep_every_promise() -> None:
    """Writers allowed to commit tentatively (a 1 s delay bound) under the same faults: every
    tentative commit ends confirmed or rolled back, confirmed ones restore like acks."""
    found, tentative = [], 0
    for i in range(12):
        outcome = run_schedule(derive(13, i), tentative=0.5)
        tentative += outcome.tentative
        found += [f"seed {outcome.seed}: {v}" for v in outcome.violations]
    assert found == []
    assert tentative > 0


def test_the_simulated_disk_loses_tears_rots_and_wipes() -> None:
    """sim/disk.py: a lost write undoes whole batches since a time (newest first), a torn
    write cuts the last chunk or manifest written, a flip changes bits of one (or of a
    store record), a wipe empties it."""
    import random

    now = [0.0]
    disk = Disk(lambda: now[0])
    disk.write({b"c:a": b"A" * 40, b"h:s": b"1"})
    now[0] = 1.0
    disk.write({b"m:s/1/delta": b"M" * 40, b"h:s": b"2"}, [b"c:a"])
    now[0] = 2.0
    disk.write({b"c:b": b"B" * 40})
    assert disk.lose(since=1.0) == 2  # both later batches, whole
    assert dict(disk.scan(b"")) == {b"c:a": b"A" * 40, b"h:s": b"1"}
    rng = random.Random(1)
    assert disk.tear(rng) == b"c:a"  # the last chunk or manifest written that is still held
    torn = disk.get(b"c:a")
    assert torn is not None and torn != b"A" * 40
    disk.write({b"m:s/1/delta": b"M" * 40})
    key = disk.flip(rng)
    before = {b"c:a": torn, b"m:s/1/delta": b"M" * 40, b"h:s": b"1"}  # a head rots too
    assert key in before and disk.get(key) != before[key]
    assert all(disk.get(k) == v for k, v in before.items() if k != key)
    disk.wipe()
    assert disk.scan_keys(b"") == []


def test_schedules_with_disk_faults_and_skew_keep_every_promise() -> None:
    """Lost and torn writes, flipped bits, wiped data dirs (one node at a time, until repair
    had its time) and skewed clocks: every acknowledged commit restores, the scrub repairs
    the rot it finds, and such a seed replays exactly."""
    found, kinds, corrupt, logs = [], set(), 0, []
    for i in range(5):
        outcome = run_schedule(derive(36, i), disk_faults=0.3, skew=5.0)
        kinds |= {k for k, n in outcome.disk_faults.items() if n}
        corrupt += outcome.scrub.get("scrub_corrupt", 0)
        found += [f"seed {outcome.seed}: {v}" for v in outcome.violations]
        logs.append(outcome.log)
    assert found == []
    assert len(kinds) >= 2, kinds  # every kind: the unit test above, and statestore-sim runs
    assert corrupt > 0
    assert run_schedule(derive(36, 0), disk_faults=0.3, skew=5.0).log == logs[0]


def test_schedules_with_rebase_at_keep_every_promise() -> None:
    """The nodes at --rebase-at 0.5 (a snapshot only once the deltas weigh half the last one,
    snapshot_every 1, 20 versions retained: testing/schedule.py), with disk faults: every
    acknowledged commit restores."""
    found = []
    for i in range(8):
        outcome = run_schedule(derive(37, i), rebase_at=0.5, disk_faults=0.15)
        found += [f"seed {outcome.seed}: {v}" for v in outcome.violations]
    assert found == []


def test_schedules_with_thinning_keep_every_promise() -> None:
    """The nodes at --thin-snapshots 3 (a snapshot every version, 5 versions retained, so
    most snapshots are thinned: testing/schedule.py), with disk faults: every acknowledged
    commit restores. Seed 77202556012356 lost version 2 while a replacement node's hand-over
    could still copy a thinned snapshot's manifest, whose chunks were gone (node/replica.py
    copy_manifests); seed 81946933424179 lost version 5 while the chunks went with the
    manifests, before every owner had dropped the manifests (node/compaction.py)."""
    found = []
    for seed in [77202556012356, 81946933424179, *(derive(53, i) for i in range(5))]:
        outcome = run_schedule(seed, thin=3, disk_faults=0.15)
        found += [f"seed {outcome.seed}: {v}" for v in outcome.violations]
    assert found == []
