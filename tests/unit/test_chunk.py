"""The chunk codec: layout, round trips, corruption and decompression bombs."""

from __future__ import annotations

import msgpack
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from statestore.core.chunk import (
    DEFAULT_BLOCK_SIZE,
    SNAPSHOT_BLOCKS,
    checksum,
    decode_block,
    decode_chunk,
    decoded_bound,
    encode_chunks,
    index_span,
    key_group,
    parse_index,
    verify,
)
from statestore.core.errors import CorruptChunk, DecompressionBomb, InvalidRequest, PayloadTooLarge

kv = st.dictionaries(st.binary(min_size=1, max_size=20), st.binary(max_size=50), max_size=200)


@settings(max_examples=100, deadline=None)
@given(
    puts=kv,
    dels=st.sets(st.binary(min_size=1, max_size=20), max_size=30),
    target=st.integers(50, 5000),
    block=st.sampled_from([0, 1, 60, 300, 16384]),
)
def test_round_trip(puts: dict[bytes, bytes], dels: set[bytes], target: int, block: int) -> None:
    dels -= set(puts)
    chunks = encode_chunks(puts, dels, groups=16, target_size=target, block_size=block)
    got_puts: dict[bytes, bytes] = {}
    got_dels: set[bytes] = set()
    prev_hi = 0
    for c in chunks:
        assert c.checksum == checksum(c.data)
        assert 0 <= c.lo <= c.hi < 16 and c.lo >= prev_hi
        prev_hi = c.hi
        for k, v in decode_chunk(c.data):
            assert c.lo <= key_group(k, 16) <= c.hi
            if v is None:
                got_dels.add(k)
            else:
                got_puts[k] = v
    assert got_puts == puts and got_dels == dels


def test_chunks_are_cut_near_target_size() -> None:
    puts = {f"key-{i:06d}".encode(): b"x" * 90 for i in range(10000)}
    chunks = encode_chunks(puts, [], target_size=100_000)
    assert 9 <= len(chunks) <= 12
    assert all(c.raw_size <= 100_000 + 200 for c in chunks)


def test_empty_commit_is_one_empty_chunk() -> None:
    (c,) = encode_chunks({}, [], groups=8)
    assert decode_chunk(c.data) == [] and (c.lo, c.hi) == (0, 7)


def test_key_both_put_and_deleted_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="both put and deleted"):
        encode_chunks({b"k": b"v"}, [b"k"])


def test_non_bytes_are_refused() -> None:
    with pytest.raises(TypeError, match="key must be bytes"):
        encode_chunks({"k": b"v"}, [])  # type: ignore[dict-item]


def test_oversized_row_is_refused() -> None:
    with pytest.raises(PayloadTooLarge):
        encode_chunks({b"k": b"x" * 1000}, [], max_raw=500)


def test_checksum_mismatch_names_the_chunk() -> None:
    (c,) = encode_chunks({b"a": b"b"}, [])
    bad = c.data[:-1] + bytes([c.data[-1] ^ 1])
    with pytest.raises(CorruptChunk, match="chunk x is corrupt"):
        verify(bad, c.checksum, "x")


def test_garbage_is_corrupt_not_a_crash() -> None:
    for data in (b"", b"not zstd at all", zstandard.ZstdCompressor().compress(b"\x02junk")):
        with pytest.raises(CorruptChunk):
            decode_chunk(data)
    raw = b"\x01" + msgpack.packb([b"odd"])
    with pytest.raises(CorruptChunk, match="pairs"):
        decode_chunk(zstandard.ZstdCompressor().compress(raw))


def test_decompression_bomb_with_declared_size() -> None:
    bomb = zstandard.ZstdCompressor(level=19).compress(b"\x00" * (8 * 1024 * 1024))
    assert len(bomb) < 2000
    with pytest.raises(DecompressionBomb, match="past the 1048576-byte limit"):
        decode_chunk(bomb, max_raw=1024 * 1024)


def test_decompression_bomb_without_declared_size() -> None:
    cctx = zstandard.ZstdCompressor(write_content_size=False)
    obj = cctx.compressobj()
    bomb = obj.compress(b"\x00" * (4 * 1024 * 1024)) + obj.flush()
    assert zstandard.frame_content_size(bomb) == -1
    with pytest.raises(DecompressionBomb):
        decode_chunk(bomb, max_raw=1024 * 1024)


def test_chunk_bytes_are_pinned() -> None:
    """Chunk names carry the checksum of their bytes, and re-committing a version is
    idempotent only if the same rows encode to the same chunks: a codec change that alters
    the bytes (order, cuts, msgpack layout) would turn a client's retry after an upgrade into
    a VersionConflict. These names were produced by the first release of the codec, which
    wrote whole chunks (``block_size=0``)."""
    puts = {b"key-%04d" % i: b"value-%d" % (i * i) for i in range(500)}
    deletes = [b"gone-%d" % i for i in range(20)]
    chunks = encode_chunks(puts, deletes, groups=16, target_size=2000, block_size=0)
    names = [c.name for c in chunks]
    assert len(names) == 8
    assert names[:3] == ["d0-1fed7890a650798e", "d1-bf2e047a51401454", "d2-d78d5ae9e8dbbd81"]
    assert names[-1] == "d7-5c367c43fe56a530"
    # a key deleted twice in one commit is laid out twice, as the first codec did
    twice = encode_chunks(puts, deletes + deletes[:3], groups=16, target_size=2000, block_size=0)
    assert [c.name for c in twice][::7] == ["d0-1b0799830ba1f6a2", "d7-3381ab5dbac635fc"]


def test_blocked_chunk_bytes_are_pinned() -> None:
    """The blocked layout (format 2, 0.3.0), pinned the same way: Java writes these bytes too
    (tests/ring/test_java_codec.py)."""
    puts = {b"key-%04d" % i: b"value-%d" % (i * i) for i in range(500)}
    deletes = [b"gone-%d" % i for i in range(20)]
    chunks = encode_chunks(puts, deletes, groups=16, target_size=2000, block_size=300)
    assert [c.name for c in chunks][:3] == [
        "d0-b9ac9d87305a4eb1",
        "d1-856a8bd38c9ee009",
        "d2-c434ee7372e018f9",
    ]
    assert chunks[-1].name == "d7-995cf28680a8168d"
    assert (chunks[0].index_len, chunks[0].index_checksum) == (165, 3268737838186725450)
    default = encode_chunks(puts, deletes, groups=16, target_size=2000)
    assert [c.name for c in default][::7] == ["d0-94be233784878f39", "d7-d595685ea1a88a93"]
    # a snapshot's chunks carry a Bloom filter of their keys
    snap = encode_chunks(puts, [], groups=16, target_size=2000, kind="s")
    assert [c.name for c in snap][::7] == ["s0-08494cb6b45b2cc2", "s7-6f240de02283cc98"]


def _blocked_chunk() -> tuple[dict[bytes, bytes], bytes, int, int]:
    puts = {b"k%05d" % i: b"v" * (i % 50) for i in range(3000)}
    (c,) = encode_chunks(puts, [], groups=8, target_size=1 << 30, block_size=2000)
    return puts, c.data, c.index_len, c.index_checksum


def test_each_key_is_found_in_the_one_block_its_index_names() -> None:
    puts, data, index_len, index_sum = _blocked_chunk()
    at, n = index_span(len(data), index_len)
    raw_index = data[at : at + n]
    assert checksum(raw_index) == index_sum
    index = parse_index(raw_index, limit=at - 1)
    assert len(index.offsets) > 20
    for key, value in list(puts.items())[::37]:
        i = index.find(key_group(key, 8), key)
        assert i is not None
        frame = data[index.offsets[i] : index.offsets[i] + index.lengths[i]]
        assert dict(decode_block(frame, index, i))[key] == value
    # a key before the first block's first key is in no block
    assert index.find(-1, b"") is None


def test_a_snapshots_bloom_filter_spares_the_blocks_of_absent_keys() -> None:
    """Every key a snapshot chunk holds is found; of keys it does not hold, about 0.5% pass
    the filter (16 bits a key, 3 probes) and the rest need no block. A delta's chunk has no
    filter: any key may be in it."""
    puts = {b"k%05d" % i: b"v" for i in range(20_000)}
    (snap,) = encode_chunks(puts, [], groups=8, target_size=1 << 30, kind="s")
    (delta,) = encode_chunks(puts, [], groups=8, target_size=1 << 30, kind="d")
    for c, filtered in ((snap, True), (delta, False)):
        at, n = index_span(len(c.data), c.index_len)
        index = parse_index(c.data[at : at + n])
        assert (len(index.keys) == 20_000 * 16 // 8) is filtered
        assert all(index.find(key_group(k, 8), k) is not None for k in puts)
        absent = [b"x%05d" % i for i in range(20_000)]
        passed = sum(index.find(key_group(k, 8), k) is not None for k in absent)
        if filtered:
            assert 0 < passed < 0.01 * len(absent), passed
        else:
            assert passed > 0.9 * len(absent)


def test_a_snapshots_blocks_are_a_quarter_of_a_deltas() -> None:
    """A snapshot is what lazy restores and point reads fetch one block of, so its blocks are
    ``block_size // SNAPSHOT_BLOCKS``: at 1% of its keys touched at random, a quarter of the
    rows a block means about a third of the blocks read (docs/benchmarks.md)."""
    puts = {b"k%05d" % i: b"v" * 200 for i in range(20_000)}
    sizes = {}
    for kind in "ds":
        (c,) = encode_chunks(puts, [], groups=1, target_size=1 << 30, kind=kind)
        at, n = index_span(len(c.data), c.index_len)
        rows = parse_index(c.data[at : at + n]).rows
        assert sum(rows) == 20_000
        sizes[kind] = max(rows)
    per_row = 200 + 6 + 10  # value, key, overhead
    assert sizes["d"] == DEFAULT_BLOCK_SIZE // per_row
    assert sizes["s"] == DEFAULT_BLOCK_SIZE // SNAPSHOT_BLOCKS // per_row


def test_a_block_that_does_not_match_its_index_is_refused() -> None:
    _, data, index_len, _ = _blocked_chunk()
    at, n = index_span(len(data), index_len)
    index = parse_index(data[at : at + n])
    frame = bytearray(data[index.offsets[3] : index.offsets[3] + index.lengths[3]])
    frame[-1] ^= 1
    with pytest.raises(CorruptChunk, match="block 3 is corrupt"):
        decode_block(bytes(frame), index, 3)
    other = data[index.offsets[4] : index.offsets[4] + index.lengths[4]]
    with pytest.raises(CorruptChunk):
        decode_block(other, index, 3)


@pytest.mark.parametrize(
    "index",
    [
        b"\x01",
        msgpack.packb([[[0, b"a", 0, 1, 1]], b""]),  # an empty frame
        msgpack.packb([[[0, b"b", 5, 1, 1], [0, b"a", 5, 1, 1]], b""]),  # out of key order
        msgpack.packb([[[0, 7, 5, 1, 1]], b""]),  # a key that is not bytes
        msgpack.packb([[[0, b"a", 5, 1]], b""]),
        msgpack.packb([[[0, b"a", 5, 1, 1]], b"\x00" * 3]),  # a filter under 64 bits
        msgpack.packb([[[0, b"a", 5, 1, 1]]]),  # no filter
        msgpack.packb([[0, b"a", 5, 1, 1]]),  # the entries alone
        msgpack.packb({"a": 1}),
    ],
)
def test_a_malformed_index_is_corrupt_not_a_crash(index: bytes) -> None:
    with pytest.raises(CorruptChunk):
        parse_index(index)
    with pytest.raises(CorruptChunk):
        decode_chunk(b"\xb2" + b"\x00" * 10 + index + len(index).to_bytes(4, "little"))


def test_a_blocked_chunk_past_the_limit_is_a_bomb_across_blocks() -> None:
    """Each block is small; the limit holds for their sum."""
    puts = {b"k%05d" % i: b"\x00" * 1000 for i in range(2000)}
    (c,) = encode_chunks(puts, [], groups=1, target_size=1 << 30, block_size=20_000)
    assert len(c.data) < 200_000
    with pytest.raises(DecompressionBomb):
        decode_chunk(c.data, max_raw=1_000_000)
    assert len(decode_chunk(c.data, max_raw=3_000_000)) == 2000
    with pytest.raises(DecompressionBomb, match="rows"):
        decode_chunk(c.data, max_rows=1999)


def test_truncated_blocked_chunks_are_corrupt() -> None:
    _, data, _, _ = _blocked_chunk()
    for cut in (1, 3, 5, len(data) // 2, len(data) - 1):
        with pytest.raises(CorruptChunk):
            decode_chunk(data[:cut])


@pytest.mark.parametrize("block_size", [0, DEFAULT_BLOCK_SIZE])
@pytest.mark.parametrize("kind", ["d", "s"])
def test_decoded_bound_is_what_a_chunk_decodes_to_from_its_own_frames(
    block_size: int, kind: str
) -> None:
    """What a reader takes from a memory budget before decoding a chunk whose manifest's raw
    size is a writer's word: the frames' declared sizes, at most the limit (node/lookup.py's
    point reads)."""
    rows = {b"k%06d" % i: b"v" * (i % 300) for i in range(5_000)}
    for c in encode_chunks(rows, [], kind=kind, block_size=block_size):
        bound = decoded_bound(c.data)
        payload = sum(len(k) + len(v or b"") for k, v in decode_chunk(c.data))
        assert payload <= bound <= c.raw_size + 64
        assert decoded_bound(c.data, max_raw=100) == 100
    assert decoded_bound(b"\x00not a chunk", max_raw=1234) == 1234
