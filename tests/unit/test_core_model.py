"""Ids, manifests, chains, quorum rules and row framing: tables and properties."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from statestore.core.errors import (
    InvalidRequest,
    InvalidStoreId,
    MalformedData,
    QuorumNotReached,
    VersionNotFound,
)
from statestore.core.ids import StoreId, chunk_key, parse_chunk_key
from statestore.core.manifest import (
    Head,
    Manifest,
    candidates,
    lineage,
    local_chain,
    resolve_chain,
)
from statestore.core.quorum import check_write, merge_heads, read_quorum
from statestore.wire.manifest import (
    decode_chain,
    decode_manifest,
    encode_chain,
    encode_manifest,
    join_chain,
)
from statestore.wire.rows import decode_rows, encode_rows
from tests.corekit import LINEAGE_CASES, SID, lm, manifest


@pytest.mark.parametrize(
    "args, match",
    [
        (("", 0, 0, "n"), "query is empty"),
        (("a/b", 0, 0, "n"), "not allowed"),
        (("..", 0, 0, "n"), "not allowed"),
        (("q", -1, 0, "n"), "out of range"),
        (("q", 0, 2**31, "n"), "out of range"),
        (("q", 0, 0, "x" * 129), "129 characters"),
        (("q", 0, 0, "sp ace"), "not allowed"),
        (("q", "0", 0, "n"), "must be an integer"),
        (("q", True, 0, "n"), "must be an integer"),
    ],
)
def test_invalid_store_ids(args: tuple[object, ...], match: str) -> None:
    with pytest.raises(InvalidStoreId, match=match):
        StoreId(*args)  # type: ignore[arg-type]


def test_store_paths_round_trip() -> None:
    assert StoreId.parse(SID.path) == SID
    assert StoreId.parse("q1/0/3") == SID
    key = chunk_key(SID, 7, "d0-00112233aabbccdd")
    assert parse_chunk_key(key) == (SID, 7, "d0-00112233aabbccdd")
    for bad in ("q1/0/3/default/7/../../x", "q1/0/3/default/x/d0-00", "q1/0/3/default/7/zz"):
        with pytest.raises(InvalidStoreId):
            parse_chunk_key(bad)


def test_manifest_round_trip_and_validation() -> None:
    m = manifest(5)
    assert decode_manifest(encode_manifest(m)) == m
    assert decode_chain(encode_chain([m, manifest(6)])) == [m, manifest(6)]
    obj = msgpack.unpackb(encode_manifest(m))
    for field, value, match in [
        ("schema", 99, "schema 99 is not supported"),
        ("kind", "weird", "kind"),
        ("epoch", -1, "epoch"),
        ("key_groups", 0, "key_groups"),
        ("chunks", [["n", 5, 1, 0, 0, 0, 0]], "chunk"),
        ("version", 0, "out of range"),
    ]:
        bad = dict(obj, **{field: value})
        with pytest.raises((MalformedData, InvalidRequest), match=match):
            decode_manifest(msgpack.packb(bad))
    with pytest.raises(MalformedData):
        decode_manifest(b"\xc1garbage")


def test_base_epoch_is_an_optional_last_key() -> None:
    """A manifest without base_epoch encodes as schema 1 always did (the on-disk format); one
    with it adds the key last, and decoding checks it."""
    m = manifest(5)
    assert list(msgpack.unpackb(encode_manifest(m))) == [
        "schema", "store", "version", "kind", "epoch", "key_groups", "chunks", "positions",
    ]  # fmt: skip
    lined = Manifest(m.store, 5, "delta", 3, m.key_groups, m.chunks, m.positions, 2)
    data = encode_manifest(lined)
    assert list(msgpack.unpackb(data))[-1] == "base_epoch"
    # the same bytes after the map header (one key more), then the key
    same = Manifest(m.store, 5, "delta", 3, m.key_groups, m.chunks, m.positions)
    assert data[1:] == encode_manifest(same)[1:] + b"\xaabase_epoch\x02"
    assert decode_manifest(data) == lined
    assert decode_chain(encode_chain([m, lined])) == [m, lined]
    for bad in (-1, "2", 2**63, 1.5):
        obj = dict(msgpack.unpackb(data), base_epoch=bad)
        with pytest.raises(MalformedData, match="base_epoch"):
            decode_manifest(msgpack.packb(obj))


def test_resolve_chain_table() -> None:
    deltas = {v: manifest(v) for v in range(1, 8)}
    snaps = {4: manifest(4, "snapshot")}
    chain = resolve_chain(SID, 7, deltas, snaps)
    assert [(m.version, m.kind) for m in chain] == [
        (4, "snapshot"),
        (5, "delta"),
        (6, "delta"),
        (7, "delta"),
    ]
    assert [m.version for m in resolve_chain(SID, 3, deltas, snaps)] == [1, 2, 3]
    # a re-commit of version 4 by a newer writer makes the old snapshot stale
    deltas2 = {**deltas, 4: manifest(4, epoch=2)}
    assert [m.kind for m in resolve_chain(SID, 5, deltas2, snaps)] == ["delta"] * 5
    with pytest.raises(VersionNotFound, match="no version 9"):
        resolve_chain(SID, 9, deltas, snaps)
    gap = {v: m for v, m in deltas.items() if v != 2}
    with pytest.raises(VersionNotFound, match="needs version 2"):
        resolve_chain(SID, 3, gap, {})


def test_local_chain_stops_at_a_snapshot_and_goes_on_past_a_gap() -> None:
    deltas = {v: manifest(v) for v in (1, 2, 4, 5)}
    snaps = {2: manifest(2, "snapshot")}
    # a gap (3: missed while down) does not hide what lies under it from the reader
    assert [(m.version, m.kind) for m in local_chain(deltas, snaps, 5)] == [
        (5, "delta"),
        (4, "delta"),
        (2, "snapshot"),
        (2, "delta"),
    ]
    assert [m.version for m in local_chain({1: manifest(1), 5: manifest(5)}, {}, 5)] == [5, 1]
    assert [m.version for m in local_chain({5: manifest(5)}, {}, 5)] == [5]
    # the manifests above the version asked come too: the reader finds the head's lineage
    assert [(m.version, m.kind) for m in local_chain(deltas, snaps, 2)] == [
        (4, "delta"),
        (5, "delta"),
        (2, "snapshot"),
        (2, "delta"),
    ]


def test_quorum_rules() -> None:
    assert read_quorum(3, 2) == 2 and read_quorum(3, 3) == 1 and read_quorum(1, 1) == 1
    check_write("x", 2, 2, 3, [])
    with pytest.raises(QuorumNotReached, match="only 1 live node"):
        check_write("chunk k", 1, 2, 1, [])
    assert merge_heads([Head(5, 1), None, Head(3, 2), Head(9, 1)]) == Head(3, 2)
    assert merge_heads([None]) is None


@pytest.mark.parametrize(
    ("held", "owners", "homes", "want"),
    [
        ("a,b", "a,b,c", "a,b,c", True),  # every owner a home replica: W owners
        ("a", "a,b,c", "a,b,c", False),
        ("a,d", "a,b,d", "a,b,down:c", False),  # one home and the stand-in of a down one
        ("a,b", "a,b,d", "a,b,down:c", True),
        ("a,d,e", "a,d,e", "a,down:b,down:c", False),  # two home replicas down
        ("a", "a", "a", False),  # W=2 on a ring of one
    ],
)
def test_held_at_w_needs_w_home_replicas(held: str, owners: str, homes: str, want: bool) -> None:
    """Replicas holding a manifest count as W (a hint's hand-off, node/hints.py) only as a
    write is acknowledged: W of the owners and W of the home replicas among them."""
    from statestore.core.quorum import held_at_w

    assert held_at_w(held.split(","), owners.split(","), homes.split(","), 2) is want


@given(
    st.dictionaries(st.binary(max_size=30), st.binary(max_size=30), max_size=50),
    st.sets(st.binary(max_size=30), max_size=10),
)
def test_rows_round_trip(puts: dict[bytes, bytes], dels: set[bytes]) -> None:
    dels -= set(puts)
    rows = list(puts.items()) + [(k, None) for k in dels]
    got_puts, got_dels = decode_rows(b"".join(encode_rows(rows)))
    assert got_puts == puts and set(got_dels) == dels


def test_rows_truncated_is_malformed() -> None:
    body = b"".join(encode_rows([(b"key", b"value")]))
    for cut in (3, 9, len(body) - 1):
        with pytest.raises(MalformedData, match="row framing"):
            decode_rows(body[:cut])


def test_a_head_has_one_stored_form_and_one_wire_form() -> None:
    from statestore.wire import head as wire_head

    h = Head(7, 3)
    # the stored form is what nodes wrote before: msgpack [epoch, version]
    assert wire_head.encode_stored(h) == msgpack.packb([3, 7])
    assert wire_head.decode_stored(wire_head.encode_stored(h)) == h
    assert wire_head.from_json(wire_head.to_json(h)) == h
    assert wire_head.to_json(h) == {"version": 7, "epoch": 3}
    for bad in ([7, 3], {"version": True, "epoch": 1}, {"version": 1, "epoch": 2**64}, None):
        with pytest.raises(MalformedData):
            wire_head.from_json(bad)


@pytest.mark.parametrize(
    "manifests,version,expected",
    [c[1:] for c in LINEAGE_CASES],
    ids=[c[0] for c in LINEAGE_CASES],
)
def test_resolve_chain_follows_the_lineage(
    manifests: list[Manifest], version: int, expected: list[tuple[int, int, str]] | str
) -> None:
    deltas, snaps = candidates(manifests)
    if isinstance(expected, str):
        with pytest.raises(VersionNotFound, match=expected):
            resolve_chain(SID, version, deltas, snaps)
        return
    chain = resolve_chain(SID, version, deltas, snaps)
    assert [(m.version, m.epoch, m.kind) for m in chain] == expected
    # one replica holding all of it and one holding a part, each answering local_chain:
    # merged, they resolve the same
    for split in range(len(manifests) + 1):
        parts = [candidates(manifests), candidates(manifests[:split])]
        answered = [m for d, s in parts for m in local_chain(d, s, version)]
        merged = resolve_chain(SID, version, *candidates(answered))
        assert [(m.version, m.epoch, m.kind) for m in merged] == expected


def test_lineage_walks_down_from_the_head() -> None:
    deltas, snaps = candidates([lm(1, 1), lm(1, 2), lm(2, 3, 1), lm(3, 3, 3)])
    assert lineage(deltas, snaps) == {3: 3, 2: 3, 1: 1}
    assert lineage({}, {}) == {}


@pytest.mark.parametrize("n", [0, 1, 15, 16, 300])
def test_a_chain_joined_from_encoded_manifests_is_the_chain_encoded(n: int) -> None:
    chain = [manifest(v) for v in range(1, n + 1)]
    assert join_chain([encode_manifest(m) for m in chain]) == encode_chain(chain)
