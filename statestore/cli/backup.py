"""``statestore backup`` and ``statestore restore-backup`` (docs/operations.md, "Backup and
restore"; the format is in wire/backup.py).

**backup** finds the query's stores (``GET /v1/stores`` on every live member), reads each
store's retained versions and, for each version backed up, the chain a restore of it applies
(a quorum read, as a restore makes: ``POST /v1/chains``). It writes every manifest of those
chains once, as the ring holds it (msgpack), and every chunk they name once, fetched from its
first holder with verified bytes, into ``DIR.partial-backup``; then the index
``backup.json`` (every file, its size and xxh3-128), and last renames the directory to DIR.
A backup that did not finish is recognisable: its directory still ends in
``.partial-backup``, and it has no ``backup.json``. A chunk that no holder serves (the nodes
thinned a snapshot away under a long backup) does not stop the other copies: its store's
chains are read again and only what was not copied is fetched, up to ``PLANS`` reads of a
store in all; the files the last reads do not name are deleted before the index is written.

**restore-backup** first checks the whole backup, reading every file (present, size and
checksum as the index says, every manifest decodes and names the store it is filed under,
every chunk a manifest names is there with its checksum); a backup that fails is refused
before anything is sent to the ring. It refuses a target query that holds stores unless
``--force``. Then it writes each store's manifests back through the writer's path (fencing
check, chunks at W, manifest at W: net/writes.py), in (epoch, version) order, so each store
on the ring is at every moment a prefix of its history; and it reads back the chain of every
backed-up version from the target ring and compares it with the backup's. If any of this
fails (a node down, a quota, a fenced store) it drops the target query (``statestore drop``:
nothing of it stays for a reader to take for the backup) and exits 1; with ``--force`` it
drops nothing (the query held stores before) and names the stores it touched.

Both send ``STATESTORE_TOKEN`` (or the file named by ``STATESTORE_TOKEN_FILE``) as a bearer
token: a backup needs ``read`` on the query, a restore ``write`` on the target query (and
``admin`` to drop it after a failure).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import shutil
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from statestore.cli.command import Subparsers, add_client_tls, add_seeds, positive
from statestore.cli.http import token_headers
from statestore.core.chunk import EncodedChunk, verify
from statestore.core.errors import (
    CorruptChunk,
    MalformedData,
    NodeUnavailable,
    StateStoreError,
    StoreNotFound,
    Unavailable,
    VersionConflict,
    VersionNotFound,
)
from statestore.core.formats import VERSION
from statestore.core.ids import StoreId
from statestore.core.manifest import Manifest
from statestore.core.view import RingView
from statestore.net.reads import ReadStats, fetch_chunk, read_chains, read_retention
from statestore.net.tls import client_context, tls_ca_file
from statestore.net.writes import write_commit
from statestore.wire.backup import (
    FORMAT,
    FORMAT_VERSION,
    INDEX,
    BackupInvalid,
    ChainEntry,
    StoreEntry,
    chunk_checksum,
    chunk_file,
    decode_index,
    encode_index,
    file_digest,
    load_order,
    manifest_file,
    pick_versions,
    same_line,
)
from statestore.wire.manifest import decode_manifest, encode_manifest

__all__ = ["add_parser", "backup", "restore_backup", "verify_backup"]

T = TypeVar("T")
PARTIAL = ".partial-backup"
BATCH = 200  # (store, version) pairs per batched chain read
_Chunk = tuple[StoreId, Manifest, int, str]  # a chunk to copy: store, manifest, ref, file


def add_parser(sub: Subparsers) -> None:
    bk = sub.add_parser(
        "backup",
        help="write a checksummed backup of every store of a query to a new directory",
    )
    add_seeds(bk)
    bk.add_argument("--query", required=True)
    bk.add_argument("--out", required=True, metavar="DIR", help="a new (or empty) directory")
    bk.add_argument(
        "--version-at",
        type=positive,
        default=None,
        metavar="V",
        help="one point in time: for each store its latest version <= V (a store version "
        "number, as commits count them; Spark: batch id + 1); default every retained version",
    )
    add_client_tls(bk)
    bk.set_defaults(run=_run_backup)

    rbk = sub.add_parser(
        "restore-backup",
        help="verify a backup, then load it into a ring (nothing loaded if it is not whole)",
    )
    add_seeds(rbk)
    rbk.add_argument("--from", dest="source", required=True, metavar="DIR")
    rbk.add_argument("--as", dest="as_query", default=None, metavar="Q2", help="another query name")
    rbk.add_argument(
        "--force",
        action="store_true",
        help="load even when the target query holds stores (not dropped on failure then)",
    )
    add_client_tls(rbk)
    rbk.set_defaults(run=_run_restore_backup)


def _run_backup(args: argparse.Namespace) -> int:
    return backup(args.seeds, args.query, args.out, version_at=args.version_at, tls_ca=args.tls_ca)


def _run_restore_backup(args: argparse.Namespace) -> int:
    return restore_backup(
        args.seeds, args.source, as_query=args.as_query, force=args.force, tls_ca=args.tls_ca
    )


class _Ring:
    """One transport (bearer token, TLS) and the ring's view, refreshed on a newer epoch."""

    def __init__(self, seeds: Sequence[str], tls_ca: str | None) -> None:
        from statestore.net.http import HttpTransport  # aiohttp: only when a command runs

        self.seeds = list(seeds)
        ca = tls_ca_file(tls_ca)
        headers = token_headers()
        self.transport = HttpTransport(
            timeout=30.0,
            tls=client_context(ca) if ca else None,
            auth=(lambda method, address, path, body: headers) if headers else None,
        )
        self._view: RingView | None = None

    async def view(self, fresh: bool = False) -> RingView:
        if self._view is not None and not fresh and self.transport.seen_epoch <= self._view.epoch:
            return self._view
        known = self._view.live_addresses() if self._view else []
        errors = []
        for address in dict.fromkeys(known + self.seeds):
            try:
                resp = await self.transport.request("GET", address, "/v1/ring", timeout=5.0)
            except StateStoreError as exc:
                errors.append(f"{address}: {exc}")
                continue
            self._view = RingView.from_json(resp.json())
            return self._view
        raise NodeUnavailable("no seed answered (" + "; ".join(errors) + "); check --seeds")

    async def routed(self, op: Callable[[RingView], Awaitable[T]]) -> T:
        """``op`` on the current view; once more on a fresh one after Unavailable."""
        view = await self.view()
        try:
            return await op(view)
        except Unavailable:
            await asyncio.sleep(0.5)
            return await op(await self.view(fresh=True))

    async def stores_of(self, query: str) -> tuple[list[StoreId], list[str]]:
        """The query's stores, as the live members list them, and who did not answer."""
        view = await self.view()
        addresses = view.live_addresses()
        answers = await asyncio.gather(
            *(self.transport.request("GET", a, "/v1/stores") for a in addresses),
            return_exceptions=True,
        )
        found: set[str] = set()
        failed = []
        for address, answer in zip(addresses, answers, strict=True):
            if isinstance(answer, StateStoreError):
                failed.append(f"{address}: {answer}")
            elif isinstance(answer, BaseException):
                raise answer
            else:
                try:
                    listed = answer.json()["stores"]
                    found.update(s for s in listed if s.startswith(query + "/"))
                except (ValueError, TypeError, KeyError, AttributeError):
                    failed.append(f"{address}: answered /v1/stores with another shape")
        return [StoreId.parse(s) for s in sorted(found)], failed

    async def drop(self, query: str) -> dict[str, Any]:
        view = await self.view()
        errors = []
        for address in view.live_addresses():
            try:
                resp = await self.transport.request(
                    "POST", address, f"/v1/queries/{query}/drop", timeout=120.0
                )
            except Unavailable as exc:
                errors.append(f"{address}: {exc}")
                continue
            answer: dict[str, Any] = resp.json()
            return answer
        raise NodeUnavailable("no member took the drop (" + "; ".join(errors) + ")")

    async def close(self) -> None:
        await self.transport.close()


def _progress(console: Any) -> Any:
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeElapsedColumn

    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def _chains(
    ring: _Ring, pairs: list[tuple[StoreId, int]], view: RingView
) -> list[list[Manifest]]:
    return await read_chains(ring.transport, view, pairs)


async def _commit(
    ring: _Ring, m: Manifest, chunks: list[EncodedChunk], retain: int | None, view: RingView
) -> None:
    await write_commit(ring.transport, view, m, chunks, retain=retain)


async def _all(coros: Iterable[Coroutine[Any, Any, None]]) -> None:
    """Run them all; on the first failure cancel the others and wait for them to stop (so
    nothing is still writing when the caller drops what was loaded), then raise it."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


# -- backup --------------------------------------------------------------------------------


async def _read_store(
    ring: _Ring, store: StoreId, version_at: int | None, warn: Callable[[str], None]
) -> tuple[list[int], dict[int, list[Manifest]], int | None]:
    """The versions of ``store`` to back up and the chain of each, as a restore reads it;
    and the ``retain=N`` its writer asked its replicas for (None: none asked)."""
    retention = await ring.routed(lambda view: read_retention(ring.transport, view, store))
    versions = pick_versions(retention.versions, version_at)
    chains: dict[int, list[Manifest]] = {}
    for i in range(0, len(versions), BATCH):
        pairs = [(store, v) for v in versions[i : i + BATCH]]
        try:
            got = await ring.routed(partial(_chains, ring, pairs))
        except VersionNotFound:
            got = None
        if got is not None:
            chains.update(zip([v for _, v in pairs], got, strict=True))
            continue
        for _, v in pairs:  # one at a time, to say which version is missing
            try:
                chains[v] = (await ring.routed(partial(_chains, ring, [(store, v)])))[0]
            except VersionNotFound as exc:
                if v == versions[-1]:
                    raise
                # left out only when retention dropped it meanwhile: a version still retained
                # whose chain no holder serves fails the backup (docs/operations.md)
                now = await ring.routed(lambda view: read_retention(ring.transport, view, store))
                if v in now.versions:
                    raise
                warn(f"{store} v{v} left out: retention dropped it during the backup ({exc})")
    return [v for v in versions if v in chains], chains, retention.retain


# Plans a store's backup makes at most: a backup that outlives the nodes' chunk grace may find
# a snapshot its chains named thinned away (core/retention.py); that store's chains are then
# read again and only the chunks not copied yet are fetched.
PLANS = 3


@dataclasses.dataclass
class _StorePlan:
    """One store's part of a backup: its index entry, its manifest files (written), and the
    chunks its chains name (each once, by checksum)."""

    entry: dict[str, Any]
    manifests: dict[str, dict[str, Any]]
    chunks: list[_Chunk]


async def _backup(
    seeds: Sequence[str],
    query: str,
    version_at: int | None,
    tmp: Path,
    tls_ca: str | None,
    console: Any,
) -> tuple[dict[str, Any], int]:
    """The backup's index, its files written under ``tmp``; and how many stores' chains
    were read again."""
    ring = _Ring(seeds, tls_ca)
    try:
        stores, failed = await ring.stores_of(query)
        if failed:
            # a store only that member lists would be missing from a backup that says it is
            # whole (hostile review 68: it was a warning and exit 0)
            raise StateStoreError(
                f"could not ask every live member which stores query {query} has "
                f"({'; '.join(failed)}): retry when they answer"
            )
        if not stores:
            raise StateStoreError(f"query {query} has no stores on the ring: nothing to back up")
        plans: dict[StoreId, _StorePlan] = {}
        skipped: list[str] = []
        copied: dict[str, dict[str, Any]] = {}  # chunk files fetched (named by checksum)
        todo, again = stores, 0
        for plan in range(1, PLANS + 1):
            for store in todo:
                got = await _plan_store(ring, store, version_at, tmp, console, plans.get(store))
                plans.pop(store, None)
                if got is None:
                    skipped.append(store.path)
                elif got is not _DROPPED:
                    plans[store] = got
            left = [c for p in plans.values() for c in p.chunks if c[3] not in copied]
            failures = await _copy(ring, query, len(plans), left, tmp, copied, console)
            if not failures:
                break
            first = next(iter(failures.values()))
            if plan == PLANS:
                raise first
            todo = [s for s in stores if s in failures]
            again += len(todo)
            console.print(
                f"warning: {len(todo)} stores have chunks no holder serves now (the nodes may "
                f"have thinned a snapshot their chains named: {first}); reading their chains "
                "again and copying what is not copied yet"
            )
        files = {path: meta for p in plans.values() for path, meta in p.manifests.items()}
        files |= {path: copied[path] for p in plans.values() for _, _, _, path in p.chunks}
        await asyncio.to_thread(_keep_only, tmp, set(files))
        view = await ring.view()
        index = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "statestore": VERSION,
            "created_at": time.time(),
            "query": query,
            "version_at": version_at,
            "source": {"seeds": list(seeds), "ring_epoch": view.epoch},
            "stores": [p.entry for s, p in sorted(plans.items(), key=lambda i: i[0].path)],
            "skipped_stores": sorted(skipped),
            "files": sorted(files.values(), key=lambda f: str(f["path"])),
        }
        return index, again
    finally:
        await ring.close()


def _keep_only(tmp: Path, names: set[str]) -> None:
    """Delete the files under ``tmp`` not named (what an earlier plan wrote and the last
    does not name), and the folders left empty."""
    for f in sorted(tmp.rglob("*"), key=lambda f: len(f.parts), reverse=True):
        if f.is_file() and f.relative_to(tmp).as_posix() not in names:
            f.unlink()
        elif f.is_dir() and not any(f.iterdir()):
            f.rmdir()


_DROPPED = _StorePlan({}, {}, [])  # a store dropped during the backup: left out, said


async def _plan_store(
    ring: _Ring,
    store: StoreId,
    version_at: int | None,
    tmp: Path,
    console: Any,
    before: _StorePlan | None,
) -> _StorePlan | None:
    """The chains of ``store``'s versions, read now, and their manifests written; None when
    it has no version to back up (``--version-at`` below its first), ``_DROPPED`` when it was
    dropped since it was listed. ``before``: its plan before this one, if any: a version
    it held and this one does not is said."""
    try:
        versions, chains, retain = await _read_store(ring, store, version_at, console.print)
    except StoreNotFound as exc:
        console.print(f"warning: {store} left out: {exc} (dropped during the backup?)")
        return _DROPPED
    if not versions:
        if version_at is None:  # a store listed with no version at all: not a whole backup
            raise StateStoreError(
                f"{store} has no retained version its replicas agree on (a replica reports a "
                "floor above every version?): not backed up; retry, or check its nodes"
            )
        return None
    if before is not None:
        for v in sorted(set(before.entry["versions"]) - set(versions)):
            console.print(f"warning: {store} v{v} left out: retention dropped it during the backup")
    manifests: dict[tuple[int, str, int], Manifest] = {}
    for chain in chains.values():
        for m in chain:
            manifests.setdefault((m.version, m.kind, m.epoch), m)
    files: dict[str, dict[str, Any]] = {}
    chunks: dict[str, _Chunk] = {}
    for m in load_order(manifests.values()):
        data = encode_manifest(m)
        path = manifest_file(store, m)
        meta = {"path": path, "size": len(data), "xxh3_128": file_digest(data)}
        if before is None or before.manifests.get(path) != meta:  # else written already
            _write(tmp / path, data)
        files[path] = meta
        for i, ref in enumerate(m.chunks):
            chunks.setdefault(chunk_file(store, ref.checksum), (store, m, i, ""))
    entry: dict[str, Any] = {
        "store": store.path,
        "versions": versions,
        "head": {"version": versions[-1], "epoch": chains[versions[-1]][-1].epoch},
        "positions": dict(chains[versions[-1]][-1].positions),
        "chains": {str(v): [[m.version, m.kind, m.epoch] for m in chains[v]] for v in versions},
        "manifests": list(files),
    }
    if retain is not None:
        entry["retain"] = retain
    return _StorePlan(entry, files, [(s, m, i, path) for path, (s, m, i, _) in chunks.items()])


async def _copy(
    ring: _Ring,
    query: str,
    stores: int,
    left: list[_Chunk],
    tmp: Path,
    copied: dict[str, dict[str, Any]],
    console: Any,
) -> dict[StoreId, NodeUnavailable]:
    """Copy the chunks of ``left``, each from its first verified holder, 8 at a time; each
    copied goes into ``copied``. A chunk no holder serves does not stop the others: the
    stores with one are returned (the first such error of each); any other error stops
    them all."""
    total = sum(m.chunks[i].size for _, m, i, _ in left)
    stats = ReadStats()
    sem = asyncio.Semaphore(8)
    failures: dict[StoreId, NodeUnavailable] = {}
    with _progress(console) as progress:
        task = progress.add_task(
            f"backing up {stores} stores of {query}: {len(left)} chunks", total=total
        )

        async def copy(store: StoreId, m: Manifest, i: int, path: str) -> None:
            ref = m.chunks[i]
            async with sem:
                try:
                    data = await ring.routed(
                        lambda view: fetch_chunk(ring.transport, view, store, m.version, ref, stats)
                    )
                except NodeUnavailable as exc:
                    failures.setdefault(store, exc)
                    return
            # a write begun is finished before a cancelled copy ends: no file appears after
            # the backup decided which files it keeps
            write = asyncio.ensure_future(asyncio.to_thread(_write, tmp / path, data))
            try:
                await asyncio.shield(write)
            except asyncio.CancelledError:
                await asyncio.wait([write])
                raise
            copied[path] = {"path": path, "size": len(data), "xxh3_128": file_digest(data)}
            progress.advance(task, len(data))

        await _all(copy(*c) for c in left)
    return failures


def backup(
    seeds: Sequence[str],
    query: str,
    out: str,
    *,
    version_at: int | None = None,
    tls_ca: str | None = None,
) -> int:
    """``statestore backup``: every store of ``query`` into the new directory ``out``."""
    from rich.console import Console

    console = Console(stderr=True)
    StoreId(query, 0, 0, "x")  # a bad query name fails here, named
    final = Path(out)
    tmp = final.with_name(final.name + PARTIAL)
    if final.exists() and (not final.is_dir() or any(final.iterdir())):
        print(f"statestore backup: {out} exists and is not empty: give a new directory",
              file=sys.stderr)  # fmt: skip
        return 2
    if tmp.exists():
        print(
            f"statestore backup: {tmp} exists: a backup into {out} that did not finish; "
            "delete it first",
            file=sys.stderr,
        )
        return 2
    tmp.mkdir(parents=True)
    began = time.monotonic()
    try:
        index, again = asyncio.run(_backup(seeds, query, version_at, tmp, tls_ca, console))
        data = encode_index(index)
        _write(tmp / (INDEX + ".tmp"), data)
        os.replace(tmp / (INDEX + ".tmp"), tmp / INDEX)  # the index last
        _fsync_dir(tmp)
        if final.exists():
            final.rmdir()  # empty, checked above
        os.replace(tmp, final)
        _fsync_dir(final.resolve().parent)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"statestore backup: {exc}; nothing kept", file=sys.stderr)
        return 1
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    files = index["files"]
    size = sum(f["size"] for f in files)
    point = f" at version <= {version_at}" if version_at is not None else ""
    print(
        f"backed up {len(index['stores'])} stores of query {query}{point}: "
        f"{sum(len(s['versions']) for s in index['stores'])} versions, {len(files)} files, "
        f"{size} bytes in {time.monotonic() - began:.1f}s to {out}"
        + (f" (the chains of {again} stores read again)" if again else "")
    )
    for s in index["skipped_stores"]:
        print(f"  {s}: no version at or below {version_at}, not in the backup")
    return 0


# -- restore-backup ------------------------------------------------------------------------


def verify_backup(directory: str | Path, console: Any = None) -> dict[str, Any]:
    """Check a whole backup before anything is loaded: the index (present, its checksum,
    its format), every file it lists (present, size, xxh3-128), every manifest (decodes,
    names the store, version, kind and epoch its file says) and every chunk a manifest names
    (listed, with the checksum in the chunk's name). Raises BackupInvalid saying what is
    wrong; returns the index (wire/backup.decode_index) with ``manifests``: the decoded
    manifests by store."""
    root = Path(directory)
    if root.name.endswith(PARTIAL):
        raise BackupInvalid(f"{root} is a backup that did not finish ({PARTIAL})")
    if not root.is_dir():
        raise BackupInvalid(f"{root} is not a directory")
    try:
        raw = (root / INDEX).read_bytes()
    except FileNotFoundError:
        raise BackupInvalid(
            f"{root} has no {INDEX}: a backup that did not finish (the index is written last), "
            "or not a backup"
        ) from None
    index = decode_index(raw)
    files: dict[str, tuple[int, str]] = index["files"]
    total = sum(size for size, _ in files.values())
    with _progress(console) if console is not None else _Null() as progress:
        task = progress.add_task(f"verifying {len(files)} files", total=total)
        for path, (size, digest) in sorted(files.items()):
            f = root / path
            try:
                got = f.stat().st_size
            except FileNotFoundError:
                raise BackupInvalid(f"{path} is missing from the backup") from None
            if got != size:
                raise BackupInvalid(f"{path} has {got} bytes; the backup wrote {size}")
            data = f.read_bytes()  # a chunk or a manifest: a few MiB at most
            if file_digest(data) != digest:
                raise BackupInvalid(f"{path} does not match its checksum: it is corrupt")
            want = chunk_checksum(path)
            if want is not None:
                verify(data, want, path)
            progress.advance(task, size)
    manifests: dict[StoreId, list[Manifest]] = {}
    for entry in index["stores"]:
        assert isinstance(entry, StoreEntry)
        ms = []
        for path in entry.manifests:
            try:
                m = decode_manifest((root / path).read_bytes())
            except MalformedData as exc:
                raise BackupInvalid(f"{path} does not decode: {exc}") from exc
            if m.store != entry.store or manifest_file(entry.store, m) != path:
                raise BackupInvalid(f"{path} holds {m.store} v{m.version} {m.kind}@{m.epoch}")
            for ref in m.chunks:
                if chunk_file(entry.store, ref.checksum) not in files:
                    raise BackupInvalid(
                        f"{path} names chunk {ref.name}, which the backup does not hold"
                    )
            ms.append(m)
        held = {(m.version, m.kind, m.epoch) for m in ms}
        for v, chain in entry.chains.items():
            if not chain or chain[-1][0] != v or any(tuple(e) not in held for e in chain):
                raise BackupInvalid(f"the chain of {entry.store} v{v} is not in the backup")
        manifests[entry.store] = ms
    index["manifests"] = manifests
    return index


class _Null:
    def __enter__(self) -> _Null:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, *args: Any, **kwargs: Any) -> int:
        return 0

    def advance(self, *args: Any) -> None:
        return None


def _retarget(m: Manifest, store: StoreId) -> Manifest:
    return m if m.store == store else dataclasses.replace(m, store=store)


async def _load(
    ring: _Ring,
    root: Path,
    index: dict[str, Any],
    query: str,
    touched: list[str],
    console: Any,
    *,
    held: frozenset[StoreId] = frozenset(),
) -> None:
    """Write every backed-up manifest and its chunks into ``query``. ``held``: the stores
    the query held before (``--force``)."""
    entries: list[StoreEntry] = index["stores"]
    manifests: dict[StoreId, list[Manifest]] = index["manifests"]
    total = sum(ref.size for ms in manifests.values() for m in ms for ref in m.chunks)
    sem = asyncio.Semaphore(4)  # stores loaded at once; each store's manifests in order
    with _progress(console) as progress:
        task = progress.add_task(f"loading {len(entries)} stores into {query}", total=total)

        async def one(entry: StoreEntry) -> None:
            target = dataclasses.replace(entry.store, query=query)
            async with sem:
                touched.append(target.path)
                for m in load_order(manifests[entry.store]):
                    tm = _retarget(m, target)
                    chunks = []
                    for ref in m.chunks:
                        data = (root / chunk_file(entry.store, ref.checksum)).read_bytes()
                        verify(data, ref.checksum, ref.name)
                        chunks.append(ref.encoded(data))
                    try:
                        await ring.routed(partial(_commit, ring, tm, chunks, entry.retain))
                    except VersionConflict as exc:
                        if m.kind != "snapshot":
                            raise
                        if tm.store in held:
                            # what held the version before may be other state: the read-back
                            # compares versions and epochs, not rows, so taking it would
                            # report a restore the ring does not serve
                            raise StateStoreError(
                                f"{tm.store} v{m.version} (epoch {m.epoch}): the store held a "
                                "snapshot of other content at this version and epoch before "
                                "the load; --force loads over a query only where the two "
                                "agree: drop the query first (statestore drop) to load the "
                                "backup whole"
                            ) from exc
                        # into a query empty before the load: the target's compactor folded
                        # the same version at the same epoch first, a snapshot of the same
                        # state (its chunks may be cut otherwise)
                    progress.advance(task, sum(len(c.data) for c in chunks))

        await _all(one(e) for e in entries)


async def _check_loaded(ring: _Ring, index: dict[str, Any], query: str) -> None:
    """Read back the chain of every backed-up version on the target ring (a quorum read, as a
    restore makes) and compare it with the backup's."""
    pairs: list[tuple[StoreId, int, tuple[ChainEntry, ...]]] = []
    for entry in index["stores"]:
        target = dataclasses.replace(entry.store, query=query)
        pairs.extend((target, v, entry.chains[v]) for v in entry.versions)
    for i in range(0, len(pairs), BATCH):
        part = pairs[i : i + BATCH]
        got = await ring.routed(partial(_chains, ring, [(s, v) for s, v, _ in part]))
        for (store, v, want), chain in zip(part, got, strict=True):
            have = [(m.version, m.kind, m.epoch) for m in chain]
            if not same_line(list(want), have):
                raise StateStoreError(
                    f"{store} v{v} reads back as chain {have} from the target ring, not the "
                    f"backup's {list(want)}"
                )


def restore_backup(
    seeds: Sequence[str],
    directory: str,
    *,
    as_query: str | None = None,
    force: bool = False,
    tls_ca: str | None = None,
) -> int:
    """``statestore restore-backup``: verify the whole backup, then load it (or nothing)."""
    from rich.console import Console

    console = Console(stderr=True)
    if as_query is not None:
        StoreId(as_query, 0, 0, "x")
    began = time.monotonic()
    try:
        index = verify_backup(directory, console)
    except (BackupInvalid, CorruptChunk) as exc:
        print(f"statestore restore-backup: refused, nothing loaded: {exc}", file=sys.stderr)
        return 1
    query = as_query or index["query"]
    root = Path(directory)

    async def run() -> int:
        ring = _Ring(seeds, tls_ca)
        touched: list[str] = []
        try:
            held, failed = await ring.stores_of(query)
            if failed and not force:
                print(
                    "statestore restore-backup: refused, nothing loaded: could not ask every "
                    f"member whether query {query} is empty ({'; '.join(failed)}); retry when "
                    "they answer, or pass --force",
                    file=sys.stderr,
                )
                return 1
            if held and not force:
                print(
                    f"statestore restore-backup: refused, nothing loaded: query {query} "
                    f"already holds {len(held)} store(s) on the ring ({held[0]}, ...): restore "
                    "under another name (--as Q2), drop it first (statestore drop), or pass "
                    "--force to load over it",
                    file=sys.stderr,
                )
                return 1
            try:
                # a member that did not answer (--force) may hold any of them
                before = {dataclasses.replace(e.store, query=query) for e in index["stores"]}
                suspect = frozenset(before if failed else held)
                await _load(ring, root, index, query, touched, console, held=suspect)
                await _check_loaded(ring, index, query)
            except (StateStoreError, OSError) as exc:
                print(f"statestore restore-backup: loading failed: {exc}", file=sys.stderr)
                if held or failed:
                    # the query held stores before (--force), or may have on a member that
                    # did not say: a drop would delete them
                    before_load = "held stores before" if held else "may have held stores"
                    print(
                        f"query {query} {before_load} (--force): nothing dropped; these "
                        "stores may be partly loaded: " + ", ".join(sorted(touched)),
                        file=sys.stderr,
                    )
                    return 1
                # a writer may have committed to the query since it was found empty (a job
                # started on it early, another store of it): its stores are not dropped
                now, unanswered = await ring.stores_of(query)
                others = sorted({s.path for s in now} - set(touched))
                if others or unanswered:
                    why = (
                        f"it now holds stores this restore did not write ({', '.join(others)})"
                        if others
                        else f"not every member said what it holds ({'; '.join(unanswered)})"
                    )
                    print(
                        f"query {query}: nothing dropped: {why}; these stores may be partly "
                        "loaded: " + ", ".join(sorted(touched)),
                        file=sys.stderr,
                    )
                    return 1
                try:
                    result = await ring.drop(query)
                except StateStoreError as drop_exc:
                    print(
                        f"could not drop what was loaded ({drop_exc}): run `statestore drop "
                        f"--query {query}` (an admin token) before using it",
                        file=sys.stderr,
                    )
                    return 1
                if result.get("complete"):
                    print(f"dropped query {query}: nothing of it is left", file=sys.stderr)
                else:
                    print(
                        f"dropped query {query} where it could; a member that was down purges "
                        "when it comes back (statestore drop says more)",
                        file=sys.stderr,
                    )
                return 1
        finally:
            await ring.close()
        return 0

    code = asyncio.run(run())
    if code == 0:
        entries: list[StoreEntry] = index["stores"]
        print(
            f"restored {len(entries)} stores into query {query}: "
            f"{sum(len(e.versions) for e in entries)} versions, each read back and checked, "
            f"in {time.monotonic() - began:.1f}s (backup of {index['query']}"
            + (f" at version <= {index['version_at']}" if index["version_at"] else "")
            + ")"
        )
    return code
