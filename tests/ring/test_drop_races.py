"""A drop racing the pulls of a join or a token move (in-process nodes): a node's purge is
not undone by a copy it pulls from a peer that has not purged yet, nor by one it fetched
before its purge and writes after (node/tombstones.copy_mark)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from statestore.core.commit import build_commit
from statestore.core.errors import QuorumNotReached
from statestore.core.handover import Handover
from statestore.core.ids import StoreId, chunk_key
from statestore.core.items import ChunkItem, ManifestItem
from statestore.core.manifest import Manifest
from statestore.node.compaction import _snapshot
from statestore.node.daemon import MoveStatus, Node
from statestore.node.moves.copies import push_manifests
from statestore.node.moves.join import join_round
from statestore.node.repair import push_item
from statestore.node.server import start_node, stop_node
from statestore.node.tombstones import copy_mark
from statestore.wire.headers import DROPS_HEADER
from statestore.wire.rows import encode_rows
from tests.ringkit import call, config, eventually, nodes, send_commit

STORE = StoreId("q", 0, 0, "s")
DROP = {"id": "d1", "at": 1.0}
COPIES = ("/v1/chunks/", "/v1/manifests/", "/v1/sync/manifests")  # the paths pushes take


async def _commit(node: Node, version: int, value: bytes) -> int:
    body = b"".join(encode_rows([(b"k", value)]))
    path = f"/v1/stores/{STORE.path}/commit?version={version}&epoch=1"
    return (await call(node, "POST", path, data=body))[0]


async def _committed(node: Node) -> tuple[Manifest, str]:
    """Version 1 committed through ``node``: its manifest and its chunk's key."""
    assert await _commit(node, 1, b"OLD-1") == 201
    m = node.store.get_manifest(STORE, 1, "delta")
    assert m is not None
    return m, chunk_key(STORE, 1, m.chunks[0].name)


async def _held(node: Node) -> dict[str, Any]:
    status, body = await call(node, "GET", "/v1/queries/q")
    assert status == 200, body
    return dict(body["held"])


async def _phase(node: Node, phase: str) -> None:
    status, body = await call(node, "POST", "/v1/queries/q/purge", json=DROP | {"phase": phase})
    assert status == 200, body


class SlowLink:
    """The requests ``node`` sends that ``holds`` picks wait until :meth:`release` (a slow
    link: read before a drop, delivered after it); ``waiting`` and ``delivered`` list them."""

    def __init__(self, node: Node, holds: Callable[[str, str, str], bool]) -> None:
        self.held = asyncio.Event()
        self.waiting: list[str] = []
        self.delivered: list[str] = []
        real = node.transport.request

        async def slow(method: str, address: str, path: str, **kw: Any) -> Any:
            if not holds(method, address, path):
                return await real(method, address, path, **kw)
            self.waiting.append(path)
            await self.held.wait()
            try:
                return await real(method, address, path, **kw)
            finally:
                self.delivered.append(path)

        node.transport.request = slow  # type: ignore[method-assign]

    def release(self) -> None:
        self.held.set()


async def _drop_everywhere(ns: list[Node]) -> None:
    """The drop's two phases on every node, each phase on all before the next."""
    for n in ns:
        await _phase(n, "purge")
    for n in ns:
        await _phase(n, "seal")


async def test_a_join_round_between_its_own_purge_and_a_sources_pulls_nothing_back(
    tmp_path: Path,
) -> None:
    async with nodes(tmp_path, 3, replicas=3, write_quorum=2, repair_interval=3600) as ns:
        source, other, joiner = ns
        for v in (1, 2, 3):
            assert await _commit(source, v, b"OLD-%d" % v) == 201
        # the drop's purges run on every member at once: the joiner's lands first, and its
        # round runs before the others purge (they still list and serve the query)
        await _phase(joiner, "purge")
        await join_round(joiner, MoveStatus(Handover("join"), joiner.clock()))
        for n in (source, other):
            await _phase(n, "purge")
        for n in ns:
            await _phase(n, "seal")
        assert sum((await _held(joiner)).values()) == 0
        # the query written anew from version 1 is not fenced by the dropped one
        assert await _commit(other, 1, b"NEW-1") == 201
        status, head = await call(joiner, "GET", f"/v1/stores/{STORE.path}/head")
        assert status == 404 or head.get("version") == 1, head


async def test_a_copy_fetched_before_a_purge_is_not_written_after_it(tmp_path: Path) -> None:
    async with nodes(tmp_path, 2, replicas=2, write_quorum=2, repair_interval=3600) as ns:
        node, peer = ns
        m, key = await _committed(peer)
        data = peer.store.get_chunk(key)
        assert data is not None
        mark = copy_mark(node, "q")  # read before the fetch, as a pull does
        await _phase(node, "purge")
        await _phase(node, "seal")
        assert not await node.write(node.store.put_chunk_copy, key, data, mark)
        assert await node.write(node.store.copy_pulled, [m], {"q": mark}) == [None]
        assert sum((await _held(node)).values()) == 0
        # a copy marked after the drop lands
        mark = copy_mark(node, "q")
        assert await node.write(node.store.put_chunk_copy, key, data, mark)
        assert await node.write(node.store.copy_pulled, [m], {"q": mark}) == [True]


async def test_a_copy_pushed_across_a_drop_does_not_bring_it_back(tmp_path: Path) -> None:
    """A push read on its sender before the sender's purge and delivered after the
    receiver's seal (a slow link: its request held until the drop finished) is refused:
    repair's chunk and manifest pushes and a hand-over's batch of manifests. The build
    before took them, and the dropped query's version 1 came back on the receiver. A push
    read after the drop lands, and so does one from a node of the build before (no
    header), as it did."""
    async with nodes(tmp_path, 2, replicas=2, write_quorum=2, repair_interval=3600) as ns:
        node, peer = ns
        m, key = await _committed(peer)
        items = [ChunkItem(key).name(), ManifestItem.of(m).name()]
        link = SlowLink(peer, lambda _, a, path: a == node.address and path.startswith(COPIES))
        pushes = [asyncio.ensure_future(push_item(peer, node.address, i)) for i in items]
        batch = asyncio.ensure_future(push_manifests(peer, node.address, items[1:]))
        await eventually(lambda: len(link.waiting) == 3, "each push read its data and waits")
        await _drop_everywhere(ns)
        link.release()
        await asyncio.gather(*pushes, batch)
        assert sum((await _held(node)).values()) == 0
        # the query written anew through the peer: its pushes read after the drop land
        m, key = await _committed(peer)
        await node.write(node.store.purge_query, "q", node.store.tombstone("q") or b"")
        assert sum((await _held(node)).values()) == 0
        assert await push_item(peer, node.address, ChunkItem(key).name())
        assert await push_manifests(peer, node.address, [ManifestItem.of(m).name()]) != [None]
        assert (await _held(node))["chunks"] == 1
        data = peer.store.get_chunk(key)
        await node.write(node.store.purge_query, "q", node.store.tombstone("q") or b"")
        status, _ = await call(node, "PUT", f"/v1/chunks/{key}?copy=1", data=data)
        assert status == 201  # no header: a node of the build before, taken as it was
        status, body = await call(
            node, "PUT", f"/v1/chunks/{key}?copy=1", data=b"x", headers={DROPS_HEADER: "[1]"}
        )
        assert (status, body["error"]["code"]) == (400, "invalid_request"), body


async def test_a_snapshot_folded_before_a_drop_does_not_bring_it_back(tmp_path: Path) -> None:
    """A compactor restores a store of the query, then the drop runs on every node while its
    snapshot's writes are on a slow link, delivered after the seal: they are refused (the
    compactor read the query's drop before its restore and sends it). The build before took
    them, and the store came back as its snapshot: a limit docs/operations.md stated."""
    async with nodes(tmp_path, 2, replicas=2, write_quorum=2, repair_interval=3600) as ns:
        node, peer = ns
        for v in (1, 2, 3):
            assert await _commit(peer, v, b"OLD-%d" % v) == 201
        top = node.store.get_manifest(STORE, 3, "delta")
        assert top is not None
        link = SlowLink(node, lambda _, __, path: "compaction=1" in path)
        fold = asyncio.ensure_future(_snapshot(node, node.view(), top))
        await eventually(lambda: link.waiting, "the snapshot is folded and on its way")
        await _drop_everywhere(ns)
        link.release()
        with pytest.raises(QuorumNotReached):
            await fold
        for n in ns:
            assert sum((await _held(n)).values()) == 0


async def test_a_hint_handed_off_across_a_drop_does_not_bring_it_back(tmp_path: Path) -> None:
    """A node holding a hint (a writer's tentative commit) hands it off to the store's
    owners; its writes are on a slow link while the drop runs on every node, and delivered
    after the seal: they are refused (the hint's query's drop was read before the hint).
    The build before wrote them as an ordinary commit, and the dropped store came back on
    its owners (hostile review 77)."""
    async with nodes(tmp_path, 3, replicas=2, write_quorum=2, repair_interval=3600) as ns:
        view = ns[0].view()
        sid = next(
            s
            for s in (StoreId("q", 0, p, "s") for p in range(100))
            if ns[2].address not in view.store_replicas(s)
        )
        holder = ns[2]
        link = SlowLink(holder, lambda m, _, path: m == "PUT" and path.startswith(COPIES[:2]))
        rows = {b"k%d" % i: b"DROPPED" for i in range(5)}
        m, chunks = build_commit(
            sid, 1, rows, [], None, 1, False, key_groups=128, chunk_size=1 << 20,
            max_chunk=1 << 22,
        )  # fmt: skip
        await send_commit(holder, m, chunks, hint=holder.address)
        await eventually(lambda: link.waiting, "the hint's hand-off is on its way")
        await _drop_everywhere(ns)
        link.release()
        await eventually(lambda: holder.store.hint_count() == 0, "the hint purged")
        await eventually(
            lambda: len(link.delivered) == len(link.waiting), "the held writes delivered"
        )
        for n in ns:
            assert n.store.head(sid) is None
            assert sum((await _held(n)).values()) == 0


async def test_a_node_serves_no_copies_before_it_learned_the_drops_it_missed(
    tmp_path: Path,
) -> None:
    """A node back from being away (down during a drop) holds the dropped query until its
    first tombstone exchange: a joiner's listing and pulls from it in that window would
    bring the query back (hostile review 65). They are refused (503) until it heard a peer
    (or --down-after passed); its peers' loops hear each other within a moment."""
    async with nodes(tmp_path, 2, replicas=2, write_quorum=2, down_after=600) as ns:
        node, peer = ns
        _, key = await _committed(node)
        node.tombstones_heard, node.began = False, node.clock()  # as at its start
        asks = [
            ("POST", "/v1/handover/items", {"json": {"node": peer.id, "limit": 10}}),
            ("GET", f"/v1/chunks/{key}?copy=1", {}),
            ("GET", f"/v1/manifests/{STORE.path}/1/delta?epoch=1&copy=1", {}),
            (
                "POST",
                "/v1/sync/manifests/read",
                {"json": {"manifests": [[STORE.path, 1, "delta", 1]]}},
            ),
        ]
        for method, path, kw in asks:
            status, body = await call(node, method, path, **kw)
            assert status == 503, (path, status, body)
            assert "drops it missed" in body["error"]["message"]
        # a client's reads are served meanwhile
        assert (await call(node, "GET", f"/v1/chunks/{key}"))[0] == 200
        node.heard_drops()
        for method, path, kw in asks:
            assert (await call(node, method, path, **kw))[0] == 200, path
    async with nodes(tmp_path / "b", 2, replicas=2, write_quorum=2, down_after=600) as ns:
        await eventually(lambda: all(n.tombstones_heard for n in ns), "both heard a peer")


async def test_a_node_that_knows_no_peer_yet_has_not_heard_the_drops(tmp_path: Path) -> None:
    """A node that starts again knowing no peer (a ring's first node, or one finding its
    peers later) has learned no drop: it serves copies only once a peer answered, or after
    --down-after (hostile review 66: it counted "no peers" as heard, at once). A new data
    dir held nothing: its copies are served at once."""
    async with nodes(tmp_path, 1, replicas=1, write_quorum=1, down_after=600) as (node,):
        assert node.tombstones_heard  # a new data dir
    async with nodes(tmp_path, 1, replicas=1, write_quorum=1, down_after=600) as (node,):
        assert node.incarnation == 2  # the same data dir, started again
        await asyncio.sleep(1.5)  # the tombstone loop has run at least once
        assert not node.tombstones_heard
        asks = {"json": {"node": "x1", "limit": 10}}
        status, _ = await call(node, "POST", "/v1/handover/items", **asks)
        assert status == 503


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_node_started_again_hands_off_no_hint_of_a_query_dropped_meanwhile(
    tmp_path: Path,
) -> None:
    """A node holding a hint goes down; the owners come back and the query is dropped; the
    node starts again with a peer among its seeds that accepts connections and never
    answers. The owners' answers purge the hint as they come, and its hint loop waits for
    the drops it missed (the first tombstone exchange, 5 s at most with the hanging peer),
    so the hint is not written back to the owners that purged the query (hostile review
    67: it was handed off a second after the start, while the exchange waited for the
    hanging peer)."""
    ports = [_free_port() for _ in range(3)]
    seed = f"127.0.0.1:{ports[0]}"
    kw: dict[str, Any] = dict(
        storage="", replicas=2, write_quorum=2, down_after=30, repair_interval=3600,
        compact_interval=3600,
    )  # fmt: skip

    def cfg(i: int, *more: str) -> Any:
        seeds = ([] if i == 0 else [seed]) + list(more)
        return config(tmp_path, f"n{i}", port=ports[i], host="127.0.0.1", seeds=seeds, **kw)

    # a peer that takes connections (the kernel's backlog) and never answers
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)
    hanging = f"127.0.0.1:{hole.getsockname()[1]}"
    started = {i: await start_node(cfg(i)) for i in range(3)}
    try:
        ns = [n for n, _ in started.values()]
        await eventually(lambda: all(len(n.view().live_addresses()) == 3 for n in ns), "3 up")
        view = ns[0].view()
        sid = next(
            s
            for s in (StoreId("q", 0, p, "s") for p in range(100))
            if ns[2].address not in view.store_replicas(s)
        )
        # the owners go away; a writer's tentative commit lands as a hint on the third node
        for i in (1, 0):
            await stop_node(*started.pop(i))
        rows = {b"k%d" % i: b"DROPPED" for i in range(5)}
        m, chunks = build_commit(
            sid, 1, rows, [], None, 1, False, key_groups=128, chunk_size=1 << 20,
            max_chunk=1 << 22,
        )  # fmt: skip
        await send_commit(ns[2], m, chunks, hint=ns[2].address)
        assert ns[2].store.hint_count() == 1
        await stop_node(*started.pop(2))
        # the owners come back and the query is dropped without the third node
        started[0] = await start_node(cfg(0))
        started[1] = await start_node(cfg(1))
        a, b = started[0][0], started[1][0]
        status, body = await call(a, "POST", "/v1/queries/q/drop")
        assert status == 200, body
        assert a.store.head(sid) is None and b.store.head(sid) is None
        started[2] = await start_node(cfg(2, hanging))
        h = started[2][0]
        await eventually(
            lambda: h.tombstones_heard and h.store.hint_count() == 0, "the hint purged", 20
        )
        await asyncio.sleep(1.5)  # a hint pass or two
        assert a.store.head(sid) is None and b.store.head(sid) is None
        assert h.store.hint_count() == 0
    finally:
        for n, r in started.values():
            await stop_node(n, r)
        hole.close()
