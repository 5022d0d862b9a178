"""Replication items (pure): what nodes copy to each other, and how they name it.

Repair, hand-overs, range digests and hint hand-offs all move *items*: a chunk, or one
epoch of one manifest. Nodes name them to each other in ``/v1/sync/have`` batches, in
``/v1/handover/items`` listings, and in range digests (which hash the names), so the form
below is a wire format and must not change:

    ``c:<chunk key>``                                a chunk (core/ids.chunk_key)
    ``m:<store path>/<version>/<kind>/<epoch>``      a manifest of one version, kind and
                                                     epoch (core/manifest.py, "Lineage":
                                                     every epoch held is an item of its own)

:class:`ChunkItem` and :class:`ManifestItem` are the two kinds; ``item.name()`` writes the
name and :func:`parse` reads one back. Built from values this node already checked (a key
it stores, a manifest it decoded), an item is not checked again: a repair pass builds one
per item held. A name from anywhere else goes through :func:`parse`, which refuses all but
the exact form ``name()`` writes (``name(parse(s)) == s``): ASCII digits without leading
zeros, no trailing newline, numbers within their limits, a known kind, a valid store.

:class:`Prefix` holds the first bytes of a replica's storage keys (node/replica.py's
layout). Only ``NodeStore`` builds keys from them (core/quota.py reads which count against
a query). A chunk's storage key is its item name: ``tests/unit/test_items.py`` holds the two
formats together through a real ``NodeStore``, so neither can drift alone.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Final, NamedTuple

from statestore.core.errors import InvalidRequest, MalformedData
from statestore.core.ids import MAX_EPOCH, MAX_VERSION, StoreId, parse_chunk_key
from statestore.core.manifest import Manifest

__all__ = [
    "CHUNK_TAG",
    "KINDS",
    "MANIFEST_TAG",
    "MAX_ITEM_NAME",
    "ChunkItem",
    "Item",
    "ManifestItem",
    "Prefix",
    "is_manifest",
    "parse",
    "parse_manifest",
    "placement_key",
]

CHUNK_TAG: Final = "c:"
MANIFEST_TAG: Final = "m:"
KINDS: Final = ("delta", "snapshot")
MAX_ITEM_NAME: Final = 1000  # the longest valid name is ~330 characters
# fullmatch only ("$" passes a trailing newline); no leading zero, so one number, one name
_NUMBER = re.compile(r"0|[1-9][0-9]{0,18}")


class Prefix:
    """The first bytes of a replica's storage keys, one per kind of record (the key layout
    is node/replica.py's docstring). Every prefix is two bytes."""

    CHUNK: Final = b"c:"  # + chunk key: a chunk's storage key is its item name
    MANIFEST: Final = b"m:"  # the highest epoch held of a version and kind
    REPLACED: Final = b"o:"  # a manifest a higher epoch replaced, kept beside it
    HEAD: Final = b"h:"
    FLOOR: Final = b"f:"
    THINNING: Final = b"l:"  # a store's thinning line (core/retention.Thinning)
    RETAIN: Final = b"r:"
    TOMBSTONE: Final = b"t:"
    HINT: Final = b"n:"  # a tentative commit's manifest and holders
    OUTCOME: Final = b"x:"  # what became of a tentative commit


class ChunkItem(NamedTuple):
    """One chunk, by its key (``store/version/name``, core/ids.chunk_key)."""

    key: str

    def name(self) -> str:
        return CHUNK_TAG + self.key

    @property
    def placement_key(self) -> str:
        """What placement hashes: the chunk key (each chunk has its own token)."""
        return self.key

    @property
    def store(self) -> StoreId:
        return _chunk_parts(self.key)[0]


class ManifestItem(NamedTuple):
    """One manifest held: a store's version, its kind (``delta`` or ``snapshot``) and the
    epoch it was written at."""

    store: StoreId
    version: int
    kind: str
    epoch: int

    @classmethod
    def of(cls, m: Manifest) -> ManifestItem:
        return cls(m.store, m.version, m.kind, m.epoch)

    def name(self) -> str:
        return f"{MANIFEST_TAG}{self.store.path}/{self.version}/{self.kind}/{self.epoch}"

    @property
    def placement_key(self) -> str:
        """What placement hashes: the store's path (a store's manifests live together)."""
        return self.store.path


Item = ChunkItem | ManifestItem


def is_manifest(name: str) -> bool:
    """Whether ``name`` is a manifest's (a look at its tag: nothing is validated)."""
    return name.startswith(MANIFEST_TAG)


def placement_key(name: str) -> str:
    """What placement hashes for the item ``name``, read without validating it (names this
    node built, or hashes of them): a chunk's key, a manifest's store path. Anything after
    a manifest's epoch (node/digests.py appends a content digest) is ignored."""
    if is_manifest(name):
        return "/".join(name[len(MANIFEST_TAG) :].split("/", 4)[:4])
    return name[len(CHUNK_TAG) :]


def parse(name: object) -> Item:
    """The item ``name`` names (the inverse of ``item.name()``).

    Raises:
        MalformedData: ``name`` is not exactly a name ``name()`` writes: another tag, a part
            missing or extra, a number with a sign, leading zero or trailing newline, a
            version above 2^62 or an epoch above 2^63-1, an unknown kind, a bad store or
            chunk key.
    """
    if not isinstance(name, str):
        raise MalformedData(f"an item name must be a string, got {type(name).__name__}")
    if len(name) > MAX_ITEM_NAME:
        raise MalformedData(
            f"item name {name[:40]!r}... is {len(name)} characters: the limit is {MAX_ITEM_NAME}"
        )
    if name.startswith(MANIFEST_TAG):
        return _manifest(name)
    if name.startswith(CHUNK_TAG):
        key = name[len(CHUNK_TAG) :]
        try:
            _chunk_parts(key)
        except InvalidRequest as exc:  # InvalidStoreId, or a version out of range
            raise MalformedData(f"item {name!r:.80} names no chunk: {exc}") from exc
        return ChunkItem(key)
    raise MalformedData(
        f"item {name!r:.80} is neither c:<chunk key> nor m:<store>/<version>/<kind>/<epoch>"
    )


def parse_manifest(name: object) -> ManifestItem:
    """:func:`parse` for a name that must be a manifest's (MalformedData otherwise)."""
    item = parse(name)
    if not isinstance(item, ManifestItem):
        raise MalformedData(f"item {name!r:.80} is a chunk's, not a manifest's")
    return item


def _manifest(name: str) -> ManifestItem:
    parts = name[len(MANIFEST_TAG) :].split("/")
    if len(parts) != 7:
        raise MalformedData(
            f"item {name!r:.80} is not m:<query>/<operator>/<partition>/<name>/<version>/"
            "<kind>/<epoch>"
        )
    path = "/".join(parts[:4])
    version, kind, epoch = parts[4:]
    try:
        store = _store(path)
    except InvalidRequest as exc:
        raise MalformedData(f"item {name!r:.80}: {exc}") from exc
    if store.path != path:
        raise MalformedData(f"item {name!r:.80}: write its store as {store.path}")
    if kind not in KINDS:
        raise MalformedData(f"item {name!r:.80}: kind {kind!r:.20} is not delta or snapshot")
    return ManifestItem(
        store,
        _number(name, "version", version, MAX_VERSION),
        kind,
        _number(name, "epoch", epoch, MAX_EPOCH),
    )


def _number(name: str, what: str, text: str, limit: int) -> int:
    if not _NUMBER.fullmatch(text) or int(text) > limit:
        raise MalformedData(
            f"item {name!r:.80}: {what} {text!r:.30} is not a number in 0..{limit} "
            "(ASCII digits, no leading zero)"
        )
    return int(text)


@lru_cache(maxsize=4096)
def _store(path: str) -> StoreId:
    """StoreId.parse, remembered: a node names many items of each store it holds."""
    return StoreId.parse(path)


# parse_chunk_key, remembered for a batch (repair parses a name, then asks for its store)
_chunk_parts = lru_cache(maxsize=4096)(parse_chunk_key)
