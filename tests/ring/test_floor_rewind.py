"""A retention floor one node reached alone (R=3, W=1, the two others down), after a newer
writer rewound below it on the two: the floor is taken only at a snapshot of the head's line
of descent (core/retention.usable_snapshots). The builds before took it at a snapshot of any
epoch held at that version, which repair had copied from the old writer's dead branch, and
dropped the newer writer's acknowledged versions in the retention window (hostile review 3)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

from aiohttp import web

from client import AsyncRingClient, StoreId
from statestore.node.daemon import Node
from statestore.node.server import start_node, stop_node
from tests.ringkit import config, eventually


async def test_a_floor_of_a_dead_branch_drops_none_of_the_newer_writers_versions(
    tmp_path: Path,
) -> None:
    store = StoreId("flr", 0, 3, "rewind")
    kw = {
        "thin_snapshots": 0,
        "snapshot_every": 5,
        "retain_versions": 10,
        "compact_interval": 0.2,
        "replicas": 3,
        "write_quorum": 1,
        "repair_interval": 1.0,
        "suspect_after": 0.5,
        "down_after": 1.0,
    }
    ports = {}
    for name in "abc":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports[name] = s.getsockname()[1]
    running: dict[str, tuple[Node, web.AppRunner]] = {}

    async def start(name: str, seed: str | None = None) -> Node:
        cfg = config(
            tmp_path,
            name,
            port=ports[name],
            storage=f"lmdb://{tmp_path}/{name}-db",
            seeds=[seed] if seed else [],
            **kw,
        )
        running[name] = await start_node(cfg)
        return running[name][0]

    async def stop(name: str) -> None:
        await stop_node(*running.pop(name))

    def up(node: Node, n: int) -> bool:
        return len(node.view().live_addresses()) == n

    try:
        a = await start("a")
        for name in "bc":
            await start(name, a.address)
        await eventually(lambda: all(up(n, 3) for n, _ in running.values()), "3 nodes")
        lead = next(
            n for n, _ in running.values() if n.view().store_replicas(store)[0] == n.address
        )
        lname = next(k for k, (n, _) in running.items() if n is lead)
        others = [k for k in "abc" if k != lname]
        state: dict[bytes, bytes] = {}
        async with AsyncRingClient([lead.address], timeout=30) as old:
            for v in range(1, 13):
                state[f"k{v % 7}".encode()] = f"a{v}".encode()
                await old.commit(
                    store, v, {f"k{v % 7}".encode(): f"a{v}".encode()}, [], {}, epoch=1
                )
            await asyncio.sleep(1.5)
            for k in others:
                await stop(k)
            await eventually(lambda: up(lead, 1), "the others down")
            for v in range(13, 41):
                await old.commit(
                    store, v, {f"k{v % 7}".encode(): f"a{v}".encode()}, [], {}, epoch=1
                )
                await asyncio.sleep(0.25)
            await eventually(
                lambda: lead.store.floor(store) >= 25, "the lead's floor past 25", limit=30
            )
            floor = lead.store.floor(store)
        await stop(lname)
        for k in others:
            await start(k, f"127.0.0.1:{ports[others[0]]}" if k != others[0] else None)
        missed = [running[k][0] for k in others]
        await eventually(lambda: all(up(n, 2) for n in missed), "the two see each other")
        # the newer writer restored version 12 (the head the two hold) and goes on from it
        new_state = dict(state)
        want: dict[int, dict[bytes, bytes]] = {}
        async with AsyncRingClient([n.address for n in missed], timeout=30) as new:
            assert dict(await new.restore(store, 12)) == state
            for v in range(13, floor - 4):
                new_state[f"k{v % 7}".encode()] = f"b{v}".encode()
                await new.commit(
                    store, v, {f"k{v % 7}".encode(): f"b{v}".encode()}, [], {}, epoch=2
                )
                want[v] = dict(new_state)
            await start(lname, missed[0].address)
            live = [n for n, _ in running.values()]
            await eventually(lambda: all(up(n, 3) for n in live), "3 nodes again")
            for v in range(floor - 4, floor + 6):
                new_state[f"k{v % 7}".encode()] = f"b{v}".encode()
                await new.commit(
                    store, v, {f"k{v % 7}".encode(): f"b{v}".encode()}, [], {}, epoch=2
                )
                want[v] = dict(new_state)
            # repair passes: the two hear of the floor in the third's answers (the builds
            # before took it within a few; this one refuses it, so the wait runs out)
            with contextlib.suppress(AssertionError):
                await eventually(
                    lambda: all(running[k][0].store.floor(store) >= floor for k in others),
                    "the two took the floor",
                    limit=20,
                )
            lost = []
            for v in range(floor - 4, floor + 6):  # the window of head floor + 5 (retain 10)
                try:
                    got = dict(await new.restore(store, v))
                except Exception as exc:
                    lost.append((v, type(exc).__name__))
                    continue
                if got != want[v]:
                    lost.append((v, f"wrong state {sorted(got.items())}"))
            assert not lost, f"acknowledged versions of the newer writer lost: {lost}"
    finally:
        for name in list(running):
            await stop(name)
