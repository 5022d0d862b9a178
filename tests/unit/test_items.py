"""Replication items (core/items.py): the names nodes send each other, pinned byte for byte;
``parse`` and ``name()`` inverse to each other (properties), malformed names refused as
MalformedData; and the item format held together with the disk-key format through a real
``NodeStore``, so that neither can change without a test failing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statestore.core.chunk import encode_chunks
from statestore.core.errors import InvalidRequest, MalformedData
from statestore.core.ids import MAX_EPOCH, MAX_PART, MAX_VERSION, StoreId, chunk_key
from statestore.core.items import (
    KINDS,
    ChunkItem,
    ManifestItem,
    Prefix,
    is_manifest,
    parse,
    parse_manifest,
    placement_key,
)
from statestore.core.manifest import ChunkRef, Manifest
from statestore.core.quota import COUNTED_PREFIXES, query_of_key
from statestore.node.backends import MemoryBackend
from statestore.node.replica import NodeStore

SID = StoreId("q1", 0, 3, "default")
KEY = "q1/0/3/default/7/d0-00000000000000ff"

# -- the wire format, pinned ---------------------------------------------------------------


@pytest.mark.parametrize(
    "item, name",
    [
        (ChunkItem(KEY), "c:q1/0/3/default/7/d0-00000000000000ff"),
        (ManifestItem(SID, 7, "delta", 2), "m:q1/0/3/default/7/delta/2"),
        (ManifestItem(SID, 12, "snapshot", 0), "m:q1/0/3/default/12/snapshot/0"),
        (
            ManifestItem(StoreId("a.b-c_d", 2**31 - 1, 0, "x"), MAX_VERSION, "delta", MAX_EPOCH),
            f"m:a.b-c_d/{2**31 - 1}/0/x/{2**62}/delta/{2**63 - 1}",
        ),
    ],
)
def test_names_are_the_wire_format(item: ChunkItem | ManifestItem, name: str) -> None:
    assert item.name() == name
    assert parse(name) == item
    assert is_manifest(name) == isinstance(item, ManifestItem)
    assert placement_key(name) == item.placement_key


# -- round trips (properties) ----------------------------------------------------------------

names = st.text("abcXYZ019._-", min_size=1, max_size=128).filter(lambda s: s not in (".", ".."))
store_ids = st.builds(StoreId, names, st.integers(0, MAX_PART), st.integers(0, MAX_PART), names)
manifest_items = st.builds(
    ManifestItem,
    store_ids,
    st.integers(0, MAX_VERSION),
    st.sampled_from(KINDS),
    st.integers(0, MAX_EPOCH),
)
chunk_names = st.builds(
    lambda kind, seq, checksum: f"{kind}{seq}-{checksum:016x}",
    st.sampled_from("ds"),
    st.integers(0, 999_999),
    st.integers(0, 2**64 - 1),
)
chunk_items = st.builds(
    lambda store, version, name: ChunkItem(chunk_key(store, version, name)),
    store_ids,
    st.integers(1, MAX_VERSION),
    chunk_names,
)


@settings(max_examples=300, deadline=None)
@given(item=st.one_of(chunk_items, manifest_items))
def test_parse_inverts_name(item: ChunkItem | ManifestItem) -> None:
    name = item.name()
    assert parse(name) == item
    assert parse(name).name() == name
    assert placement_key(name) == item.placement_key
    if isinstance(item, ManifestItem):  # node/digests names a manifest with its digest
        assert placement_key(f"{name}#1f") == item.placement_key


@settings(max_examples=300, deadline=None)
@given(item=manifest_items)
def test_a_manifest_item_names_its_store(item: ManifestItem) -> None:
    assert parse_manifest(item.name()) == item
    assert item.placement_key == item.store.path


@settings(max_examples=500, deadline=None)
@given(
    text=st.one_of(
        st.text(max_size=80),
        st.builds(lambda t, rest: t + rest, st.sampled_from(["c:", "m:"]), st.text(max_size=80)),
        st.builds(
            lambda item, junk: item.name() + junk,
            st.one_of(chunk_items, manifest_items),
            st.sampled_from(["\n", " ", "/", "/1", "0", "\x00", "²"]),
        ),
    )
)
def test_any_text_is_an_exact_name_or_refused(text: str) -> None:
    """name(parse(s)) == s for every s parse takes: one item, one name."""
    try:
        item = parse(text)
    except MalformedData:
        return
    assert item.name() == text


# -- refusals ---------------------------------------------------------------------------------

M = "m:q1/0/3/default"


@pytest.mark.parametrize(
    "name, words",
    [
        (f"{M}/7/delta/2\n", "epoch"),  # a trailing newline ("$" would have let it through)
        (f"{M}/7\n/delta/2", "version"),
        (f"{M}/{2**62 + 1}/delta/2", "version"),  # past MAX_VERSION
        (f"{M}/7/delta/{2**63}", "epoch"),  # past MAX_EPOCH (a Java long)
        (f"{M}/7/delta/{'9' * 400}", "epoch"),  # huge: refused without converting it
        (f"{M}/07/delta/2", "leading zero"),  # one number, one name
        (f"{M}/7/delta/-1", "epoch"),
        (f"{M}/+7/delta/2", "version"),
        (f"{M}/7/delta/²", "epoch"),  # a unicode digit
        (f"{M}/7/delta/", "epoch"),
        (f"{M}/7/delta", "is not m:"),  # a part missing
        ("m:q1/0/3/7/delta/2", "is not m:"),  # the store's name missing
        (f"{M}/7/delta/2/9", "is not m:"),  # a part too many
        (f"{M}/7/fold/2", "kind"),
        ("m:q1/00/3/default/7/delta/2", "write its store as q1/0/3/default"),
        ("m:q 1/0/3/default/7/delta/2", "not allowed"),
        ("m:./0/3/default/7/delta/2", "not allowed"),
        ("m:", "is not m:"),
        ("c:", "names no chunk"),
        ("c:q1/0/3/default/7/d0-00000000000000ff\n", "names no chunk"),
        ("c:q1/0/3/default/0/d0-00000000000000ff", "names no chunk"),  # version 0
        (f"c:q1/0/3/default/{2**62 + 1}/d0-00000000000000ff", "names no chunk"),
        ("c:q1/0/3/default/7/x0-00000000000000ff", "names no chunk"),
        ("c:q1/0/3/default/7", "names no chunk"),
        ("x:q1/0/3/default/7/delta/2", "neither"),
        ("q1/0/3/default/7/delta/2", "neither"),  # no tag
        ("", "neither"),
        ("m:" + "a" * 2000, "the limit is"),
    ],
)
def test_malformed_names_are_refused(name: str, words: str) -> None:
    with pytest.raises(MalformedData, match=words):
        parse(name)


@pytest.mark.parametrize("name", [None, 7, b"m:q1/0/3/default/7/delta/2", ["m:"]])
def test_a_name_that_is_not_a_string_is_refused(name: object) -> None:
    with pytest.raises(MalformedData, match="must be a string"):
        parse(name)


def test_malformed_is_an_invalid_request_and_a_chunk_is_no_manifest() -> None:
    with pytest.raises(InvalidRequest):
        parse("m:nope")
    with pytest.raises(MalformedData, match="a chunk's, not a manifest's"):
        parse_manifest("c:" + KEY)


# -- the disk-key format, held to the item format through a real NodeStore ------------------


def _chunk(store: NodeStore, sid: StoreId, version: int, seed: int) -> str:
    (c,) = encode_chunks({f"row-{seed}".encode(): b"v"}, [])
    key = chunk_key(sid, version, c.name)
    store.put_chunk(key, c.data)
    return key


def _manifest(sid: StoreId, version: int, kind: str, epoch: int) -> Manifest:
    refs = (ChunkRef(f"d0-{version:016x}", 0, 9, 10, 10, 1, version),)
    return Manifest(sid, version, kind, epoch, 128, refs, {})


def test_storage_keys_are_pinned_and_hold_the_items() -> None:
    store = NodeStore(MemoryBackend())
    key = _chunk(store, SID, 7, 1)
    store.put_manifest(_manifest(SID, 7, "delta", 1))
    store.put_manifest(_manifest(SID, 7, "delta", 2))  # epoch 1 moves to a side key
    raw = set(store.backend.scan_keys(b""))
    path = b"q1/0/3/default"
    assert raw == {
        b"c:" + key.encode(),
        b"m:" + path + b"/00000000000000000007/delta",
        b"o:" + path + b"/00000000000000000007/delta/00000000000000000001",
        b"h:" + path,
    }
    # a chunk's storage key is its item name
    assert ChunkItem(key).name().encode() in raw
    want = {ManifestItem(SID, 7, "delta", 2), ManifestItem(SID, 7, "delta", 1)}
    assert set(store.manifest_items()) == want
    assert set(store.manifest_digests()) == {i.name() for i in want}
    records = {store.manifest_record_names(k) for k in store.manifest_records()}
    assert records == {(SID, 7, "delta", None), (SID, 7, "delta", 1)}
    assert store.counts() == {"chunks": 1, "manifests": 1, "stores": 1, "tombstones": 0}
    assert store.store_chunk_keys(SID) == [key]
    assert store.store_chunk_keys(StoreId("q2", 0, 0)) == []
    # every key the store counts against a query is one of the counted prefixes'
    assert {k[:2] for k in raw if query_of_key(k) == "q1"} == {b"c:", b"m:", b"o:"}


@settings(max_examples=60, deadline=None)
@given(
    sid=store_ids,
    versions=st.lists(
        st.tuples(st.integers(1, MAX_VERSION), st.sampled_from(KINDS), st.integers(0, MAX_EPOCH)),
        min_size=1,
        max_size=6,
        unique=True,
    ),
    chunk_versions=st.lists(st.integers(1, MAX_VERSION), max_size=3),
)
def test_items_round_trip_through_node_store_keys(
    sid: StoreId, versions: list[tuple[int, str, int]], chunk_versions: list[int]
) -> None:
    """What goes in as manifests and chunks comes back out of the storage keys as the same
    items, and each name a store lists parses back to something the store finds."""
    store = NodeStore(MemoryBackend())
    put = {ManifestItem(sid, v, kind, epoch) for v, kind, epoch in versions}
    for v, kind, epoch in versions:
        store.copy_manifest(_manifest(sid, v, kind, epoch))  # any epoch: replaced ones aside
    chunks = {ChunkItem(_chunk(store, sid, v, i)) for i, v in enumerate(chunk_versions)}
    assert set(store.manifest_items()) == put
    assert set(store.manifest_digests()) == {i.name() for i in put}
    assert {ChunkItem(k) for k in store.chunk_keys()} == chunks
    for item in {*put, *chunks}:
        parsed = parse(item.name())
        assert parsed == item
        if isinstance(parsed, ChunkItem):
            assert store.has_chunks([parsed.key]) == [True]
            assert Prefix.CHUNK + parsed.key.encode() in store.backend.scan_keys(Prefix.CHUNK)
        else:
            got = store.get_manifest(parsed.store, parsed.version, parsed.kind, parsed.epoch)
            assert got is not None and ManifestItem.of(got) == parsed
    for record in store.manifest_records():
        s, v, kind, epoch = store.manifest_record_names(record)
        assert any((i.store, i.version, i.kind) == (s, v, kind) for i in put)
        assert epoch is None or ManifestItem(s, v, kind, epoch) in put


def test_prefixes_are_two_distinct_bytes_and_quota_counts_data_only() -> None:
    prefixes = [v for k, v in vars(Prefix).items() if k.isupper()]
    assert len(prefixes) == len(set(prefixes)) == 10
    assert all(len(p) == 2 and p.endswith(b":") for p in prefixes)
    assert set(COUNTED_PREFIXES) == {Prefix.CHUNK, Prefix.MANIFEST, Prefix.REPLACED, Prefix.HINT}
