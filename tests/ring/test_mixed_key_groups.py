"""A chain whose manifests are cut by different key-group counts (a delta written by a client
with another ``key_groups`` option, as tests/ring/test_open.py's
test_async_open_folds_deltas_cut_by_other_key_groups writes one): a restore of some groups,
and a rescale (which restores each new partition's groups), fold that delta too. The builds
before dropped its chunks: their ranges are in the other numbering, and the chain was cut
by the newest manifest's (core/keygroups.chain_for_groups)."""

from __future__ import annotations

import random
from pathlib import Path

from client import AsyncRingClient, StoreId
from client.rescale import groups_of
from statestore.core.chunk import key_group
from tests.ringkit import nodes


async def test_a_restore_of_some_groups_folds_a_delta_cut_by_other_key_groups(
    tmp_path: Path,
) -> None:
    sid = StoreId("r1", 0, 0, "default")
    rng = random.Random(1)
    base = {f"key-{i:05d}".encode(): b"v1-" + rng.randbytes(8) for i in range(2000)}
    keys = sorted(base)
    over = {k: b"v2-new" for k in keys[::3]}
    dels = [k for k in keys[1::7] if k not in over]
    want2 = {**base, **over}
    for k in dels:
        del want2[k]
    async with (
        nodes(tmp_path, 1, replicas=1, write_quorum=1) as live,
        AsyncRingClient([live[0].address], chunk_size=4096) as ring,
        AsyncRingClient([live[0].address], chunk_size=4096, key_groups=16) as other,
    ):
        await ring.commit(sid, 1, base, [], {"s": 1}, epoch=1, snapshot=True)
        await other.commit(sid, 2, over, dels, {"s": 2}, epoch=1)  # cut by 16 groups
        await ring.commit(sid, 3, {b"extra": b"x"}, [], {"s": 3}, epoch=1)  # top: 128
        want3 = {**want2, b"extra": b"x"}
        full = dict(await ring.restore(sid, 3))
        assert full == want3  # the whole restore is right
        part = range(64, 128)
        got = dict(await ring.restore(sid, 3, key_groups=part))
        expect = {k: v for k, v in want3.items() if key_group(k, 128) in part}
        stale = [k for k in expect if got.get(k) != expect[k]]
        resurrected = [k for k in got if k not in expect]
        assert not stale and not resurrected, (
            f"{len(stale)} keys with a wrong value (e.g. {stale[:1]} -> "
            f"{got.get(stale[0]) if stale else None!r}, want "
            f"{expect[stale[0]] if stale else None!r}), {len(resurrected)} deleted keys back"
        )


async def test_rescale_folds_a_delta_cut_by_other_key_groups(tmp_path: Path) -> None:
    """What client.rescale does for a new partition: restore its group range of the old."""
    sid = StoreId("r1", 0, 1, "default")
    base = {f"k{i}".encode(): b"old" for i in range(500)}
    over = {f"k{i}".encode(): b"new" for i in range(500)}
    async with (
        nodes(tmp_path, 1, replicas=1, write_quorum=1) as live,
        AsyncRingClient([live[0].address]) as ring,
        AsyncRingClient([live[0].address], key_groups=16) as other,
    ):
        await ring.commit(sid, 1, base, [], {}, epoch=1, snapshot=True)
        await other.commit(sid, 2, over, [], {}, epoch=1)
        await ring.commit(sid, 3, {}, [], {}, epoch=1)
        for p in range(2):
            got = dict(await ring.restore(sid, 3, key_groups=groups_of(p, 2)))
            assert set(got.values()) == {b"new"}, (p, sorted(set(got.values())))
