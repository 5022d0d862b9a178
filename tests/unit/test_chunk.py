"""The chunk codec: layout, round trips, corruption and decompression bombs."""

from __future__ import annotations

import msgpack
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from statestore.core.chunk import checksum, decode_chunk, encode_chunks, key_group, verify
from statestore.core.errors import CorruptChunk, DecompressionBomb, InvalidRequest, PayloadTooLarge

kv = st.dictionaries(st.binary(min_size=1, max_size=20), st.binary(max_size=50), max_size=200)


@settings(max_examples=100, deadline=None)
@given(
    puts=kv,
    dels=st.sets(st.binary(min_size=1, max_size=20), max_size=30),
    target=st.integers(50, 5000),
)
def test_round_trip(puts: dict[bytes, bytes], dels: set[bytes], target: int) -> None:
    dels -= set(puts)
    chunks = encode_chunks(puts, dels, groups=16, target_size=target)
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
    a VersionConflict. These names were produced by the first release of the codec."""
    puts = {b"key-%04d" % i: b"value-%d" % (i * i) for i in range(500)}
    deletes = [b"gone-%d" % i for i in range(20)]
    chunks = encode_chunks(puts, deletes, groups=16, target_size=2000)
    names = [c.name for c in chunks]
    assert len(names) == 8
    assert names[:3] == ["d0-1fed7890a650798e", "d1-bf2e047a51401454", "d2-d78d5ae9e8dbbd81"]
    assert names[-1] == "d7-5c367c43fe56a530"
    # a key deleted twice in one commit is laid out twice, as the first codec did
    twice = encode_chunks(puts, deletes + deletes[:3], groups=16, target_size=2000)
    assert [c.name for c in twice][::7] == ["d0-1b0799830ba1f6a2", "d7-3381ab5dbac635fc"]
