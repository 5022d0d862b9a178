"""A node's replica of the ring's data: chunks, manifests, heads and retention floors over one
byte backend (node/backends.py), with the replica rules: fencing by epoch, idempotent
re-commits, checksums verified on read.

Keys:  ``c:<store>/<version>/<chunk name>``  chunk bytes (checksum in the name, re-verified on read)
       ``m:<store>/<version, 20 digits>/<kind>``  manifest (msgpack, wire/manifest.py)
       ``h:<store>``                         head, msgpack ``[epoch, version]`` (wire/head.py)
       ``f:<store>``                         retention floor: versions below it are gone
       ``r:<store>``                         versions to retain, set by the writer (else --retain)
       ``t:<query>``                         tombstone of a dropped query (node/tombstones.py)
"""

from __future__ import annotations

from collections.abc import Sequence

from statestore.core.chunk import verify
from statestore.core.errors import CorruptChunk, StaleEpoch, VersionConflict
from statestore.core.ids import StoreId, parse_chunk_key
from statestore.core.manifest import Head, Manifest
from statestore.node.backends import Backend
from statestore.wire.head import decode_stored, encode_stored
from statestore.wire.manifest import decode_manifest, encode_manifest

__all__ = ["NodeStore"]


def _mkey(store: StoreId, version: int, kind: str) -> bytes:
    return f"m:{store.path}/{version:020d}/{kind}".encode()


class NodeStore:
    """The node's chunks, manifests, heads and floors over one backend.

    Writes are meant to run on a single writer thread: the fencing check and the write happen
    in one call, so two manifests for the same store cannot interleave.
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    # -- chunks --------------------------------------------------------------------------
    def put_chunk(self, key: str, data: bytes) -> None:
        _, _, name = parse_chunk_key(key)
        verify(data, int(name.split("-", 1)[1], 16), key)
        self.backend.write({b"c:" + key.encode(): data})

    def get_chunk(self, key: str) -> bytes | None:
        """The chunk's bytes, re-verified; raises CorruptChunk if they rotted on disk."""
        _, _, name = parse_chunk_key(key)
        data = self.backend.get(b"c:" + key.encode())
        if data is not None:
            verify(data, int(name.split("-", 1)[1], 16), key)
        return data

    def has_chunks(self, keys: Sequence[str]) -> list[bool]:
        return [self.backend.get(b"c:" + k.encode()) is not None for k in keys]

    def chunk_keys(self) -> list[str]:
        return [k[2:].decode() for k in self.backend.scan_keys(b"c:")]

    def delete_chunks(self, keys: Sequence[str]) -> None:
        self.backend.write({}, [b"c:" + k.encode() for k in keys])

    # -- manifests -----------------------------------------------------------------------
    def put_manifest(self, m: Manifest) -> bool:
        """Store ``m`` unless fenced. Returns False when it was already there (idempotent).

        Raises StaleEpoch if the store's head has a higher epoch, or a manifest of the same
        version has one; VersionConflict if the same version and epoch carry other content.
        """
        head = self.head(m.store)
        if head is not None and m.epoch < head.epoch:
            raise StaleEpoch(
                f"store {m.store} is at epoch {head.epoch}; a writer with epoch {m.epoch} is "
                "fenced: a newer writer took over, so stop this one"
            )
        raw_old = self.backend.get(_mkey(m.store, m.version, m.kind))
        if raw_old is not None:
            old = decode_manifest(raw_old)
            if old.epoch > m.epoch:
                raise StaleEpoch(
                    f"store {m.store} version {m.version} was committed at epoch {old.epoch}; "
                    f"epoch {m.epoch} cannot overwrite it"
                )
            if old.epoch == m.epoch:
                if old.same_content(m):
                    return False
                raise VersionConflict(
                    f"store {m.store} version {m.version} already holds other content at "
                    f"epoch {m.epoch}: commit a new version, or take a higher epoch to replace it"
                )
        puts = {_mkey(m.store, m.version, m.kind): encode_manifest(m)}
        if head is None or (m.epoch, m.version) > head.key():
            puts[b"h:" + m.store.path.encode()] = encode_stored(Head(m.version, m.epoch))
        self.backend.write(puts)
        return True

    def get_manifest(self, store: StoreId, version: int, kind: str) -> Manifest | None:
        raw = self.backend.get(_mkey(store, version, kind))
        return decode_manifest(raw) if raw is not None else None

    def manifests(self, store: StoreId) -> tuple[dict[int, Manifest], dict[int, Manifest]]:
        deltas: dict[int, Manifest] = {}
        snaps: dict[int, Manifest] = {}
        for _, raw in self.backend.scan(f"m:{store.path}/".encode()):
            m = decode_manifest(raw)
            (deltas if m.kind == "delta" else snaps)[m.version] = m
        return deltas, snaps

    def versions(self, store: StoreId) -> list[int]:
        out = set()
        for k in self.backend.scan_keys(f"m:{store.path}/".encode()):
            out.add(int(k.decode().rsplit("/", 2)[1]))
        return sorted(out)

    def head(self, store: StoreId) -> Head | None:
        raw = self.backend.get(b"h:" + store.path.encode())
        if raw is None:
            return None
        return decode_stored(raw)

    def stores(self) -> list[StoreId]:
        return [StoreId.parse(k[2:].decode()) for k in self.backend.scan_keys(b"h:")]

    def manifest_keys(self) -> list[tuple[StoreId, int, str]]:
        out = []
        for k in self.backend.scan_keys(b"m:"):
            path, version, kind = k[2:].decode().rsplit("/", 2)
            out.append((StoreId.parse(path), int(version), kind))
        return out

    def raw_manifest(self, store: StoreId, version: int, kind: str) -> bytes | None:
        return self.backend.get(_mkey(store, version, kind))

    # -- retention -----------------------------------------------------------------------
    def retain(self, store: StoreId) -> int | None:
        """How many versions the store's writer asked to keep (None: the node's default)."""
        raw = self.backend.get(b"r:" + store.path.encode())
        return int(raw) if raw is not None else None

    def set_retain(self, store: StoreId, versions: int) -> None:
        if self.retain(store) != versions:
            self.backend.write({b"r:" + store.path.encode(): str(versions).encode()}, [])

    def floor(self, store: StoreId) -> int:
        raw = self.backend.get(b"f:" + store.path.encode())
        return int(raw) if raw is not None else 0

    def apply_floor(self, store: StoreId, floor: int) -> int:
        """Drop every manifest and chunk of ``store`` below ``floor``. Returns items dropped."""
        if floor <= self.floor(store):
            floor = self.floor(store)
        drop: list[bytes] = []
        for k in self.backend.scan_keys(f"m:{store.path}/".encode()):
            if int(k.decode().rsplit("/", 2)[1]) < floor:
                drop.append(k)
        for k in self.backend.scan_keys(f"c:{store.path}/".encode()):
            if int(k.decode().rsplit("/", 2)[1]) < floor:
                drop.append(k)
        self.backend.write({b"f:" + store.path.encode(): str(floor).encode()}, drop)
        return len(drop)

    def check_not_corrupt(self, key: str) -> None:
        try:
            self.get_chunk(key)
        except CorruptChunk:
            self.delete_chunks([key])
            raise

    def delete_manifest(self, store: StoreId, version: int, kind: str) -> None:
        """Drop one manifest (handed off to its owners); the head goes with the last one."""
        deletes = [_mkey(store, version, kind)]
        left = [k for k in self.backend.scan_keys(f"m:{store.path}/".encode()) if k != deletes[0]]
        if not left:
            deletes.append(b"h:" + store.path.encode())
        self.backend.write({}, deletes)

    # -- whole queries (drop) ------------------------------------------------------------
    def query_keys(self, query: str) -> dict[str, list[bytes]]:
        """Every key of ``query``'s stores, by kind: chunks, manifests, heads, floors,
        retention. A store path starts with its query and a ``/``, so a prefix scan finds
        exactly its keys."""
        return {
            kind: self.backend.scan_keys(f"{prefix}:{query}/".encode())
            for kind, prefix in (
                ("chunks", "c"),
                ("manifests", "m"),
                ("heads", "h"),
                ("floors", "f"),
                ("retention", "r"),
            )
        }

    def purge_query(self, query: str, tombstone: bytes) -> dict[str, int]:
        """Delete everything of ``query`` and record ``tombstone`` in one atomic write.
        Returns how many keys of each kind went."""
        keys = self.query_keys(query)
        drop = [k for ks in keys.values() for k in ks]
        self.backend.write({b"t:" + query.encode(): tombstone}, drop)
        return {kind: len(ks) for kind, ks in keys.items()}

    def tombstone(self, query: str) -> bytes | None:
        return self.backend.get(b"t:" + query.encode())

    def put_tombstone(self, query: str, tombstone: bytes) -> None:
        self.backend.write({b"t:" + query.encode(): tombstone})

    def tombstones(self) -> list[bytes]:
        return [v for _, v in self.backend.scan(b"t:")]
