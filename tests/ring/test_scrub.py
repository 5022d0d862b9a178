"""Scrub (node/scrub.py): bit rot at rest is found without a read and replaced from a good
replica, on real node processes with LMDB data directories."""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from client import RingClient, StoreId
from statestore.core.chunk import checksum
from statestore.core.commit import build_commit
from statestore.core.ids import chunk_key
from statestore.core.manifest import Manifest
from statestore.node.daemon import Node
from statestore.node.scrub import scrub_pass
from statestore.wire.manifest import decode_chain
from tests.ringkit import FAST, local_ring, nodes, send_commit

SID = StoreId("scrubbed", 0, 0, "default")
SCRUB = ["--scrub-mbps", "100", "--scrub-interval", "0.3"]


def chain_chunks(address: str) -> list[tuple[str, int]]:
    """(chunk key, checksum) of version 1's chain as ``address`` holds it."""
    with urllib.request.urlopen(
        f"http://{address}/v1/stores/{SID.path}/chain?version=1", timeout=5
    ) as resp:
        return [
            (f"{SID.path}/{m.version}/{c.name}", c.checksum)
            for m in decode_chain(resp.read())
            for c in m.chunks
        ]


def read_chunk(address: str, key: str) -> bytes | None:
    """The node's bytes of a chunk (it re-verifies on read), or None: missing or corrupt."""
    try:
        with urllib.request.urlopen(f"http://{address}/v1/chunks/{key}?copy=1", timeout=5) as r:
            body: bytes = r.read()
            return body
    except urllib.error.HTTPError:
        return None


def metric(address: str, name: str, label: str) -> float:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + "{") and f'"{label}"' in line:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def flip_a_byte(data_file: Path, needle: bytes) -> None:
    """Flip one bit of the stored copy of ``needle`` in an LMDB file, as rot would."""
    with open(data_file, "r+b") as f:
        raw = f.read()
        at = raw.find(needle)
        assert at >= 0, "the chunk's bytes are not in the data file"
        assert raw.find(needle, at + 1) < 0, "the chunk's bytes are there twice"
        f.seek(at + len(needle) // 2)
        f.write(bytes([raw[at + len(needle) // 2] ^ 0x10]))
        f.flush()
        os.fsync(f.fileno())


def test_a_rotted_chunk_is_found_by_the_scrub_and_replaced_from_a_replica(
    tmp_path: Path,
) -> None:
    with local_ring(tmp_path, 3, [*FAST, *SCRUB]) as ring:
        with RingClient(ring.seeds) as client:
            rows = {os.urandom(8): os.urandom(64) for _ in range(2000)}
            client.commit(SID, 1, rows, epoch=1, consistency="all")
        victim = ring.procs[1]
        (key, expected), *_ = chain_chunks(victim.address)
        good = read_chunk(victim.address, key)
        assert good is not None and checksum(good) == expected
        flip_a_byte(Path(victim.data_dir) / "db" / "data.mdb", good[:64])
        deadline = time.monotonic() + 60
        while metric(victim.address, "statestore_node_events_total", "scrub_replaced") < 1:
            assert time.monotonic() < deadline, "the scrub never replaced the rotted chunk"
            time.sleep(0.2)
        assert metric(victim.address, "statestore_node_events_total", "scrub_corrupt") >= 1
        assert read_chunk(victim.address, key) == good  # the node's own copy is good again


def test_a_manifest_that_no_longer_decodes_is_replaced_from_a_replica(tmp_path: Path) -> None:
    """A byte of a stored manifest rots: its seal (node/replica.py) no longer matches, so it
    is never served, and the scrub or repair writes a replica's copy back. Fails on the code
    before seals (the rotted bytes were served until the scrub came by)."""
    with local_ring(tmp_path, 3, [*FAST, *SCRUB]) as ring:
        with RingClient(ring.seeds) as client:
            client.commit(SID, 1, {b"k": b"v" * 100}, epoch=1, consistency="all")
        victim = ring.procs[2]
        path = f"/v1/manifests/{SID.path}/1/delta?copy=1"
        with urllib.request.urlopen(f"http://{victim.address}{path}", timeout=5) as r:
            good = r.read()
        with open(Path(victim.data_dir) / "db" / "data.mdb", "r+b") as f:
            raw = f.read()
            at = raw.find(good)
            assert at >= 0 and raw.find(good, at + 1) < 0
            f.seek(at)
            f.write(b"\xc1")  # msgpack's one never-used byte: nothing decodes past it
        # the record's seal no longer matches: the scrub, or repair (to which the rotted
        # record is absent), writes a replica's copy back
        # back; meanwhile it is never served (404: readers ask another replica)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://{victim.address}{path}", timeout=5) as r:
                    served = r.read()
                    assert served == good, f"served a rotted manifest: {served[:20]!r}"
                    break
            except urllib.error.HTTPError as exc:
                assert exc.code == 404
            assert time.monotonic() < deadline, "the rotted manifest was never replaced"
            time.sleep(0.05)


def _rot_main_record(node: Node) -> bytes:
    """Flip a bit of the only manifest record ``node`` (in-process, memory storage) holds
    under a version's main key; the record's key."""
    key = next(
        k for k in node.store.manifest_records() if node.store.manifest_record_names(k)[3] is None
    )
    data = node.store.backend._data  # type: ignore[attr-defined]
    raw = bytearray(data[key])
    raw[-3] ^= 0x10
    data[key] = bytes(raw)
    return key


async def _rot_and_scrub(victim: Node) -> Manifest | None:
    """Rot ``victim``'s main record of MAIN v1, run a scrub pass (it finds one bad record)
    and give the manifest it holds then."""
    _rot_main_record(victim)
    assert await scrub_pass(victim, 1e12) == 1
    return victim.store.get_manifest(MAIN, 1, "delta")


def _attempt(epoch: int, tag: str) -> tuple[Manifest, list[Any]]:
    rows = {f"{tag}-{i}".encode(): tag.encode() * 4 for i in range(5)}
    return build_commit(MAIN, 1, rows, [], None, epoch, False, key_groups=128,
                        chunk_size=1 << 20, max_chunk=1 << 22)  # fmt: skip


MAIN = StoreId("scrub-main", 0, 1, "default")


async def test_a_rotted_main_record_takes_the_highest_epoch_the_replicas_hold(
    tmp_path: Path,
) -> None:
    """A version's main manifest record rots: its epoch (in the value) is lost with it. The
    first replica the scrub would ask holds an older writer's attempt at epoch 1, which never
    reached W; the other holds the acknowledged epoch 2. The scrub takes epoch 2. The build
    before took the first replica's copy, whatever its epoch: the node then held the failed
    attempt as the version's content and the acknowledged one nowhere (a hostile review)."""
    async with nodes(tmp_path, 3, replicas=3, write_quorum=2, scrub_mbps=0,
                     repair_interval=3600.0) as live:  # fmt: skip
        victim = live[0]
        first = next(a for a in victim.view().read_order(MAIN.path) if a != victim.address)
        lagging = next(n for n in live if n.address == first)
        third = next(n for n in live if n not in (victim, lagging))
        failed, failed_chunks = _attempt(1, "failed")
        acked, acked_chunks = _attempt(2, "acked")
        await send_commit(lagging, failed, failed_chunks)
        await send_commit(victim, acked, acked_chunks)
        await send_commit(third, acked, acked_chunks)
        held = await _rot_and_scrub(victim)
        assert held is not None and held.same_content(acked), held
        assert victim.stats["scrub_replaced"] == 1


async def test_the_scrub_brings_back_nothing_a_drop_deleted_while_it_fetched(
    tmp_path: Path,
) -> None:
    """The scrub finds a rotted manifest record (then, in a second query, a rotted chunk) and
    fetches a replica's copy; the query is dropped while the answer is on its way. Nothing
    of it comes back: a manifest's copy is written only over the rotted record still there,
    a chunk's only while the query's tombstone and floor are as they were. The build before
    wrote both back (a manifest of a dropped store, a hostile review found)."""
    async with nodes(tmp_path, 3, replicas=3, write_quorum=2, scrub_mbps=0,
                     repair_interval=3600.0) as live:  # fmt: skip
        victim = live[0]
        real = victim.transport.request
        data = victim.store.backend._data  # type: ignore[attr-defined]
        for query, rot in (("drop-m", "/v1/manifests/"), ("drop-c", "/v1/chunks/")):
            store = StoreId(query, 0, 1, "default")
            m, chunks = build_commit(
                store, 1, {b"k": b"v" * 64}, [], None, 1, False,
                key_groups=128, chunk_size=1 << 20, max_chunk=1 << 22,
            )  # fmt: skip
            for n in live:
                await send_commit(n, m, chunks)
            if rot == "/v1/manifests/":
                _rot_main_record(victim)
            else:
                ckey = chunk_key(store, 1, m.chunks[0].name).encode()
                stored = next(k for k in data if k.endswith(ckey))
                data[stored] = data[stored][:-1] + bytes([data[stored][-1] ^ 1])

            async def dropped_meanwhile(
                method: str, address: str, path: str, query: str = query, rot: str = rot,
                **kw: Any,
            ) -> Any:  # fmt: skip
                answer = await real(method, address, path, **kw)
                if path.startswith(rot) and "copy=1" in path:  # the drop lands meanwhile
                    victim.store.purge_query(query, b"tombstone")
                return answer

            victim.transport.request = dropped_meanwhile  # type: ignore[method-assign]
            assert await scrub_pass(victim, 1e12) == 1
            assert [k for k in victim.store.manifest_records() if query.encode() in k] == []
            assert [k for k in victim.store.chunk_keys() if k.startswith(query + "/")] == []
            assert victim.stats.get("scrub_replaced", 0) == 0


async def test_a_rotted_main_record_no_replica_outranks_gives_way_to_the_epoch_beside_it(
    tmp_path: Path,
) -> None:
    """Epoch 1 of a version is on every replica; a newer writer's epoch 2 reached only this
    node (a failed attempt), then this node's main record of the version rots. No replica
    holds an epoch above the one kept beside it (1): that one takes the main record's
    place, readable again. A draft of the highest-epoch rule left the record rotted for good
    (repair copies nothing over a rotted main record: a review ran it); and one a replica
    outranks raises the head with it, as a copy does."""
    async with nodes(tmp_path, 3, replicas=3, write_quorum=2, scrub_mbps=0,
                     repair_interval=3600.0) as live:  # fmt: skip
        victim = live[0]
        acked, acked_chunks = _attempt(1, "acked")
        newer, newer_chunks = _attempt(2, "newer")
        for n in live:
            await send_commit(n, acked, acked_chunks)
        await send_commit(victim, newer, newer_chunks)
        held = await _rot_and_scrub(victim)
        assert held is not None and held.same_content(acked), held
        assert victim.store.side_epochs(MAIN, 1, "delta") == []
        assert victim.stats["scrub_replaced"] == 1
        head = victim.store.head(MAIN)  # it stays at epoch 2: the epoch-1 writer stays fenced
        assert head is not None and head.key() == (2, 1), head
        # the others take a third writer's epoch 3 this node missed; its record rots again
        third, third_chunks = _attempt(3, "third")
        for n in live[1:]:
            await send_commit(n, third, third_chunks)
        held = await _rot_and_scrub(victim)
        assert held is not None and held.same_content(third), held
        head = victim.store.head(MAIN)
        assert head is not None and head.key() == (3, 1), head
