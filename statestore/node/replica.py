"""A node's replica of the ring's data: chunks, manifests, heads and retention floors over one
byte backend (node/backends.py), with the replica rules: fencing by epoch, idempotent
re-commits, checksums verified on read.

Keys:  ``c:<store>/<version>/<chunk name>``  chunk bytes (checksum in the name, re-verified on read)
       ``m:<store>/<version, 20 digits>/<kind>``  manifest (msgpack, wire/manifest.py): the
                                             highest epoch held of that version and kind
       ``o:<store>/<version, 20>/<kind>/<epoch, 20>``  a manifest of a lower epoch that a
                                             higher one replaced: kept, never destroyed, until
                                             retention drops the version (core/manifest.py,
                                             "Lineage": a later version may be built on it)
       ``h:<store>``                         head, msgpack ``[epoch, version]`` (wire/head.py)
       ``f:<store>``                         retention floor: versions below it are gone
       ``l:<store>``                         thinning, ``<below> <every> <chunks> <floor>``:
                                             the snapshots core/retention.Thinning drops are gone
       ``r:<store>``                         versions to retain, set by the writer (else --retain)
                                             (the h, f, l and r records are sealed as manifests
                                             are since disk format 3; a rotted one: see _unseal)
       ``t:<query>``                         tombstone of a dropped query (node/tombstones.py)
       ``n:<store>/<epoch, 20>/<version, 20>/<kind>``  hint: a tentative commit's manifest
                                             and its holders, until handed off (node/hints.py)
       ``x:<store>/<epoch, 20>/<version, 20>``  outcome of a tentative commit (core/tentative)

Only this class builds or reads these keys, from the prefixes of core/items.Prefix; other
modules ask it (:meth:`NodeStore.manifest_items`, :meth:`NodeStore.counts`, ...). A chunk's
key is its replication item's name (core/items.py); a manifest's is not (its version
zero-padded, its epoch in the value or in an ``o:`` key): :meth:`NodeStore.manifest_items`
translates.

Every write goes through :meth:`NodeStore._write`, which keeps the bytes each query holds
(chunks and manifests, replaced epochs included: core/quota.py) up to date and, for a
writer's chunk or manifest, refuses one that would take its query past a quota
(QuotaExceeded, nothing written). The counters are rebuilt from a scan of value sizes when
the store opens.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence

import xxhash

from statestore.core.chunk import verify
from statestore.core.errors import (
    CorruptChunk,
    InvalidRequest,
    InvalidStoreId,
    MalformedData,
    NodeUnavailable,
    QuotaExceeded,
    StaleEpoch,
    VersionConflict,
)
from statestore.core.hints import MAX_HINTS, MAX_HINTS_PER_QUERY, admit
from statestore.core.ids import StoreId, chunk_key, parse_chunk_key
from statestore.core.items import ManifestItem, Prefix
from statestore.core.manifest import Head, Manifest, lineage
from statestore.core.quota import (
    COUNTED_PREFIXES,
    RECORD_SEAL,
    Usage,
    charges,
    check,
    query_of_key,
)
from statestore.core.repair import content_digest
from statestore.core.retention import MAX_RETAIN, Thinning, check_floor, usable_snapshots
from statestore.core.tentative import Outcome
from statestore.node.backends import Backend
from statestore.wire.head import decode_stored, encode_stored
from statestore.wire.manifest import decode_manifest, encode_manifest, manifest_epoch
from statestore.wire.tentative import decode_hint, decode_outcomes, encode_hint, encode_outcomes

__all__ = ["NodeStore"]


# Every storage key is built and read here, from core/items.Prefix; core/quota.py reads
# which of them count against a query.
_MANIFESTS = (Prefix.MANIFEST, Prefix.REPLACED)  # a version's highest epoch, and the others


def _key(prefix: bytes, text: str) -> bytes:
    return prefix + text.encode()


def _under(prefix: bytes, path: str) -> bytes:
    """The prefix of every key of ``prefix``'s kind under ``path`` (a store, or a query)."""
    return _key(prefix, f"{path}/")


def _ckey(key: str) -> bytes:
    return _key(Prefix.CHUNK, key)


def _mkey(store: StoreId, version: int, kind: str) -> bytes:
    return _key(Prefix.MANIFEST, f"{store.path}/{version:020d}/{kind}")


def _okey(store: StoreId, version: int, kind: str, epoch: int) -> bytes:
    return _key(Prefix.REPLACED, f"{store.path}/{version:020d}/{kind}/{epoch:020d}")


log = logging.getLogger(__name__)

# A stored manifest is sealed: 0x70 (no manifest starts with it: an encoded one starts with a
# msgpack map header, which is 4 or more flipped bits away), xxh3-64 of the manifest's
# bytes, then the bytes. A bit flipped on disk then makes the record unreadable instead of
# another manifest that decodes (another epoch, a chunk's checksum): such a manifest was
# served, copied by repair over the good copies of the other replicas as a higher epoch, and
# an acknowledged version was lost (statestore-sim seed 240856282107648). Records written
# before seals (a msgpack map first) are read as they are.
_SEAL = b"\x70"
_SEALED = RECORD_SEAL  # the seal byte and the digest


def _seal(body: bytes) -> bytes:
    return _SEAL + xxhash.xxh3_64_digest(body) + body


def key_rotted(backend: Backend, key: bytes, puts: Mapping[bytes, bytes] | None = None) -> bool:
    """Whether a sealed record is held under ``key`` whose seal does not match."""
    raw = puts[key] if puts is not None and key in puts else backend.get(key)
    return raw is not None and _opened(raw, key.startswith(Prefix.HINT)) is None


def _opened(raw: bytes | None, hint: bool = False) -> bytes | None:
    """The manifest bytes of a stored record, or None (absent, or rotted: the scrub replaces
    it from a replica, node/scrub.py). ``hint``: a hint's record (core/tentative.py), sealed
    the same way; unsealed ones start with a 2-array header (0x92, 4 bits from the seal)."""
    if raw is None:
        return None
    if raw[:1] == _SEAL:
        body = raw[_SEALED:]
        good = len(raw) >= _SEALED and xxhash.xxh3_64_digest(body) == raw[1:_SEALED]
        return body if good else None
    if hint:
        return raw if raw[:1] == b"\x92" else None
    return raw if raw[:1] and (0x80 <= raw[0] <= 0x8F or raw[0] in (0xDE, 0xDF)) else None


# A store's head, floor, thinning line and retention are sealed the same way since disk
# format 3: one flipped bit made another record that still parsed (a floor raised drops
# retained versions, a head's epoch raised fences every writer). Records written before (a
# msgpack array or ASCII digits, neither starting with the seal byte) are read as they are.
def _unseal(raw: bytes) -> bytes | None:
    """The body of a sealed store record, ``raw`` itself for one written before seals, None
    when its seal does not match (rotted)."""
    if raw[:1] != _SEAL:
        return raw
    body = raw[_SEALED:]
    return body if len(raw) >= _SEALED and xxhash.xxh3_64_digest(body) == raw[1:_SEALED] else None


_told: set[tuple[str, StoreId]] = set()  # rotted records logged (once each per process)


def _rotted(what: str, store: StoreId, instead: str) -> None:
    if (what, store) in _told:
        return
    _told.add((what, store))
    log.warning(
        "the %s record of %s is rotted on disk (its seal does not match): %s; rewritten at "
        "its next change",
        what,
        store,
        instead,
    )


def _head_record(raw: bytes) -> Head | None:
    """A stored head, or None when its record is rotted (seal or decoding)."""
    body = _unseal(raw)
    if body is None:
        return None
    try:
        return decode_stored(body)
    except MalformedData:
        return None


def _epoch_of(body: bytes | None) -> int | None:
    """The epoch of a manifest record's bytes, None when absent or undecodable."""
    if body is None:
        return None
    try:
        return manifest_epoch(body)
    except MalformedData:
        return None


def _line(raw: bytes) -> Thinning | None:
    """A stored thinning line (``below every chunks floor``), or None when rotted."""
    body = _unseal(raw)
    fields = body.split() if body is not None else []
    if len(fields) != 4 or not all(f.isdigit() for f in fields):
        return None
    below, every, chunks, floor = map(int, fields)
    return Thinning(below, every, chunks, floor)


def _number(raw: bytes) -> int | None:
    """A stored floor or retention (ASCII digits), or None when its record is rotted."""
    body = _unseal(raw)
    return int(body) if body is not None and body.isdigit() else None


def _nkey(store: StoreId, version: int, kind: str, epoch: int) -> bytes:
    return _key(Prefix.HINT, f"{store.path}/{epoch:020d}/{version:020d}/{kind}")


def _xkey(store: str, version: int, epoch: int) -> bytes:
    return _key(Prefix.OUTCOME, f"{store}/{epoch:020d}/{version:020d}")


def _skey(prefix: bytes, store: StoreId) -> bytes:
    """A per-store record's key: head, floor, retention."""
    return _key(prefix, store.path)


def _text(key: bytes) -> str:
    """A key without its (two-byte) prefix."""
    return key[len(Prefix.CHUNK) :].decode()


def _version_of(key: bytes) -> int:
    """The version in a chunk's or manifest's key (the store path holds exactly three
    slashes)."""
    return int(key.decode().split("/")[4])


MAX_THINNED_OFFERS = 100_000  # names kept in NodeStore.thinned_offers (~10 MB at most)
FLOORS_KEPT = 65536  # floors NodeStore keeps read (a few MB at most)


def _named_whole(held: Manifest, m: Manifest) -> bool:
    """Whether ``m`` is ``held`` (same version, epoch and content) named whole where
    ``held`` is not: a writer's whole commit laid out with ``s`` names before the ring read
    chunk format 3 and retried (or copied) with ``w`` names since. The chunks' bytes and
    checksums are the same; only the whole one is safe from thinning
    (core/manifest.Manifest.whole), so it replaces the other."""
    return m.whole and not held.whole and held.same_content(m)


def _manifest_parts(key: bytes) -> tuple[StoreId, int, str, list[str]]:
    """(store, version, kind, the rest) of an ``m:`` or ``o:`` key (the rest: an ``o:``
    key's epoch)."""
    parts = _text(key).split("/")
    return StoreId.parse("/".join(parts[:4])), int(parts[4]), parts[5], parts[6:]


class NodeStore:
    """The node's chunks, manifests, heads and floors over one backend.

    Writes are meant to run on a single writer thread: the fencing check and the write happen
    in one call, so two manifests for the same store cannot interleave.
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._lock = threading.Lock()
        self.usage = Usage.from_sizes(
            item for prefix in COUNTED_PREFIXES for item in backend.scan_sizes(prefix)
        )
        self._hints = len(backend.scan_keys(Prefix.HINT))
        # hints held per query (core/hints.admit: a query's fair share)
        self._hint_queries: Counter[str] = Counter(
            q for k in backend.scan_keys(Prefix.HINT) if (q := query_of_key(k)) is not None
        )
        # the item names of folded snapshots a copy offered that this node's thinning
        # dropped (refused by copy_manifests): a hand-over counts them as held once offered,
        # where it could not tell them from whole ones before (node/moves/join._held)
        self.thinned_offers: set[str] = set()
        # the floors read, kept (a lookup checks its store's floor each time): a write of
        # any floor forgets them all and moves the generation, so that a read racing it
        # keeps nothing it read before
        self._floors: dict[StoreId, int] = {}
        self._floors_gen = 0
        self._floors_lock = threading.Lock()

    def _write(
        self,
        puts: Mapping[bytes, bytes],
        deletes: Sequence[bytes] = (),
        limit: int | None = None,
    ) -> None:
        """Apply one atomic write and count its bytes per query. With ``limit`` (the quota
        of the query written to), a write that adds bytes past it raises QuotaExceeded and
        writes nothing."""
        touched = [k for k in {*puts, *deletes} if query_of_key(k) is not None]
        with self._lock:
            old = self.backend.sizes(touched) if touched else {}
            deltas = charges(old, {k: len(puts[k]) for k in touched if k in puts}, deletes)
            if limit is not None:
                for query, delta in deltas.items():
                    check(query, self.usage.of(query), delta, limit)
            self.backend.write(puts, deletes)
            self.usage.apply(deltas)
            if any(k.startswith(Prefix.FLOOR) for k in (*puts, *deletes)):
                with self._floors_lock:
                    self._floors_gen += 1
                    self._floors.clear()
            # hint keys are counted keys, so ``old`` says which existed
            for k in puts:
                if k.startswith(Prefix.HINT) and old.get(k) is None:
                    self._hints += 1
                    self._hint_queries[query_of_key(k) or ""] += 1
            for k in deletes:
                if k.startswith(Prefix.HINT) and old.get(k) is not None and k not in puts:
                    self._hints -= 1
                    q = query_of_key(k) or ""
                    self._hint_queries[q] -= 1
                    if self._hint_queries[q] <= 0:
                        del self._hint_queries[q]

    def held_bytes(self) -> int:
        """Bytes of chunks and manifests held, every query's."""
        return sum(self.usage.snapshot().values())

    def query_bytes(self, query: str) -> int:
        """Bytes of chunks and manifests this node holds for ``query``."""
        return self.usage.of(query)

    # -- chunks --------------------------------------------------------------------------
    def put_chunk(
        self, key: str, data: bytes, limit: int | None = None, copy: bool = False
    ) -> bool:
        """Store a verified chunk; ``limit``: its query's quota (None: not charged, as for
        repair's copies). A copy (``copy``: repair's, a hand-over's) of a version below the
        store's floor here is not kept (what retention dropped does not come back from a
        node that did not take the floor yet). Returns whether it was stored."""
        store, version, name = parse_chunk_key(key)
        verify(data, int(name.split("-", 1)[1], 16), key)
        if copy and version < self.floor(store):
            return False
        self._write({_ckey(key): data}, limit=limit)
        return True

    def get_chunk(self, key: str) -> bytes | None:
        """The chunk's bytes, re-verified; raises CorruptChunk if they rotted on disk."""
        _, _, name = parse_chunk_key(key)
        data = self.backend.get(_ckey(key))
        if data is not None:
            verify(data, int(name.split("-", 1)[1], 16), key)
        return data

    def get_chunk_part(self, key: str, offset: int, length: int) -> tuple[bytes, int] | None:
        """Bytes ``offset`` to ``offset + length - 1`` of a chunk, and its size (None if not
        held). Not re-verified here: a part (a blocked chunk's index or block) is verified by
        its reader against the checksum the manifest or the index gives, and the scrub
        verifies whole chunks at rest; a bad part makes the reader fail over."""
        parse_chunk_key(key)
        return self.backend.get_range(_ckey(key), offset, length)

    def get_chunk_parts(
        self, key: str, spans: Sequence[tuple[int, int]]
    ) -> tuple[list[bytes], int] | None:
        """:meth:`get_chunk_part` of several ``(offset, length)`` spans of one chunk, read
        at once (a lookup's blocks of one chunk: one read of storage, not one a block)."""
        parse_chunk_key(key)
        return self.backend.get_ranges(_ckey(key), spans)

    def has_chunks(self, keys: Sequence[str]) -> list[bool]:
        """Whether each chunk is held: one read of the keys, no chunk's bytes copied (a
        hand-over's check of 1 GiB took 2 s on the event loop when it read every value)."""
        sizes = self.backend.sizes([_ckey(k) for k in keys])
        return [sizes[_ckey(k)] is not None for k in keys]

    def chunk_keys(self) -> list[str]:
        return [_text(k) for k in self.backend.scan_keys(Prefix.CHUNK)]

    def store_chunk_keys(self, store: StoreId) -> list[str]:
        """The keys of the chunks held of ``store`` (a key scan)."""
        return [_text(k) for k in self.backend.scan_keys(_under(Prefix.CHUNK, store.path))]

    def chunk_sizes(self) -> list[tuple[str, int]]:
        """Every chunk held, with its size (a key scan: no value is read)."""
        return [(_text(k), n) for k, n in self.backend.scan_sizes(Prefix.CHUNK)]

    def delete_chunks(self, keys: Sequence[str]) -> None:
        self._write({}, [_ckey(k) for k in keys])

    # -- manifests -----------------------------------------------------------------------
    def _mget(self, key: bytes) -> bytes | None:
        """A manifest record's bytes (:func:`_opened`: None when absent or rotted)."""
        return _opened(self.backend.get(key))

    def _mscan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The manifest records under ``prefix`` with their bytes, rotted ones left out."""
        for k, raw in self.backend.scan(prefix):
            body = _opened(raw)
            if body is not None:
                yield k, body

    def put_manifest(self, m: Manifest, limit: int | None = None, compaction: bool = False) -> bool:
        """Store ``m`` unless fenced (and within ``limit``, its query's quota, if given).
        Returns False when it was already there (idempotent). ``compaction``: a compactor's
        snapshot, fenced by the head's lineage rather than by the head's epoch
        (:meth:`_fence_head`).

        A manifest of the same version and kind at a lower epoch is not destroyed: it moves to
        a side key (``o:``) and stays part of the store's manifests, since a later version may
        have been built on it (core/manifest.py, "Lineage").

        Raises StaleEpoch if the store's head has a higher epoch, or a manifest of the same
        version has one; VersionConflict if the same version and epoch carry other content.
        """
        head = self._fence_head(m, compaction and m.kind == "snapshot")
        if m.kind == "snapshot" and not m.whole and self.thinned(m.store, m.version):
            raise InvalidRequest(
                f"{m.store} keeps no snapshot of version {m.version}: thinning dropped it "
                "(core/retention.Thinning)"
            )
        stored = self.backend.get(_mkey(m.store, m.version, m.kind))  # one read for both checks
        raw_old = _opened(stored)
        if stored is not None and raw_old is None:
            raise NodeUnavailable(
                f"this replica's record of {m.store} v{m.version} ({m.kind}) is rotted on disk "
                "until the scrub puts a replica's copy back: it takes no write of that version"
            )
        if raw_old is not None:
            old = decode_manifest(raw_old)
            if old.epoch > m.epoch:
                raise StaleEpoch(
                    f"store {m.store} version {m.version} was committed at epoch {old.epoch}; "
                    f"epoch {m.epoch} cannot overwrite it"
                )
            if old.epoch == m.epoch:
                if old.same_content(m):
                    if _named_whole(old, m):
                        self._write({_mkey(m.store, m.version, m.kind): _seal(encode_manifest(m))})
                        return True
                    return False
                raise VersionConflict(
                    f"store {m.store} version {m.version} already holds other content at "
                    f"epoch {m.epoch}: commit a new version, or take a higher epoch to replace it"
                )
        if self._below_floor(m, self._mget):
            # on the writer thread: a floor raised since the handler's own check counts
            raise InvalidRequest(
                f"{m.store} version {m.version} is below retention here (floor "
                f"{self.floor(m.store)}, the versions below it dropped): restore a newer "
                "version and commit on it"
            )
        puts = {_mkey(m.store, m.version, m.kind): _seal(encode_manifest(m))}
        if raw_old is not None:
            puts[_okey(m.store, m.version, m.kind, old.epoch)] = _seal(raw_old)
        if head is None or (m.epoch, m.version) > head.key():
            puts[_skey(Prefix.HEAD, m.store)] = _seal(encode_stored(Head(m.version, m.epoch)))
        self._write(puts, limit=limit)
        return True

    def below_floor(self, m: Manifest) -> bool:
        """Whether ``m`` is of what retention dropped here (:meth:`_below_floor`): a copy of
        it is refused."""
        return self._below_floor(m, self._mget)

    def _below_floor(self, m: Manifest, get: Callable[[bytes], bytes | None]) -> bool:
        """Whether ``m`` is of what retention dropped here: below the store's floor, or a
        delta at the floor whose base, the version below, is gone, unless a snapshot at the
        floor of its own epoch holds its state (its chain ends there). A newer writer that
        restored the version below the floor before the floor rose, and commits on it, is
        refused: its version could never be restored. ``get``: a manifest record's bytes."""
        floor = self.floor(m.store)
        if m.version < floor:
            return True
        if m.kind != "delta" or m.version != floor:
            return False
        raw = get(_mkey(m.store, floor, "snapshot"))
        if raw is not None and manifest_epoch(raw) == m.epoch:
            return False
        return get(_okey(m.store, floor, "snapshot", m.epoch)) is None

    def _fence_head(self, m: Manifest, folded: bool = False) -> Head | None:
        """The store's head; StaleEpoch if its epoch is above ``m``'s. ``folded``: ``m`` is
        a compactor's snapshot, the state at its version of the chain the ring resolved;
        it is taken under a head of a higher epoch where the head's line of descent passes
        through its version at its epoch (core/manifest.lineage): a newer writer that took
        over above that version built on it, so it is the state every retained version
        above it reads. Fenced by the head's epoch, a rung below the version a new writer
        started at (core/retention.py) was refused every pass, and the floor stopped
        rising. A snapshot of a dead branch (the newer writer re-committed its version)
        is off the lineage and refused as before."""
        head = self.head(m.store)
        if head is not None and m.epoch < head.epoch:
            if folded and lineage(*self.manifests(m.store)).get(m.version) == m.epoch:
                return head
            raise StaleEpoch(
                f"store {m.store} is at epoch {head.epoch}; a writer with epoch {m.epoch} is "
                "fenced: a newer writer took over, so stop this one"
            )
        return head

    def copy_manifest(self, m: Manifest, limit: int | None = None) -> bool:
        """Keep a copy of ``m`` that another replica holds (repair), whatever its epoch: not a
        writer's commit, so not fenced. The highest epoch of a version and kind is the main
        key, the others side keys. Returns False when this epoch was already held.
        ``limit``: a hand-off's, charged to the quota (None: a copy between owners)."""
        return self.copy_manifests([m], limit)[0]

    def copy_manifests(self, ms: Sequence[Manifest], limit: int | None = None) -> list[bool]:
        """:meth:`copy_manifest` for each of ``ms``, in one atomic write (one fsync for a
        hand-over's batch, node/moves/copies.py); each sees the ones before it. ``limit``: a
        hand-off's, charged to the quota (QuotaExceeded past it, nothing written)."""
        puts: dict[bytes, bytes] = {}

        def get(key: bytes) -> bytes | None:  # a manifest record's bytes
            return _opened(puts[key]) if key in puts else self._mget(key)

        out = []
        for m in ms:
            main_key = _mkey(m.store, m.version, m.kind)
            if self._below_floor(m, get):
                out.append(False)  # retention dropped it here (a floor raised meanwhile)
                continue
            if m.kind == "snapshot" and not m.whole and self.thinned(m.store, m.version):
                out.append(False)  # thinning dropped it here: not brought back
                if len(self.thinned_offers) >= MAX_THINNED_OFFERS:
                    self.thinned_offers.clear()  # a memo: offered again, refused again
                self.thinned_offers.add(ManifestItem.of(m).name())
                continue
            if key_rotted(self.backend, main_key, puts):
                out.append(False)  # the scrub puts a replica's copy back first
                continue
            raw_main = get(main_key)
            main_epoch = None if raw_main is None else manifest_epoch(raw_main)
            side_key = _okey(m.store, m.version, m.kind, m.epoch)
            held = raw_main if main_epoch == m.epoch else None
            if held is None and raw_main is not None:
                held = get(side_key)
            if held is not None:
                renamed = m.whole and _named_whole(decode_manifest(held), m)
                if renamed:  # the same state, now named whole: only safer
                    puts[main_key if main_epoch == m.epoch else side_key] = _seal(
                        encode_manifest(m)
                    )
                out.append(renamed)
                continue
            raw = _seal(encode_manifest(m))
            if main_epoch is None or main_epoch < m.epoch:
                puts[main_key] = raw
                if raw_main is not None and main_epoch is not None:
                    puts[_okey(m.store, m.version, m.kind, main_epoch)] = _seal(raw_main)
            else:
                puts[_okey(m.store, m.version, m.kind, m.epoch)] = raw
            hkey = _skey(Prefix.HEAD, m.store)
            head = _head_record(puts[hkey]) if hkey in puts else self.head(m.store)
            if head is None or (m.epoch, m.version) > head.key():
                puts[hkey] = _seal(encode_stored(Head(m.version, m.epoch)))
            out.append(True)
        if puts:
            self._write(puts, limit=limit)
        return out

    def copy_manifests_charged(
        self, ms: Sequence[Manifest], limits: Mapping[str, int | None]
    ) -> list[bool | None]:
        """A hand-off's batch (node/moves/copies.py): each of ``ms`` copied alone, held to its
        query's quota in ``limits``; None for one refused by it (nothing of it written)."""
        out: list[bool | None] = []
        for m in ms:
            try:
                out.append(self.copy_manifests([m], limits.get(m.store.query))[0])
            except QuotaExceeded:
                out.append(None)
        return out

    def get_manifest(
        self, store: StoreId, version: int, kind: str, epoch: int | None = None
    ) -> Manifest | None:
        """The manifest of ``version`` and ``kind``: the highest epoch held, or the one of
        ``epoch`` (main or side key)."""
        raw = self.raw_manifest(store, version, kind, epoch)
        return decode_manifest(raw) if raw is not None else None

    def manifests(
        self, store: StoreId
    ) -> tuple[dict[int, list[Manifest]], dict[int, list[Manifest]]]:
        """Every manifest held of ``store``, deltas and snapshots by version: each version's
        highest epoch first, then the ones it replaced (side keys), highest first."""
        deltas: dict[int, list[Manifest]] = {}
        snaps: dict[int, list[Manifest]] = {}
        for prefix in _MANIFESTS:
            for _, raw in self._mscan(_under(prefix, store.path)):
                m = decode_manifest(raw)
                (deltas if m.kind == "delta" else snaps).setdefault(m.version, []).append(m)
        for table in (deltas, snaps):
            for ms in table.values():
                ms[1:] = sorted(ms[1:], key=lambda m: -m.epoch)
        return deltas, snaps

    def versions(self, store: StoreId) -> list[int]:
        out = set()
        for k in self.backend.scan_keys(_under(Prefix.MANIFEST, store.path)):
            out.add(_version_of(k))
        return sorted(out)

    def snapshot_versions(self, store: StoreId) -> list[int]:
        """The versions this node holds a snapshot manifest of (a key scan), in order."""
        out = set()
        for prefix in _MANIFESTS:
            for k in self.backend.scan_keys(_under(prefix, store.path)):
                _, version, kind, _ = _manifest_parts(k)
                if kind == "snapshot":
                    out.add(version)
        return sorted(out)

    def manifest_names(self, store: StoreId) -> list[bytes]:
        """The keys of every manifest held of ``store`` (no decoding): they change whenever
        what :meth:`manifests` returns does."""
        return [
            k for prefix in _MANIFESTS for k in self.backend.scan_keys(_under(prefix, store.path))
        ]

    def head(self, store: StoreId) -> Head | None:
        raw = self.backend.get(_skey(Prefix.HEAD, store))
        if raw is None:
            return None
        head = _head_record(raw)
        if head is None:
            # every manifest moves the head up to its (epoch, version): the highest one held
            # is what the record said while the head's own manifest is held (one handed off,
            # or rotted too, leaves it lower: this replica fences less until the next commit)
            held = [
                (epoch, _manifest_parts(k)[1])
                for prefix in _MANIFESTS
                for k, v in self.backend.scan(_under(prefix, store.path))
                if (epoch := _epoch_of(_opened(v))) is not None
            ]
            head = Head(max(held)[1], max(held)[0]) if held else None
            _rotted("head", store, f"the highest manifest held, {head}, taken instead")
        return head

    def stores(self) -> list[StoreId]:
        return [StoreId.parse(_text(k)) for k in self.backend.scan_keys(Prefix.HEAD)]

    def manifest_keys(self) -> list[tuple[StoreId, int, str]]:
        """(store, version, kind) of every version and kind held (one per main key)."""
        out = []
        for k in self.backend.scan_keys(Prefix.MANIFEST):
            store, version, kind, _ = _manifest_parts(k)
            out.append((store, version, kind))
        return out

    def manifest_items(self) -> list[ManifestItem]:
        """Every manifest held as repair names it (core/items.py), replaced ones included:
        a version's highest epoch first (read from its value), then the replaced ones."""
        out = []
        for k, raw in self._mscan(Prefix.MANIFEST):
            store, version, kind, _ = _manifest_parts(k)
            try:
                held = manifest_epoch(raw)
            except MalformedData:  # rotted on disk: the scrub replaces it (node/scrub.py)
                continue
            out.append(ManifestItem(store, version, kind, held))
        for k in self.backend.scan_keys(Prefix.REPLACED):
            store, version, kind, (epoch,) = _manifest_parts(k)
            out.append(ManifestItem(store, version, kind, int(epoch)))
        return out

    def raw_manifest(
        self, store: StoreId, version: int, kind: str, epoch: int | None = None
    ) -> bytes | None:
        """The stored bytes of a manifest: the highest epoch of ``version`` and ``kind``, or
        the one of ``epoch``."""
        raw = self._mget(_mkey(store, version, kind))
        if epoch is None or (raw is not None and manifest_epoch(raw) == epoch):
            return raw
        return self._mget(_okey(store, version, kind, epoch))

    def manifest_digests(self) -> dict[str, int]:
        """The content digest (core/repair.content_digest) of every manifest held, replaced
        ones included, by repair's item name ``m:<store>/<version>/<kind>/<epoch>``."""
        out = {}
        for prefix in _MANIFESTS:
            for _, raw in self._mscan(prefix):
                try:
                    m = decode_manifest(raw)
                except (MalformedData, InvalidStoreId, ValueError):
                    continue
                item = ManifestItem(m.store, m.version, m.kind, m.epoch).name()
                out[item] = content_digest(m.kind, [c.checksum for c in m.chunks])
        return out

    def replace_manifest(self, m: Manifest, expected: int) -> bool:
        """Repair's reconciliation: hold ``m`` in place of the manifest of the same version,
        kind and epoch whose content digest is ``expected`` (another content than the one W
        owners hold: core/repair.acknowledged). False (nothing written) when what is held
        there is no longer that one."""
        main = _mkey(m.store, m.version, m.kind)
        raw = self._mget(main)
        key = main if raw is not None and manifest_epoch(raw) == m.epoch else None
        if key is None:
            key = _okey(m.store, m.version, m.kind, m.epoch)
            raw = self._mget(key)
        if raw is None:
            return False
        old = decode_manifest(raw)
        if content_digest(old.kind, [c.checksum for c in old.chunks]) != expected:
            return False
        self._write({key: _seal(encode_manifest(m))})
        return True

    # -- retention -----------------------------------------------------------------------
    def retain(self, store: StoreId, if_rotted: int | None = MAX_RETAIN) -> int | None:
        """How many versions the store's writer asked to keep (None: the node's default);
        ``if_rotted`` when its record rotted (MAX_RETAIN: nothing dropped)."""
        raw = self.backend.get(_skey(Prefix.RETAIN, store))
        if raw is None:
            return None
        got = _number(raw)
        if got is None:  # not --retain: the compactor would raise the floor ring-wide by it
            _rotted(
                "retention",
                store,
                f"{MAX_RETAIN} (nothing dropped) taken until its writer's next commit or a peer's",
            )
            return if_rotted
        return got

    def set_retain(self, store: StoreId, versions: int) -> None:
        if self.retain(store) != versions:
            self._write({_skey(Prefix.RETAIN, store): _seal(str(versions).encode())}, [])

    def retains_to_adopt(self, retains: dict[StoreId, int], default: int) -> dict[StoreId, int]:
        """Of a peer's writer-set ``retain`` values, those this node would take: each above
        both what it holds (none: 0) and ``default`` (the node's ``--retain``). A peer's value
        only ever makes a store keep more: its record carries no date, and a stale lower one
        (a replica that missed the writer's raise) must not make the store keep less than
        this node would anyway; the writer's own commits set it either way."""
        return {
            store: n
            for store, n in retains.items()
            if n > max(self.retain(store, if_rotted=None) or 0, default)
        }

    def adopt_retains(self, retains: dict[StoreId, int], default: int) -> int:
        """Take what :meth:`retains_to_adopt` keeps (checked again here, on the writer
        thread). Returns how many were taken."""
        puts = {
            _skey(Prefix.RETAIN, store): _seal(str(n).encode())
            for store, n in self.retains_to_adopt(retains, default).items()
        }
        if puts:
            self._write(puts, [])
        return len(puts)

    def floor(self, store: StoreId) -> int:
        kept = self._floors.get(store)
        if kept is not None:
            return kept
        began = self._floors_gen
        raw = self.backend.get(_skey(Prefix.FLOOR, store))
        got = 0 if raw is None else _number(raw)
        if got is None:  # 0 drops nothing and refuses no copy; the next gc raises it again
            _rotted("floor", store, "0 taken until the next gc")
            return 0
        with self._floors_lock:
            if self._floors_gen == began:
                if len(self._floors) >= FLOORS_KEPT:
                    self._floors.clear()
                self._floors[store] = got
        return got

    def check_floor(self, store: StoreId, floor: int) -> None:
        """InvalidRequest unless raising ``store``'s floor to ``floor`` keeps every version
        this replica holds of it restorable (core/retention.check_floor): not above its
        head, at a snapshot of the head's line of descent (one of the head's own epoch is,
        its epoch read without decoding; another is checked against the lineage, every
        manifest of the store decoded: a dead branch's snapshot, an older writer's that a
        newer one rewound below, would drop the newer writer's versions under it), and not
        within the versions its writer keeps (its ``retain``, as this replica holds it: a
        compactor that missed a raise plans with the lower value; without one, the
        compactor's ``--retain`` decides). Nothing to check where this node holds no
        manifest of the store (its caller asks the home replicas)."""
        if floor <= self.floor(store):
            return  # nothing would be dropped
        head = self.head(store)
        if head is None:
            return
        raw = self.raw_manifest(store, floor, "snapshot")
        held = raw is not None and manifest_epoch(raw) == head.epoch
        if raw is not None and not held:
            deltas, snapshots = self.manifests(store)
            held = floor in usable_snapshots(snapshots, deltas)
        check_floor(store, floor, head.version, held, self.retain(store))

    def raise_floor(self, store: StoreId, floor: int) -> int:
        """:meth:`apply_floor` once :meth:`check_floor` holds, the two on the writer thread:
        a write that lands between a caller's own check and the floor's write (a newer
        writer's delta at the floor, whose base the floor drops) is seen. Returns items
        dropped."""
        self.check_floor(store, floor)
        return self.apply_floor(store, floor)

    def apply_floor(self, store: StoreId, floor: int) -> int:
        """Drop every manifest and chunk of ``store`` below ``floor``, unchecked (a floor a
        peer or a compactor sends goes through :meth:`raise_floor`). Returns items
        dropped."""
        if floor <= self.floor(store):
            floor = self.floor(store)
        drop: list[bytes] = []
        for prefix in _MANIFESTS:
            for k in self.backend.scan_keys(_under(prefix, store.path)):
                if _version_of(k) < floor:
                    drop.append(k)
        for k in self.backend.scan_keys(_under(Prefix.CHUNK, store.path)):
            if _version_of(k) < floor:
                drop.append(k)
        self._write({_skey(Prefix.FLOOR, store): _seal(str(floor).encode())}, drop)
        return len(drop)

    def thinning(self, store: StoreId) -> Thinning:
        raw = self.backend.get(_skey(Prefix.THINNING, store))
        if raw is None:
            return Thinning()
        line = _line(raw)
        if line is None:
            # no line drops nothing; a peer's sync/have (repair) or the compactor's next gc
            # gives it back. Meanwhile :meth:`thinned` refuses older snapshots and the
            # compactor draws no line here (:meth:`thinning_lost`)
            _rotted("thinning", store, "no line taken until a peer's or the compactor's")
            return Thinning()
        return line

    def thinning_lost(self, store: StoreId) -> bool:
        """Whether the store's thinning line is held but rotted: its spacing is unknown, so
        no new line is drawn from this node's settings (one dropped under the old spacing
        could be a rung under another)."""
        raw = self.backend.get(_skey(Prefix.THINNING, store))
        return raw is not None and _line(raw) is None

    def lost_lines(self) -> list[StoreId]:
        """The stores whose thinning line is held but rotted (:meth:`thinning_lost`): one
        scan of the line records, a few bytes a store that has one."""
        return [
            StoreId.parse(_text(k))
            for k, raw in self.backend.scan(Prefix.THINNING)
            if _line(raw) is None
        ]

    def thinned(self, store: StoreId, version: int) -> bool:
        """Whether a snapshot of ``version`` is one the store's thinning dropped. While the
        line is lost (:meth:`thinning_lost`), every snapshot below the head counts as
        dropped: a copy of one the line dropped, whose chunks may be gone, is not taken back."""
        raw = self.backend.get(_skey(Prefix.THINNING, store))
        if raw is None:
            return False  # no line: nothing dropped
        line = _line(raw)
        if line is None:
            head = self.head(store)
            return head is not None and version < head.version
        return line.drops(version, self.floor(store))

    def apply_thinning(self, store: StoreId, thin: Thinning) -> int:
        """Take ``thin`` as the store's thinning and drop the snapshot manifests (every
        epoch's) and the snapshot chunks it drops. Returns items dropped. Its lines and its
        floor never fall, and its spacing is the first one this node took: a snapshot
        dropped under one spacing is never a rung under another (its chunks may be gone).
        A snapshot a writer committed whole (``w`` chunks) stays, manifest and chunks: it may
        be its version's only state (core/manifest.Manifest.whole)."""
        held = self.thinning(store)
        below = max(thin.below, held.below)
        every = held.every or thin.every
        chunks = min(below, max(thin.chunks, held.chunks))
        thin = Thinning(below, every, chunks, max(thin.floor, held.floor))
        floor = self.floor(store)
        drop: list[bytes] = []
        for prefix in _MANIFESTS:
            for k in self.backend.scan_keys(_under(prefix, store.path)):
                _, version, kind, _ = _manifest_parts(k)
                if kind == "snapshot" and thin.drops(version, floor) and not self._whole(k):
                    drop.append(k)
        for k in self.backend.scan_keys(_under(Prefix.CHUNK, store.path)):
            _, version, name = parse_chunk_key(_text(k))
            if name.startswith("s") and thin.drops_chunks(version, floor):  # never a ``w``
                drop.append(k)
        record = f"{thin.below} {thin.every} {thin.chunks} {thin.floor}".encode()
        self._write({_skey(Prefix.THINNING, store): _seal(record)}, drop)
        return len(drop)

    def _whole(self, key: bytes) -> bool:
        """Whether the snapshot manifest stored at ``key`` is one a writer committed whole
        (core/manifest.Manifest.whole); a rotted record is not."""
        raw = self._mget(key)
        try:
            return raw is not None and decode_manifest(raw).whole
        except MalformedData:
            return False

    def check_not_corrupt(self, key: str) -> None:
        try:
            self.get_chunk(key)
        except CorruptChunk:
            self.delete_chunks([key])
            raise

    def delete_manifest(
        self, store: StoreId, version: int, kind: str, epoch: int | None = None
    ) -> None:
        """Drop one manifest (handed off to its owners): the highest epoch of ``version`` and
        ``kind``, or the one of ``epoch``; a replaced one takes the main key when the main one
        goes. The head goes with the last manifest."""
        main = _mkey(store, version, kind)
        raw = self._mget(main)
        puts: dict[bytes, bytes] = {}
        if raw is not None and (epoch is None or manifest_epoch(raw) == epoch):
            side = self.backend.scan_keys(
                _under(Prefix.REPLACED, f"{store.path}/{version:020d}/{kind}")
            )
            if side:
                top = max(side)  # the epoch is zero-padded: the highest sorts last
                puts[main] = self.backend.get(top) or b""
                deletes = [top]
            else:
                deletes = [main]
        elif epoch is not None:
            deletes = [_okey(store, version, kind, epoch)]
        else:
            return
        left = [
            k
            for prefix in _MANIFESTS
            for k in self.backend.scan_keys(_under(prefix, store.path))
            if k not in deletes
        ]
        if not left:
            deletes.append(_skey(Prefix.HEAD, store))
        self._write(puts, deletes)

    # -- tentative commits (core/tentative.py) ------------------------------------------
    def check_fence(self, m: Manifest) -> None:
        """StaleEpoch if this replica's head of ``m.store``, or its manifest of the same
        version and kind, has a higher epoch than ``m`` (what put_manifest refuses)."""
        self._fence_head(m)
        raw = self._mget(_mkey(m.store, m.version, m.kind))
        if raw is not None and manifest_epoch(raw) > m.epoch:
            raise StaleEpoch(
                f"store {m.store} version {m.version} was committed at epoch "
                f"{manifest_epoch(raw)}; epoch {m.epoch} cannot overwrite it"
            )

    def put_hint(
        self,
        m: Manifest,
        holders: list[str],
        limit: int | None = None,
        cap: int = MAX_HINTS,
        per_query: int = MAX_HINTS_PER_QUERY,
    ) -> bool:
        """Keep a tentative commit's manifest until it is handed off. Fenced like a manifest
        by what this node holds of the store; VersionConflict when this node holds a manifest
        of the same version, kind and epoch with other content (a hint never sits beside
        the content stored for its version and epoch: core/hints.py); a hint of the same
        version, kind and epoch with other content is replaced (the writer's later attempt
        supersedes the one it gave up). False when already held (idempotent). Counted
        against its query's quota like a manifest (``limit``), and against the node's cap
        and the query's share of it (core/hints.admit: InsufficientStorage). Refused below
        the store's floor as a commit is (:meth:`_below_floor`): its writer is told now, not
        "tentative" and rolled back later."""
        self.check_fence(m)
        if self.below_floor(m):
            raise InvalidRequest(
                f"{m.store} version {m.version} is below retention here (floor "
                f"{self.floor(m.store)}): restore a newer version and commit on it"
            )
        held = self.get_manifest(m.store, m.version, m.kind, m.epoch)
        if held is not None and held.epoch == m.epoch and not held.same_content(m):
            raise VersionConflict(
                f"store {m.store} version {m.version} already holds other content at epoch "
                f"{m.epoch}: this tentative commit was superseded; commit a new version"
            )
        key = _nkey(m.store, m.version, m.kind, m.epoch)
        with self._lock:  # a consistent reading of the counters (the writer thread writes)
            query_held, total = self._hint_queries[m.store.query], self._hints
        stored = self.backend.get(key)
        raw = _opened(stored, hint=True)
        if stored is not None:
            try:
                if raw is None:
                    raise MalformedData("its seal does not match")
                old, _ = decode_hint(raw)
            except (MalformedData, InvalidStoreId, ValueError):
                old = None
            if old is not None and old.same_content(m):
                return False
            # replaces it: no hint more
        else:
            admit(m.store.query, query_held, total, cap, per_query)
        self._write({key: _seal(encode_hint(m, holders))}, limit=limit)
        return True

    def hint_keys(self) -> list[tuple[str, StoreId, int, int, str]]:
        """(query, store, epoch, version, kind) of every hint held, in hand-off order (by
        store, epoch, version): a key scan, no record decoded."""
        out = []
        for k in self.backend.scan_keys(Prefix.HINT):
            try:
                *path, epoch, version, kind = _text(k).split("/")
                store = StoreId.parse("/".join(path))
                out.append((store.query, store, int(epoch), int(version), kind))
            except (InvalidStoreId, InvalidRequest, ValueError):
                continue
        return out

    def hint(self, store: StoreId, version: int, kind: str, epoch: int) -> list[str] | None:
        """The holders of one hint (None: not held, or its record does not decode)."""
        raw = self.raw_hint(store, version, kind, epoch)
        if raw is None:
            return None
        try:
            return decode_hint(raw)[1]
        except (MalformedData, InvalidStoreId, ValueError):
            return None

    def hint_manifest(self, store: StoreId, version: int, kind: str, epoch: int) -> Manifest | None:
        raw = self.raw_hint(store, version, kind, epoch)
        if raw is None:
            return None
        try:
            return decode_hint(raw)[0]
        except (MalformedData, InvalidStoreId, ValueError):
            return None

    def query_hints(self, query: str) -> int:
        """Hints of ``query`` held (a counter, as :meth:`hint_count`)."""
        return self._hint_queries.get(query, 0)

    def drop_hint_record(self, store: StoreId, version: int, kind: str, epoch: int) -> None:
        """Delete one hint by its key (a record that may not decode)."""
        self._write({}, [_nkey(store, version, kind, epoch)])

    def hint_rotted(self, store: StoreId, version: int, kind: str, epoch: int) -> bool:
        """Whether the hint's record is held and rotted (its seal does not match)."""
        return key_rotted(self.backend, _nkey(store, version, kind, epoch))

    def raw_hint(self, store: StoreId, version: int, kind: str, epoch: int) -> bytes | None:
        """A hint's encoded bytes (None: not held, or rotted: its seal does not match)."""
        return _opened(self.backend.get(_nkey(store, version, kind, epoch)), hint=True)

    def hints(self) -> list[tuple[Manifest, list[str]]]:
        """Every hint held (manifest, holders), in key order: by store, epoch, version. A
        record that does not decode (a disk fault) is left out, not a failure of every pass."""
        out = []
        for _, stored in self.backend.scan(Prefix.HINT):
            raw = _opened(stored, hint=True)
            try:
                if raw is None:
                    raise MalformedData("its seal does not match")
                out.append(decode_hint(raw))
            except (MalformedData, InvalidStoreId, ValueError):
                continue
        return out

    def store_hints(self, store: StoreId) -> list[Manifest]:
        """The hints held of ``store`` (one prefix scan; undecodable records left out)."""
        out = []
        for _, stored in self.backend.scan(_under(Prefix.HINT, store.path)):
            raw = _opened(stored, hint=True)
            try:
                if raw is None:
                    raise MalformedData("its seal does not match")
                out.append(decode_hint(raw)[0])
            except (MalformedData, InvalidStoreId, ValueError):
                continue
        return out

    def hint_count(self) -> int:
        """Hints held: a counter kept by :meth:`_write` (asked on every hint a writer sends,
        and by health and metrics), not a scan."""
        return self._hints

    def hinted_chunks(self) -> set[str]:
        """Chunk keys that a held hint names: repair leaves them to the hand-off."""
        return {
            chunk_key(m.store, m.version, ref.name) for m, _ in self.hints() for ref in m.chunks
        }

    def delete_hint(self, m: Manifest) -> None:
        self._write({}, [_nkey(m.store, m.version, m.kind, m.epoch)])

    def put_outcome(self, o: Outcome) -> Outcome:
        """Record what became of a tentative commit; the first verdict recorded stays (a
        later, different one is not taken). Returns the verdict held."""
        key = _xkey(o.store, o.version, o.epoch)
        raw = self.backend.get(key)
        if raw is not None:
            return decode_outcomes(raw)[0]
        self._write({key: encode_outcomes([o])})
        return o

    def outcome(self, store: str, version: int, epoch: int) -> Outcome | None:
        raw = self.backend.get(_xkey(store, version, epoch))
        return decode_outcomes(raw)[0] if raw is not None else None

    def outcomes(self, store: StoreId) -> list[Outcome]:
        return [
            decode_outcomes(raw)[0]
            for _, raw in self.backend.scan(_under(Prefix.OUTCOME, store.path))
        ]

    # -- whole queries (drop) ------------------------------------------------------------
    def query_keys(self, query: str) -> dict[str, list[bytes]]:
        """Every key of ``query``'s stores, by kind: chunks, manifests (replaced ones too),
        heads, floors, thinning lines, retention. A store path starts with its query and a
        ``/``, so a prefix scan finds exactly its keys."""
        return {
            kind: self.backend.scan_keys(_under(prefix, query))
            for kind, prefix in (
                ("chunks", Prefix.CHUNK),
                ("manifests", Prefix.MANIFEST),
                ("heads", Prefix.HEAD),
                ("floors", Prefix.FLOOR),
                ("thinning", Prefix.THINNING),
                ("retention", Prefix.RETAIN),
                ("hints", Prefix.HINT),
                ("outcomes", Prefix.OUTCOME),
            )
        } | {  # with the manifests that a higher epoch replaced
            "manifests": [k for p in _MANIFESTS for k in self.backend.scan_keys(_under(p, query))]
        }

    def purge_query(self, query: str, tombstone: bytes) -> dict[str, int]:
        """Delete everything of ``query`` and record ``tombstone`` in one atomic write.
        Returns how many keys of each kind went."""
        keys = self.query_keys(query)
        drop = [k for ks in keys.values() for k in ks]
        self._write({_key(Prefix.TOMBSTONE, query): tombstone}, drop)
        return {kind: len(ks) for kind, ks in keys.items()}

    def tombstone(self, query: str) -> bytes | None:
        return self.backend.get(_key(Prefix.TOMBSTONE, query))

    def put_tombstone(self, query: str, tombstone: bytes) -> None:
        self._write({_key(Prefix.TOMBSTONE, query): tombstone})

    def tombstones(self) -> list[bytes]:
        return [v for _, v in self.backend.scan(Prefix.TOMBSTONE)]

    # -- figures (node/metrics.py) --------------------------------------------------------
    def counts(self) -> dict[str, int]:
        """How many chunks, manifests (a version and kind's highest epoch: replaced ones
        not counted), stores (heads) and tombstones are held: key scans, no value read."""
        return {
            what: len(self.backend.scan_keys(prefix))
            for what, prefix in (
                ("chunks", Prefix.CHUNK),
                ("manifests", Prefix.MANIFEST),
                ("stores", Prefix.HEAD),
                ("tombstones", Prefix.TOMBSTONE),
            )
        }

    # -- scrub (node/scrub.py) -------------------------------------------------------------
    def manifest_records(self) -> list[bytes]:
        """The storage keys of every manifest held (``m:`` and replaced ``o:`` ones)."""
        return [k for prefix in _MANIFESTS for k in self.backend.scan_keys(prefix)]

    def manifest_record(self, key: bytes) -> bytes | None:
        """The manifest bytes under ``key`` (None: gone); MalformedData when its seal does
        not match (rotted on disk)."""
        raw = self.backend.get(key)
        body = _opened(raw)
        if raw is not None and body is None:
            raise MalformedData("its seal (xxh3 of the stored bytes) does not match")
        return body

    def manifest_record_names(self, key: bytes) -> tuple[StoreId, int, str, int | None]:
        """(store, version, kind, epoch) that the record ``key`` holds the manifest of; the
        epoch is None for a version's main record (it is in the value, not the key)."""
        store, version, kind, rest = _manifest_parts(key)
        return store, version, kind, int(rest[0]) if key.startswith(Prefix.REPLACED) else None

    def unsealed_record(self, key: bytes) -> bool:
        """Whether the record ``key`` holds a manifest written before seals (disk format 1)."""
        raw = self.backend.get(key)
        return raw is not None and raw[:1] != _SEAL and _opened(raw) is not None

    def seal_record(self, key: bytes) -> bool:
        """Seal the manifest record ``key`` if it was written before seals (the scrub does,
        once it verified it: node/scrub.py). False when it is sealed, rotted or gone."""
        if not self.unsealed_record(key):
            return False
        raw = self.backend.get(key)
        assert raw is not None
        self._write({key: _seal(raw)})
        return True

    def restore_manifest_record(self, key: bytes, raw: bytes, rotted: bytes) -> bool:
        """Write a replica's copy of a manifest over the rotted bytes under ``key`` (the
        caller checked that ``raw`` is the same store, version and kind), if ``rotted`` is
        still what the record holds: a drop, a gc or a copy that changed it meanwhile (the
        caller fetched over the network) is not undone. Whether it was written."""
        if not key.startswith(_MANIFESTS):
            raise InvalidRequest(f"{key[:40]!r} is not a manifest's storage key")
        if self.backend.get(key) != rotted:
            return False
        puts = {key: _seal(raw)}
        m = decode_manifest(raw)
        head = self.head(m.store)
        if head is None or (m.epoch, m.version) > head.key():  # as a copy raises it
            puts[_skey(Prefix.HEAD, m.store)] = _seal(encode_stored(Head(m.version, m.epoch)))
        self._write(puts)
        return True

    def promote_side_record(self, key: bytes, rotted: bytes) -> bool:
        """Put the highest epoch kept beside a version's rotted main record ``key`` in its
        place (as dropping the main manifest does), if ``rotted`` is still what ``key``
        holds and such an epoch is kept: the scrub's way when no replica holds a higher
        epoch (repair copies no manifest over a rotted main record). Whether it did."""
        store, version, kind, rest = _manifest_parts(key)
        if rest or not key.startswith(Prefix.MANIFEST) or self.backend.get(key) != rotted:
            return False
        side = self.backend.scan_keys(
            _under(Prefix.REPLACED, f"{store.path}/{version:020d}/{kind}")
        )
        for top in sorted(side, reverse=True):  # the epoch is zero-padded: highest first
            if self._mget(top) is not None:  # a side record rotted too is not promoted
                self._write({key: self.backend.get(top) or b""}, [top])
                return True
        return False

    def side_epochs(self, store: StoreId, version: int, kind: str) -> list[int]:
        """The epochs of ``version`` and ``kind`` kept beside its main record (replaced by a
        higher one), oldest first: key scans, no value read."""
        keys = self.backend.scan_keys(
            _under(Prefix.REPLACED, f"{store.path}/{version:020d}/{kind}")
        )
        return sorted(int(_manifest_parts(k)[3][0]) for k in keys)

    def put_chunk_copy(self, key: str, data: bytes, tombstone: bytes | None) -> bool:
        """Store a copy of a chunk fetched from a peer (the scrub's of one it deleted as
        rotted, a join's or token move's pull, repair's reconciliation), unless its query was
        dropped (its tombstone is not ``tombstone``, read before the fetch:
        node/tombstones.copy_mark) or retention passed its version meanwhile: what they
        deleted is not brought back. Whether it was written."""
        store, version, _ = parse_chunk_key(key)
        if self.tombstone(store.query) != tombstone or version < self.floor(store):
            return False
        self.put_chunk(key, data)
        return True

    def copy_pulled(
        self, ms: Sequence[Manifest], tombstones: Mapping[str, bytes | None]
    ) -> list[bool | None]:
        """:meth:`copy_manifests` of manifests fetched from a peer (a join's or token move's
        pulls), each only while its query's tombstone is the one in ``tombstones`` (read
        before the fetch: node/tombstones.copy_mark); None for one not written for that (a
        drop deleted it meanwhile: not brought back)."""
        keep = [self.tombstone(m.store.query) == tombstones[m.store.query] for m in ms]
        done = iter(self.copy_manifests([m for m, k in zip(ms, keep, strict=True) if k]))
        return [next(done) if k else None for k in keep]
