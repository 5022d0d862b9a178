"""Reads that find nothing at a store's owners ask where its writes went while the owners
were down (net/reads.stand_ins): a partition heals, the owners are owners again at once, and
until repair hands the data back a quorum of them answers "no such store" for a store with
an acknowledged commit (tests/partition found it on 5 nodes, docs/reliability.md)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from client import RingClient, StoreId, StoreNotFound, VersionNotFound
from statestore.cli.local import LocalRing, http_json
from statestore.core.commit import build_commit
from statestore.core.view import RingView
from statestore.net.http import HttpTransport
from statestore.net.transport import Response
from statestore.net.writes import write_commit
from tests.ringkit import local_ring


@pytest.fixture
def ring5(tmp_path: Path) -> Iterator[LocalRing]:
    with local_ring(tmp_path, 5) as ring:
        yield ring


def _write_to_stand_ins(
    view: RingView, sid: StoreId, rows: dict[bytes, bytes], positions: dict[str, int] | None = None
) -> None:
    """Commit v1 of ``sid`` as a writer whose view says all three of its owners left the ring
    (a stale or wrong view) does: acknowledged by the stand-ins, no owner holds it. (A view
    that calls them down takes no commit: a manifest needs W of its home replicas.)"""
    owners = view.store_replicas(sid)
    seen = view.to_json()
    for m in seen["members"]:
        if m["address"] in owners:
            m["state"] = "left"
    partitioned = RingView.from_json(seen)
    assert not set(partitioned.store_replicas(sid)) & set(owners)
    manifest, chunks = build_commit(
        sid, 1, rows, [], positions or {}, 1, False, key_groups=16, chunk_size=1024,
        max_chunk=1 << 22,
    )  # fmt: skip

    async def write() -> None:
        transport = HttpTransport(timeout=10.0)
        try:
            await write_commit(transport, partitioned, manifest, chunks)
        finally:
            await transport.close()

    asyncio.run(write())


def test_a_store_written_while_its_owners_were_down_is_found_after_they_return(
    ring5: LocalRing,
) -> None:
    ring5.wait_ring(5)
    sid = StoreId("standin", 0, 1, "default")
    rows = {f"k{i}".encode(): f"v{i}".encode() * 20 for i in range(200)}
    with RingClient(ring5.seeds) as client:
        view = client.ring()
        _write_to_stand_ins(view, sid, rows, positions={"src": 7})
        if any(_held_by(view.store_replicas(sid), sid)):  # (a pass every 30 s at most here)
            pytest.skip("repair handed the store back to its owners before it could be read")
        # the owners were never down for the reader: its view is the whole ring
        assert client.latest(sid).version == 1
        st = client.restore(sid)
        assert (st.version, dict(st), st.positions) == (1, rows, {"src": 7})
        assert [dict(s) for s in client.restore_many([sid])] == [rows]
        # a store nobody wrote is still not found (after asking the stand-ins too)
        with pytest.raises(StoreNotFound, match=r"no committed version|no version"):
            client.latest(StoreId("standin", 0, 2, "default"))


def _held_by(addresses: list[str], sid: StoreId) -> list[bool]:
    out = []
    for a in addresses:
        try:
            http_json(a, f"/v1/stores/{sid.path}/head")
            out.append(True)
        except urllib.error.HTTPError as exc:
            assert exc.code == 404
            out.append(False)
    return out


def _called_down(view: RingView, down: set[str], extra: Sequence[dict[str, str]] = ()) -> RingView:
    """``view`` as a node cut off from the others sees it: ``down`` called down (wrongly),
    ``extra`` members added, the epoch raised."""
    seen = view.to_json()
    for m in seen["members"]:
        if m["address"] in down:
            m["status"] = "down"
    seen["members"] += list(extra)
    seen["epoch"] += 10
    return RingView.from_json(seen)


def test_a_view_that_calls_a_stores_owners_down_does_not_make_it_vanish(
    ring5: LocalRing,
) -> None:
    """A node cut off from the others calls them down and raises its epoch; a client shown
    that view asked owners that never held the store, and their quorum of "not found"
    ended a restore of a store with acknowledged versions (statestore-sim seed
    263719285619475, docs/reliability.md). A "not found" now takes a read quorum of the
    store's home replicas (the ring counting every member) too."""
    from statestore.core.errors import QuorumNotReached
    from statestore.net.reads import read_chain, read_head, read_versions

    ring5.wait_ring(5)
    sid = StoreId("isolated", 0, 1, "default")
    with RingClient(ring5.seeds) as client:
        client.commit(sid, 1, {b"k": b"v"})
        view = client.ring()
    owners = view.store_replicas(sid)
    lonely = _called_down(view, set(owners))
    assert not set(lonely.store_replicas(sid)) & set(owners)
    # two members that never answer (closed ports), two of a fresh store's three home
    # replicas: that store's absence cannot be told from the other members
    gone = [{"id": f"gone{i}", "address": f"127.0.0.1:{1 + i}", "status": "down"} for i in (0, 1)]
    dark = _called_down(view, set(), gone)
    far = {m["address"] for m in gone}
    fresh = next(
        s
        for s in (StoreId("isolated", 1, p, "default") for p in range(500))
        if len(far & set(dark.previous_replicas(s.path))) == 2
    )

    async def reads() -> list[object]:
        transport = HttpTransport(timeout=5.0)
        out: list[object] = []
        try:
            out.append((await read_head(transport, lonely, sid)).version)
            out.append(len(await read_chain(transport, lonely, sid, 1)))
            out.append(await read_versions(transport, lonely, sid))
            for read in (read_head, read_versions):
                try:
                    await read(transport, dark, fresh)
                except (QuorumNotReached, StoreNotFound) as exc:
                    out.append(type(exc).__name__)
        finally:
            await transport.close()
        return out

    assert asyncio.run(reads()) == [1, 1, [1], "QuorumNotReached", "QuorumNotReached"]


class _Table:
    """A transport whose nodes answer from a table (simulated nothing else)."""

    timeout = 1.0
    seen_epoch = 0

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def open_stream(self, *a: Any, **kw: Any) -> Any:
        # the reads these tests make (heads, chains) are plain requests: one that streams
        # would be a test asking this fake for what it does not model, and fails loudly
        raise NotImplementedError("a table of answers serves requests, not streams")


class _Replicas(_Table):
    """Nodes that answer a store's head from a table: a head, "no version" (404),
    unreachable, after an optional delay."""

    def __init__(self, heads: dict[str, tuple[float, tuple[int, int] | str | None]]) -> None:
        self.heads = heads
        self.asked: list[str] = []  # who was asked, in order

    async def request(self, method: str, address: str, path: str, **kw: Any) -> Response:
        from statestore.core.errors import NodeUnavailable

        self.asked.append(address)
        delay, head = self.heads[address]
        await asyncio.sleep(delay)
        if head == "down":
            raise NodeUnavailable(f"{address} is unreachable")
        if method == "POST":  # POST /v1/heads: one answer per store asked
            asked = len(kw["json_body"]["stores"])
            one = None if head is None else {"version": head[1], "epoch": head[0]}
            return Response(200, json.dumps({"heads": [one] * asked}).encode(), 0)
        if head is None:
            raise StoreNotFound(f"no version on {address}")
        assert isinstance(head, tuple)
        return Response(200, json.dumps({"version": head[1], "epoch": head[0]}).encode(), 0)


def test_a_head_read_needs_a_read_quorum_of_the_home_replicas_too() -> None:
    """Writer w2 had v4 and v5 acknowledged at W=2 by two of the store's home replicas on a
    view where all of them were live; a reader whose view called one of those two down read
    a quorum of that view's owners: the home replica that missed v4 and v5 (it said v3) and
    the stand-in that took the down one's place (it never held the store), and returned v3
    (statestore-sim seed 197272725224341, head-went-back). A latest read now needs a read
    quorum of the store's home replicas as well as of its owners: it waits for the other
    home replica, which holds v5. Fails on the code before (v3)."""
    from statestore.core.view import MemberInfo
    from statestore.net.reads import read_head, read_heads

    members = tuple(MemberInfo(f"n{i}", f"n{i}:7400") for i in range(5))
    full = RingView(epoch=6, members=members)
    sid = StoreId("sim", 0, 1, "s")
    home = full.store_replicas(sid)
    behind, ahead, gone = home  # the read quorum that acknowledged v5 was ahead and gone
    seen = full.to_json()
    for m in seen["members"]:
        if m["address"] == gone:
            m["status"] = "down"
    seen["epoch"] = 7
    reader = RingView.from_json(seen)
    owners = reader.store_replicas(sid)
    (stand_in,) = set(owners) - set(home)
    heads: dict[str, tuple[float, tuple[int, int] | str | None]] = {
        a: (0.0, None) for a in reader.live_addresses()
    }
    heads |= {behind: (0.0, (1, 3)), stand_in: (0.0, None), ahead: (0.05, (1, 5))}
    heads[gone] = (0.0, "down")

    async def reads() -> list[int]:
        transport = _Replicas(heads)
        single = await read_head(transport, reader, sid)
        batched = await read_heads(transport, reader, [sid])
        return [single.version, batched[0].version]

    assert asyncio.run(reads()) == [5, 5]


class _CutFrom(HttpTransport):
    """A writer's transport whose link to ``cut`` is down (connection refused)."""

    def __init__(self, cut: str) -> None:
        super().__init__(timeout=10.0)
        self.cut = cut

    async def request(self, method: str, address: str, path: str, **kw: Any) -> Response:
        from statestore.core.errors import NodeUnavailable

        if address == self.cut:
            raise NodeUnavailable(f"node {address} is unreachable (the link is cut)")
        return await super().request(method, address, path, **kw)


def test_a_manifest_needs_w_of_the_live_home_replicas_not_a_stand_in(ring5: LocalRing) -> None:
    """A writer whose view called home replica h0 down, and whose link to h1 was cut, had a
    commit acknowledged by h2 and the stand-in that took h0's place. Once h0 was back, a read
    quorum of the home replicas h0 and h1 missed it, and a restore went back a version
    (statestore-sim seed 21317839338017, head-went-back). A manifest now needs W of the
    home replicas as well, down ones counted: that commit is refused, so is one on a view
    calling two home replicas down, and one that is acknowledged is held by two home
    replicas, which every read quorum of the three meets. Fails on the code before (the
    commit was acknowledged with one home replica holding it)."""
    from statestore.core.errors import QuorumNotReached

    ring5.wait_ring(5)
    sid = StoreId("homes", 0, 1, "default")
    with RingClient(ring5.seeds) as client:
        client.commit(sid, 1, {b"k": b"v1"})
        view = client.ring()
        epoch = client.latest(sid).epoch
    homes = view.store_replicas(sid)
    h0, h1, h2 = homes
    seen = _called_down(view, {h0})
    assert len(set(seen.store_replicas(sid)) - set(homes)) == 1  # a stand-in took h0's place
    manifest, chunks = build_commit(
        sid, 2, {b"k": b"v2"}, [], {}, epoch, False, key_groups=16, chunk_size=1024,
        max_chunk=1 << 22, base_epoch=epoch,
    )  # fmt: skip

    async def write(transport: HttpTransport, on: RingView = seen) -> None:
        try:
            await write_commit(transport, on, manifest, chunks)
        finally:
            await transport.close()

    with pytest.raises(QuorumNotReached, match="on its home replicas"):
        asyncio.run(write(_CutFrom(h1)))
    # two home replicas called down: the one left and the stand-ins are not W of the homes
    with pytest.raises(QuorumNotReached, match="on its home replicas"):
        asyncio.run(write(HttpTransport(timeout=10.0), _called_down(view, {h0, h1})))
    asyncio.run(write(HttpTransport(timeout=10.0)))
    held = {a: _version(http_json(a, f"/v1/stores/{sid.path}/head")) for a in homes}
    assert held[h1] == held[h2] == 2, held
    with RingClient(ring5.seeds) as client:
        assert client.restore(sid).version == 2


def _version(head: object) -> int:
    assert isinstance(head, dict)
    return int(head["version"])


def test_a_manifest_short_of_home_replicas_for_full_disks_says_so() -> None:
    """Below W of the home replicas because one's disk is full: the error is
    InsufficientStorage (507, free space or add nodes), not "quorum not reached", as it is
    below W of the owners. Fails on the code before (QuorumNotReached)."""
    from statestore.core.errors import InsufficientStorage
    from statestore.core.manifest import Manifest
    from statestore.core.view import MemberInfo
    from statestore.net.writes import put_manifest

    full_view = RingView(
        epoch=3, members=tuple(MemberInfo(f"n{i}", f"n{i}:7400") for i in range(5))
    )
    sid = StoreId("full", 0, 1, "default")
    h0, h1, _ = full_view.store_replicas(sid)
    view = _called_down(full_view, {h0})
    m, _ = build_commit(
        sid, 1, {b"k": b"v"}, [], {}, 1, False, key_groups=4, chunk_size=1024, max_chunk=1 << 20
    )

    class Disks:
        async def request(self, method: str, address: str, path: str, **kw: Any) -> Response:
            if address == h1:
                raise InsufficientStorage(f"{address}: disk full")
            return Response(201, b'{"stored": true}', 0)

    async def write(manifest: Manifest) -> None:
        await put_manifest(Disks(), view, manifest)  # type: ignore[arg-type]

    with pytest.raises(InsufficientStorage, match="full disk"):
        asyncio.run(write(m))


class _Chains(_Table):
    """Nodes that answer ``GET .../chain`` with a fixed list of manifests, after a delay."""

    def __init__(self, chains: dict[str, tuple[float, bytes]]) -> None:
        self.chains = chains
        self.asked: list[str] = []

    async def request(self, method: str, address: str, path: str, **kw: Any) -> Response:
        self.asked.append(address)
        delay, body = self.chains[address]
        await asyncio.sleep(delay)
        return Response(200, body, 0)


def test_a_chain_the_first_read_quorum_lacks_a_version_of_is_read_from_the_third_owner() -> None:
    """Versions 1-16 of a store, each acknowledged by two of its three owners, no snapshot. The
    two owners that answer first both lack version 9 in their answers: one missed it while
    it was down (repair has not brought it yet), the other is a 0.1.0 node, which answers a
    chain read only down to its first missing version (it missed version 12, a write that
    outlasted the grace). The third owner holds all of them. Before, the read said version 9
    "is gone" (CI: a rolling upgrade from 0.1.0, tests/ring/test_upgrade.py); a read quorum
    saying a version is missing is now checked with every owner before the read fails.
    Fails on the code before (VersionNotFound)."""
    from statestore.core.manifest import Manifest
    from statestore.core.view import MemberInfo
    from statestore.net.reads import read_chain
    from statestore.wire.manifest import encode_chain

    members = tuple(MemberInfo(f"n{i}", f"n{i}:7400") for i in range(3))
    view = RingView(epoch=3, members=members)
    sid = StoreId("up", 0, 0, "s")

    def held(*versions: int) -> bytes:
        return encode_chain([Manifest(sid, v, "delta", 1, 16, (), {"v": v}) for v in versions])

    restarted, old, complete = view.store_replicas(sid)
    chains = {
        restarted: (0.0, held(*range(10, 17), *range(1, 9))),  # down at 9
        old: (0.0, held(*range(13, 17))),  # stops at its gap at 12
        complete: (0.05, held(*range(1, 17))),
    }

    async def read() -> tuple[list[int], list[str]]:
        transport = _Chains(chains)
        chain = await read_chain(transport, view, sid, 16)
        return [m.version for m in chain], transport.asked

    versions, asked = asyncio.run(read())
    assert versions == list(range(1, 17)) and asked.count(complete) == 2

    async def past_the_head() -> list[str]:  # no gap: said at once, the third not asked again
        transport = _Chains(chains)
        with pytest.raises(VersionNotFound, match="has no version 17"):
            await read_chain(transport, view, sid, 17)
        return transport.asked

    assert asyncio.run(past_the_head()).count(complete) == 1
