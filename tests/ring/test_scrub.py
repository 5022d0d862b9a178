"""Scrub (node/scrub.py): bit rot at rest is found without a read and replaced from a good
replica, on real node processes with LMDB data directories."""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from pathlib import Path

from client import RingClient, StoreId
from statestore.core.chunk import checksum
from statestore.wire.manifest import decode_chain
from tests.ringkit import FAST, local_ring

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
