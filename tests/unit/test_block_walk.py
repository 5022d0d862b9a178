"""What a point read by blocks still needs (net/reads.py, ``blocks_wanted``), checked against
a model: a chain of a snapshot and deltas (puts and deletes) in small blocks, a cache holding
a random part of its blocks, and a reader that reads the blocks it is told it needs and asks
again, or takes the value :func:`decided` gives from them (the node's lookups,
node/lookup.py). The value it ends with is the
newest version's that names the key, whatever the cache held; a block it is told to read is
one it lacks; and it reads nothing when the cache holds every block that decides."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from statestore.core.cache import ChunkCache
from statestore.core.chunk import (
    BlockIndex,
    decode_block,
    decode_chunk,
    encode_chunks,
    index_span,
    key_group,
    parse_index,
)
from statestore.core.ids import StoreId
from statestore.core.manifest import ChunkRef, Manifest
from statestore.net.reads import block_path, blocks_wanted, cache_key, decided

SID = StoreId("unit", 0, 2, "walk")
GROUPS = 8


def _chain(rng: random.Random) -> tuple[list[Manifest], dict[str, bytes], dict[bytes, bytes]]:
    """A snapshot of 120 keys and 1-4 deltas (20 puts and 10 deletes each) in ~256-byte
    blocks; the chunks' bytes by name; the newest state, folded (a deleted key absent)."""
    keys = [f"k{i:03d}".encode() for i in range(120)]
    chain: list[Manifest] = []
    data: dict[str, bytes] = {}
    puts = {k: rng.randbytes(rng.randrange(1, 40)) for k in keys}
    deletes: list[bytes] = []
    for version in range(1, rng.randrange(2, 6) + 1):
        kind = "snapshot" if version == 1 else "delta"
        chunks = encode_chunks(
            puts, deletes, groups=GROUPS, target_size=2048, kind=kind[0], block_size=256
        )
        data.update((c.name, c.data) for c in chunks)
        chain.append(Manifest(SID, version, kind, 1, GROUPS, tuple(map(ChunkRef.of, chunks))))
        touched = rng.sample(keys, 30)
        puts = {k: rng.randbytes(rng.randrange(1, 40)) for k in touched[:20]}
        deletes = touched[20:]
    state: dict[bytes, bytes] = {}
    for m in chain:
        for ref in m.chunks:
            for k, v in decode_chunk(data[ref.name]):
                if v is None:
                    state.pop(k, None)
                else:
                    state[k] = v
    return chain, data, state


def _index(ref: ChunkRef, data: dict[str, bytes]) -> BlockIndex:
    at, n = index_span(ref.size, ref.index_len)
    return parse_index(data[ref.name][at : at + n])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), held=st.floats(0.0, 1.0))
def test_a_walk_with_any_cache_ends_at_the_newest_value(seed: int, held: float) -> None:
    rng = random.Random(seed)
    chain, data, want = _chain(rng)
    cache = ChunkCache(1 << 30)
    blocks: dict[str, dict[bytes, bytes | None]] = {}
    for m in chain:
        for ref in m.chunks:
            if not ref.rows:
                continue
            ckey = cache_key(SID, m.version, ref)
            index = _index(ref, data)
            cache.put_index(ckey, index)
            for i in range(len(index.offsets)):
                frame = data[ref.name][index.offsets[i] : index.offsets[i] + index.lengths[i]]
                blocks[f"{ckey}#{i}"] = dict(decode_block(frame, index, i))
                if rng.random() < held:
                    cache.put(f"{ckey}#{i}", blocks[f"{ckey}#{i}"], 1)
    cached = set(blocks) & {k for k in blocks if cache.get(k) is not None}
    for key in [*sorted(want)[::7], b"k000", b"absent", *rng.sample(sorted(want), 5)]:
        path = block_path(chain, key)
        assert path is not None
        group = key_group(key, GROUPS)
        kept: dict[str, dict[bytes, bytes | None]] = {}
        walk = blocks_wanted(path, SID, group, key, cache, kept)
        assert walk is not None
        value, wanted = walk
        # the blocks along the path that can hold the key, newest first, down to the one
        # that names it: when the cache holds them all, nothing is wanted
        deciding = []
        for v, ref in path:
            ckey = cache_key(SID, v, ref)
            i = _index(ref, data).find(group, key)
            if i is not None:
                deciding.append(f"{ckey}#{i}")
                if key in blocks[f"{ckey}#{i}"]:
                    break
        if set(deciding) <= cached:
            assert wanted == []
        assert set(kept) <= cached  # only blocks the cache holds are kept
        for _v, _ref, ckey, i in wanted:
            assert f"{ckey}#{i}" in blocks and f"{ckey}#{i}" not in cached
            kept[f"{ckey}#{i}"] = blocks[f"{ckey}#{i}"]
        if wanted:
            again = blocks_wanted(path, SID, group, key, cache, kept)
            assert again is not None and again[1] == []
            assert again[0] == want.get(key), key
            # what a lookup does instead of walking again: the blocks it wanted, then the
            # value the walk found below them
            value = decided(key, value, wanted, kept)
        assert value == want.get(key), key
        ckeys = [cache_key(SID, v, ref) for v, ref in path]
        assert blocks_wanted(path, SID, group, key, cache, kept, ckeys) == (value, [])


def test_a_walk_needs_every_index() -> None:
    rng = random.Random(5)
    chain, _data, _want = _chain(rng)
    path = block_path(chain, b"k001")
    assert path
    assert blocks_wanted(path, SID, key_group(b"k001", GROUPS), b"k001", ChunkCache()) is None
