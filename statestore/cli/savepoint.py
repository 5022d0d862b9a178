"""``statestore spark-savepoint`` and ``statestore spark-restore-savepoint`` (docs/spark.md,
"Savepoints"): a ring-backed Spark query's state at one batch plus the checkpoint metadata it
resumes from, moved to a new checkpoint location on another (or the same) ring.

A savepoint is a directory::

    DIR/savepoint.json              the index, written last (checksummed like backup.json)
    DIR/checkpoint/...              the checkpoint files the query resumes from (below)
    DIR/state/                      a backup (cli/backup.py, wire/backup.py) of the query's
                                    ring stores at store version N + 1

Batch N of a ring-backed query commits store version N + 1 of every partition (Spark loads
version N for batch N and commits N + 1), so the state after batch N is the backup at
``--version-at N+1``. The checkpoint files are: ``metadata`` (the query id), ``offsets/N-1``,
``offsets/N`` and ``commits/N-1``, ``commits/N`` (Spark restarts after the latest committed
batch and reads the one before it for the committed offsets), each ``sources/<i>`` log
(entries past the source's offset in ``offsets/N`` left out, for sources whose offset is a
``logOffset``, the file source) and the whole ``state/`` tree, which holds only metadata for
this provider (operator metadata, schema files, the partitions' ``_ring`` markers). Hidden
files (Hadoop's ``.crc``, temporary files) are not copied.

The provider names a query's ring stores by the checkpoint root (``<location>/state`` as Spark
qualifies it, ``file:/...`` for a local path) and the query id (spark_connector's
``StoreNaming.java``): a new location means new store names. The restore loads the backup
under the name the new location gives (restore-backup's ``--as``), then writes the new
location, so the query started there with the ring's seeds reads that state and runs
batch N + 1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from statestore.cli.command import Subparsers, add_client_tls, add_seeds, failer
from statestore.core.formats import VERSION

__all__ = [
    "add_parser",
    "restore_savepoint",
    "ring_query_name",
    "savepoint",
    "verify_savepoint",
]

FORMAT = "statestore-spark-savepoint"
FORMAT_VERSION = 1
INDEX = "savepoint.json"
PARTIAL = ".partial-savepoint"
PROVIDER = "statestore.spark.RingStateStoreProvider"
PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass"
# a local path that Hadoop's Path/URI turn into "file:" + the path unchanged
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9._/+-]*")


class SavepointInvalid(ValueError):
    """A savepoint that must not be restored: partial, corrupt, or not a savepoint."""


def add_parser(sub: Subparsers) -> None:
    sp = sub.add_parser(
        "spark-savepoint",
        help="save a ring-backed Spark query at one batch: its ring state and checkpoint "
        "metadata, restorable into a new checkpoint on another ring",
    )
    sp.add_argument(
        "--checkpoint", required=True, metavar="DIR", help="the query's local checkpointLocation"
    )
    add_seeds(sp)
    sp.add_argument(
        "--batch-id",
        type=_batch_id,
        default=None,
        metavar="N",
        help="the committed batch to save (default: the last committed one)",
    )
    sp.add_argument("--out", required=True, metavar="DIR2", help="a new (or empty) directory")
    add_client_tls(sp)
    sp.set_defaults(run=_run_savepoint)

    rs = sub.add_parser(
        "spark-restore-savepoint",
        help="verify a Spark savepoint, load its state into a ring and write a new checkpoint "
        "location the query resumes from",
    )
    rs.add_argument("--from", dest="source", required=True, metavar="DIR2")
    add_seeds(rs)
    rs.add_argument(
        "--checkpoint",
        required=True,
        metavar="NEWDIR",
        help="the new checkpoint location to write (a new or empty local directory)",
    )
    rs.add_argument(
        "--as",
        dest="as_location",
        default=None,
        metavar="URI",
        help="the checkpointLocation the query will be started with, fully qualified as Spark "
        "qualifies it (e.g. hdfs://nn:8020/ckpt/q1, after copying NEWDIR there); the ring "
        "query name is derived from it (default: file: + NEWDIR's absolute path)",
    )
    rs.add_argument(
        "--force",
        action="store_true",
        help="load even when the target ring query holds stores (restore-backup --force)",
    )
    add_client_tls(rs)
    rs.set_defaults(run=_run_restore)


def _batch_id(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a batch id (an integer >= 0)")
    return int(text)


def _run_savepoint(args: argparse.Namespace) -> int:
    return savepoint(
        args.seeds, args.checkpoint, args.out, batch_id=args.batch_id, tls_ca=args.tls_ca
    )


def _run_restore(args: argparse.Namespace) -> int:
    return restore_savepoint(
        args.seeds,
        args.source,
        args.checkpoint,
        as_location=args.as_location,
        force=args.force,
        tls_ca=args.tls_ca,
    )


# -- names ---------------------------------------------------------------------------------


def _qualified(checkpoint: str) -> str:
    """A local checkpoint location as Spark qualifies it (``file:/abs/path``)."""
    path = os.path.abspath(checkpoint)
    if not _PLAIN_PATH.fullmatch(path):
        raise ValueError(
            f"{path}: a checkpoint path with characters outside [A-Za-z0-9._/+-] is escaped "
            "by Hadoop; give the location as Spark names it with --as, or use a plain path"
        )
    return "file:" + path


def ring_query_name(location: str, query_id: str) -> str:
    """The ring query name the provider gives the stores of the query with id ``query_id``
    at checkpoint ``location`` (qualified): StoreNaming.queryName of ``<location>/state``."""
    root = location.rstrip("/") + "/state"
    clean = re.sub(r"[^A-Za-z0-9._-]+", "_", root)
    clean = re.sub(r"^[._-]+|[._-]+$", "", clean)
    if len(clean) > 100:
        clean = re.sub(r"^[._-]+", "", clean[-100:])
    digest = hashlib.sha256(f"{root}#{query_id}".encode()).hexdigest()[:12]
    return f"{clean}-{digest}" if clean else f"q-{digest}"


# -- the checkpoint files --------------------------------------------------------------------


def _batches(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def _offsets(ckpt: Path, batch: int) -> tuple[dict[str, Any], list[str]]:
    """offsets/N: its metadata (conf, watermark) and its source offsets, one line each."""
    lines = (ckpt / "offsets" / str(batch)).read_text().splitlines()
    if len(lines) < 2 or not lines[0].startswith("v"):
        raise ValueError(f"{ckpt}/offsets/{batch} is not a Spark offset log entry")
    meta: dict[str, Any] = json.loads(lines[1])
    return meta, lines[2:]


def _log_offset(line: str) -> int | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    if isinstance(value, dict) and isinstance(value.get("logOffset"), int):
        return int(value["logOffset"])
    return None


def _checkpoint_files(ckpt: Path, batch: int) -> list[str]:
    """The checkpoint's files (relative paths) a query needs to resume after ``batch``."""
    _, sources = _offsets(ckpt, batch)
    files = ["metadata"]
    for log in ("offsets", "commits"):
        files += [f"{log}/{b}" for b in (batch - 1, batch) if b >= 0]
    for src in _batches(ckpt / "sources"):
        upto = _log_offset(sources[src]) if src < len(sources) else None
        for p in sorted((ckpt / "sources" / str(src)).iterdir()):
            head = p.name.split(".")[0]
            if p.name.startswith(".") or not p.is_file() or not head.isdigit():
                continue
            if upto is None or int(head) <= upto:
                files.append(f"sources/{src}/{p.name}")
    for p in sorted((ckpt / "state").rglob("*")):
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(ckpt).parts):
            files.append(p.relative_to(ckpt).as_posix())
    for f in files:
        if not (ckpt / f).is_file():
            raise ValueError(f"{ckpt}/{f} is missing: the checkpoint cannot resume at {batch}")
    return files


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


def _new_dir(path: Path, what: str) -> str | None:
    """Why ``path`` cannot be a new directory (None when it can)."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        return f"{what} {path} exists and is not empty: give a new directory"
    partial = path.with_name(path.name + PARTIAL)
    if partial.exists():
        return f"{partial} exists: a run into {path} that did not finish; delete it first"
    return None


# -- spark-savepoint -------------------------------------------------------------------------


def savepoint(
    seeds: list[str],
    checkpoint: str,
    out: str,
    *,
    batch_id: int | None = None,
    tls_ca: str | None = None,
) -> int:
    """``statestore spark-savepoint``: the checkpoint's metadata for batch N and a backup of
    the query's ring stores at version N + 1 into the new directory ``out``."""
    from statestore.cli.backup import backup
    from statestore.wire.backup import INDEX as BACKUP_INDEX
    from statestore.wire.backup import decode_index, encode_index, file_digest

    fail = failer("spark-savepoint")
    ckpt = Path(checkpoint)
    if not (ckpt / "metadata").is_file():
        return fail(f"{checkpoint} is not a Spark checkpoint (no metadata file)")
    committed = _batches(ckpt / "commits")
    if not committed:
        return fail(f"{checkpoint} has no committed batch: nothing to save")
    batch = committed[-1] if batch_id is None else batch_id
    if batch not in committed or not (ckpt / "offsets" / str(batch)).is_file():
        return fail(f"batch {batch} is not committed in {checkpoint} (committed: {committed})")
    try:
        meta, _ = _offsets(ckpt, batch)
        query_id = str(json.loads((ckpt / "metadata").read_text())["id"])
        location = _qualified(checkpoint)
        files = _checkpoint_files(ckpt, batch)
    except (OSError, ValueError, KeyError) as exc:
        return fail(str(exc))
    provider = meta.get("conf", {}).get(PROVIDER_KEY)
    if provider != PROVIDER:
        return fail(
            f"batch {batch} of {checkpoint} ran on {provider or 'the default provider'}, not "
            f"the ring ({PROVIDER}): its state is in the checkpoint; copy the checkpoint instead"
        )
    query = ring_query_name(location, query_id)
    final = Path(out)
    why = _new_dir(final, "--out")
    if why:
        return fail(why)
    tmp = final.with_name(final.name + PARTIAL)
    tmp.mkdir(parents=True)
    began = time.monotonic()
    try:
        listed = []
        for f in files:
            data = (ckpt / f).read_bytes()
            _write(tmp / "checkpoint" / f, data)
            listed.append({"path": f, "size": len(data), "xxh3_128": file_digest(data)})
        code = backup(seeds, query, str(tmp / "state"), version_at=batch + 1, tls_ca=tls_ca)
        if code != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            return fail(f"the backup of ring query {query} failed; nothing kept")
        state = decode_index((tmp / "state" / BACKUP_INDEX).read_bytes())
        parts = int(meta.get("conf", {}).get("spark.sql.shuffle.partitions", 0))
        short = [
            f"{e.store} v{e.versions[-1]}"
            for e in state["stores"]
            if e.versions[-1] != batch + 1 and e.store.partition < parts
        ]
        if short:
            shutil.rmtree(tmp, ignore_errors=True)
            return fail(
                f"the ring does not hold version {batch + 1} (batch {batch}) of every store of "
                f"ring query {query}: {', '.join(short[:5])}; nothing kept (was it dropped by "
                "retention? save a later batch)"
            )
        index = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "statestore": VERSION,
            "created_at": time.time(),
            "batch_id": batch,
            "store_version": batch + 1,
            "query_id": query_id,
            "source": {"checkpoint": location, "ring_query": query, "seeds": list(seeds)},
            "files": listed,
        }
        _write(tmp / (INDEX + ".tmp"), encode_index(index))
        os.replace(tmp / (INDEX + ".tmp"), tmp / INDEX)
        _fsync_dir(tmp)
        if final.exists():
            final.rmdir()
        os.replace(tmp, final)
        _fsync_dir(final.resolve().parent)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        return fail(f"{exc}; nothing kept")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(
        f"saved batch {batch} of {checkpoint} (ring query {query}, store version {batch + 1}): "
        f"{len(state['stores'])} stores, {len(listed)} checkpoint files, in "
        f"{time.monotonic() - began:.1f}s to {out}"
    )
    return 0


# -- spark-restore-savepoint -------------------------------------------------------------------


def verify_savepoint(directory: Path) -> dict[str, Any]:
    """Check the index (present, its checksum, its format) and every checkpoint file it
    lists (present, size, xxh3-128); the state backup is verified by restore-backup."""
    from statestore.wire.backup import encode_index, file_digest

    if directory.name.endswith(PARTIAL):
        raise SavepointInvalid(f"{directory} is a savepoint that did not finish ({PARTIAL})")
    try:
        raw = (directory / INDEX).read_bytes()
    except FileNotFoundError:
        raise SavepointInvalid(
            f"{directory} has no {INDEX}: a savepoint that did not finish, or not a savepoint"
        ) from None
    try:
        index: dict[str, Any] = json.loads(raw)
    except ValueError as exc:
        raise SavepointInvalid(f"{INDEX} is not JSON ({exc}): it is damaged") from exc
    if not isinstance(index, dict) or encode_index(index) != raw:
        raise SavepointInvalid(f"{INDEX} does not match its own checksum: damaged or edited")
    if index.get("format") != FORMAT or index.get("format_version") != FORMAT_VERSION:
        raise SavepointInvalid(
            f"{INDEX} is format {index.get('format')!r} version {index.get('format_version')!r};"
            f" this build reads {FORMAT!r} version {FORMAT_VERSION}"
        )
    for f in index["files"]:
        rel = str(f["path"])
        if rel.startswith("/") or ".." in rel.split("/"):
            raise SavepointInvalid(f"{INDEX} lists {rel!r:.80}, outside the savepoint")
        path = directory / "checkpoint" / rel
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise SavepointInvalid(f"checkpoint/{rel} is missing from the savepoint") from None
        if len(data) != f["size"] or file_digest(data) != f["xxh3_128"]:
            raise SavepointInvalid(f"checkpoint/{rel} does not match its checksum: it is corrupt")
    return index


def restore_savepoint(
    seeds: list[str],
    source: str,
    checkpoint: str,
    *,
    as_location: str | None = None,
    force: bool = False,
    tls_ca: str | None = None,
) -> int:
    """``statestore spark-restore-savepoint``: verify, load the state into the ring under the
    name the new location gives, then write the new checkpoint location."""
    from statestore.cli.backup import restore_backup

    fail = failer("spark-restore-savepoint")
    root = Path(source)
    try:
        index = verify_savepoint(root)
    except (SavepointInvalid, KeyError, TypeError) as exc:
        return fail(f"refused, nothing loaded: {exc}")
    final = Path(checkpoint)
    why = _new_dir(final, "--checkpoint")
    if why:
        return fail(why)
    try:
        location = as_location.rstrip("/") if as_location else _qualified(checkpoint)
    except ValueError as exc:
        return fail(str(exc))
    query = ring_query_name(location, str(index["query_id"]))
    code = restore_backup(seeds, str(root / "state"), as_query=query, force=force, tls_ca=tls_ca)
    if code != 0:
        return fail(f"the ring state was not loaded; {checkpoint} not written")
    tmp = final.with_name(final.name + PARTIAL)
    try:
        for f in index["files"]:
            data = (root / "checkpoint" / f["path"]).read_bytes()
            _write(tmp / f["path"], data)
        if final.exists():
            final.rmdir()
        os.replace(tmp, final)
        _fsync_dir(final.resolve().parent)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        return fail(
            f"the state is loaded as ring query {query} but {checkpoint} could not be written "
            f"({exc}): run again with --force once fixed, or drop it (statestore drop)"
        )
    print(
        f"restored batch {index['batch_id']} of {index['source']['checkpoint']} into "
        f"{location} (ring query {query}): start the query with checkpointLocation={location} "
        f"on this ring and it runs batch {index['batch_id'] + 1}"
    )
    return 0
