"""The backup format of ``statestore backup`` / ``restore-backup`` (pure: names, the index
file and its checks; the I/O is in cli/backup.py). docs/operations.md, "Backup and restore".

A backup is a directory::

    DIR/backup.json                                   the index, written last (below)
    DIR/stores/<query>/<operator>/<partition>/<name>/
        manifests/<version>-<kind>-<epoch>.msgpack    a manifest as the ring holds it
        chunks/<checksum>.zst                         a chunk (zstd frame) once, named by the
                                                      xxh3-64 of its bytes (16 hex digits)

``backup.json`` is a JSON object: ``format`` (``"statestore-backup"``), ``format_version``
(1), what was backed up (``query``, ``version_at``, ``created_at``, ``statestore``: the
build), ``stores`` (per store: its path, the ``versions`` backed up, for each of them the
``chain`` a restore of it applies, as ``[version, kind, epoch]`` oldest first, the
``manifests`` files and, when its writer set one, the ``retain`` it asked the replicas
for, which the restore sets on the target), ``files`` (every file of the backup but the
index: ``path``, ``size``, ``xxh3_128``) and last ``checksum``: the xxh3-128 of the
canonical JSON of everything else (sorted keys, no spaces), so a truncated or edited index
is refused as surely as a file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from statestore.core.errors import InvalidStoreId
from statestore.core.ids import StoreId
from statestore.core.manifest import Manifest
from statestore.core.retention import MAX_RETAIN

# the most bytes one file of a backup may hold (a chunk or a manifest, read whole): a node
# takes none past its --max-body (64 MiB by default), nor past 1 GiB of any setting
MAX_FILE_BYTES = 1 << 30

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "INDEX",
    "BackupInvalid",
    "ChainEntry",
    "StoreEntry",
    "chunk_checksum",
    "chunk_file",
    "decode_index",
    "encode_index",
    "file_digest",
    "load_order",
    "manifest_file",
    "pick_versions",
    "same_line",
    "store_dir",
]

FORMAT = "statestore-backup"
FORMAT_VERSION = 1
INDEX = "backup.json"

ChainEntry = tuple[int, str, int]  # version, kind, epoch
_HEX16 = re.compile(r"[0-9a-f]{16}")
_HEX32 = re.compile(r"[0-9a-f]{32}")
_MANIFEST = re.compile(r"(\d+)-(delta|snapshot)-(\d+)\.msgpack")


class BackupInvalid(ValueError):
    """A backup that must not be loaded: partial, corrupt, or not a backup at all."""


def file_digest(data: bytes | Any) -> str:
    """The xxh3-128 of a file's bytes, as 32 hex digits (``data``: bytes, or an xxhash
    state fed piece by piece)."""
    if isinstance(data, bytes | bytearray | memoryview):
        return xxhash.xxh3_128_hexdigest(data)
    return str(data.hexdigest())


def store_dir(store: StoreId) -> str:
    return f"stores/{store.path}"


def manifest_file(store: StoreId, m: Manifest) -> str:
    return f"{store_dir(store)}/manifests/{m.version}-{m.kind}-{m.epoch}.msgpack"


def chunk_file(store: StoreId, checksum: int) -> str:
    return f"{store_dir(store)}/chunks/{checksum:016x}.zst"


def pick_versions(versions: Sequence[int], version_at: int | None) -> list[int]:
    """The versions of a store to back up: every retained one, or with ``version_at`` the
    latest one at or below it (none when the store has none that old)."""
    if version_at is None:
        return sorted(versions)
    below = [v for v in versions if v <= version_at]
    return [max(below)] if below else []


def load_order(manifests: Iterable[Manifest]) -> list[Manifest]:
    """The order a store's manifests are written back through the writer's path: by
    (epoch, version), a delta before the snapshot of the same version and epoch. The
    replicas' fencing refuses a manifest whose epoch is below the store's head, and the head
    is the highest (epoch, version) written: in this order every write is at or above it."""
    return sorted(manifests, key=lambda m: (m.epoch, m.version, m.kind != "delta"))


def _canonical(obj: Mapping[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def encode_index(index: Mapping[str, Any]) -> bytes:
    """``backup.json``'s bytes: ``index`` with its ``checksum`` added."""
    body = {k: v for k, v in index.items() if k != "checksum"}
    body["checksum"] = xxhash.xxh3_128_hexdigest(_canonical(body))
    return json.dumps(body, indent=1, sort_keys=True).encode() + b"\n"


@dataclass(frozen=True)
class StoreEntry:
    store: StoreId
    versions: tuple[int, ...]
    chains: Mapping[int, tuple[ChainEntry, ...]]
    manifests: tuple[str, ...]
    # the versions its writer asked the source's replicas to keep (retain=N; Spark's
    # minBatchesToRetain), restored with it; None: the nodes' --retain applied (or a backup
    # written before backups carried it)
    retain: int | None = None


def _fail(what: str) -> BackupInvalid:
    return BackupInvalid(f"{INDEX} {what}: the backup is corrupt or was not written by statestore")


def decode_index(data: bytes) -> dict[str, Any]:
    """Parse and check ``backup.json``: its own checksum, the format, and that every name in
    it is one this format gives (so a path never leaves the backup's directory). Raises
    BackupInvalid saying what is wrong. The ``stores`` come back as :class:`StoreEntry`."""
    try:
        obj = json.loads(data)
    except ValueError as exc:
        raise BackupInvalid(
            f"{INDEX} is not JSON ({exc}): the backup did not finish, or the file is damaged"
        ) from exc
    if not isinstance(obj, dict):
        raise _fail("is not an object")
    want = obj.get("checksum")
    body = {k: v for k, v in obj.items() if k != "checksum"}
    if not isinstance(want, str) or xxhash.xxh3_128_hexdigest(_canonical(body)) != want:
        raise BackupInvalid(f"{INDEX} does not match its own checksum: it was damaged or edited")
    if obj.get("format") != FORMAT:
        raise _fail(f"has format {obj.get('format')!r}, not {FORMAT!r}")
    if obj.get("format_version") != FORMAT_VERSION:
        raise BackupInvalid(
            f"{INDEX} has format version {obj.get('format_version')!r}; this build reads "
            f"{FORMAT_VERSION}: restore it with the statestore that wrote it"
        )
    try:
        query = obj["query"]
        StoreId(query, 0, 0, "x")
        files: dict[str, tuple[int, str]] = {}
        for f in obj["files"]:
            path, size, digest = f["path"], f["size"], f["xxh3_128"]
            # a file is a chunk or a manifest: at most a chunk's bytes (MAX_FILE_BYTES)
            if not (
                type(size) is int and 0 <= size <= MAX_FILE_BYTES and _HEX32.fullmatch(str(digest))
            ):
                raise _fail(f"lists {path!r:.80} with a bad size or checksum")
            files[_check_path(path)] = (size, digest)
        stores = []
        for s in obj["stores"]:
            store = StoreId.parse(s["store"])
            if store.query != query:
                raise _fail(f"lists store {store} outside query {query}")
            versions = tuple(_int(v) for v in s["versions"])
            chains = {
                _int(v): tuple((_int(e[0]), str(e[1]), _int(e[2])) for e in chain)
                for v, chain in s["chains"].items()
            }
            manifests = tuple(str(p) for p in s["manifests"])
            for p in manifests:
                if p not in files or not p.startswith(store_dir(store) + "/manifests/"):
                    raise _fail(f"names manifest {p!r:.80}, which it does not list")
            if set(chains) != set(versions):
                raise _fail(f"gives store {store} chains for other versions than it backs up")
            retain = s.get("retain")
            if retain is not None and not (type(retain) is int and 1 <= retain <= MAX_RETAIN):
                raise _fail(f"gives store {store} a retain that is not 1..{MAX_RETAIN}")
            stores.append(StoreEntry(store, versions, chains, manifests, retain))
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError, InvalidStoreId) as exc:
        if isinstance(exc, BackupInvalid):
            raise
        raise _fail(f"is malformed ({exc!r:.200})") from exc
    out = dict(obj)
    out["files"] = files
    out["stores"] = stores
    return out


def _int(x: object) -> int:
    """An index's whole number (a version, an epoch): an int within 0..2**64, or a string of
    one (JSON object keys); a float, Infinity or anything else is malformed."""
    if type(x) is str and x.isascii() and x.isdigit() and len(x) <= 20:
        x = int(x)
    if type(x) is not int or not 0 <= x < 1 << 64:
        raise ValueError(f"{x!r:.40} is not a whole number in 0..2**64")
    return x


def _check_path(path: object) -> str:
    if not isinstance(path, str):
        raise _fail(f"lists a path that is not a string: {path!r:.80}")
    parts = path.split("/")
    if not (len(parts) == 7 and parts[0] == "stores"):
        raise _fail(f"lists {path!r:.80}, not a path of this format")
    try:
        StoreId.parse("/".join(parts[1:5]))
    except InvalidStoreId as exc:
        raise _fail(f"lists {path!r:.80}, not a path of this format") from exc
    if parts[5] == "chunks" and re.fullmatch(r"[0-9a-f]{16}\.zst", parts[6]):
        return path
    if parts[5] == "manifests" and _MANIFEST.fullmatch(parts[6]):
        return path
    raise _fail(f"lists {path!r:.80}, not a path of this format")


def chunk_checksum(path: str) -> int | None:
    """The checksum a chunk file's name gives, None for another file."""
    name = path.rsplit("/", 1)[-1]
    if name.endswith(".zst") and _HEX16.fullmatch(name[:-4]):
        return int(name[:-4], 16)
    return None


def same_line(backed_up: Sequence[ChainEntry], got: Sequence[ChainEntry]) -> bool:
    """Whether the chain a ring resolves for a version (``got``, oldest first) rebuilds the
    state the backup's chain of it does: the same manifests, except that the bottom may be a
    snapshot the target ring's compactor wrote meanwhile at the same version and epoch as
    one of the backup's (the same state, folded)."""
    if not got or len(got) > len(backed_up):
        return False
    above = list(got[1:])
    if above and list(backed_up[len(backed_up) - len(above) :]) != above:
        return False
    v, kind, epoch = backed_up[len(backed_up) - len(above) - 1]
    return (v, epoch) == (got[0][0], got[0][2]) and got[0][1] in (kind, "snapshot")
