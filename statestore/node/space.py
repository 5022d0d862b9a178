"""Disk space given back: compaction of the storage file while the node serves.

LMDB reuses freed pages but never shrinks its file, so without this a node's data dir stays
at its high-water mark after retention, ``gc``, ``statestore drop`` or a hand-over freed
what it held. Every :data:`CHECK_EVERY` seconds the loop reads how the file is used (two
LMDB calls, no scan) and, when the free pages reach ``--reclaim-at`` of the file and at
least ``--reclaim-min`` bytes, swaps in a compacted copy on a worker thread
(node/backends.LmdbBackend.compact).

Costs: a check is O(1). A compaction reads and writes the live pages once (disk: the live
bytes, briefly twice on disk while the copy is made; CPU: a page copy, no decode). Reads and
writes go on while the copy is made; the writes made meanwhile are held in memory (at most a
quarter of ``--memory-budget`` and 256 MiB: past it they are let go at once and the
compaction gives up until the next look) and replayed onto the copy, and
only the last replay and the swap hold them (measured in docs/benchmarks.md, "Storage").
With the defaults (a quarter of the file free, 64 MiB at least) a file is compacted at most
once per quarter of it freed, so the write volume it adds is bounded by 3x what was freed. A
compaction starts only when the disk holds its copy and the node's read-only reserve
(``min_free_bytes``, 64 MiB) besides: on a fuller disk it would fail half way or turn the
node read-only.
"""

from __future__ import annotations

import asyncio
import logging
import time

from statestore.core.errors import InsufficientStorage
from statestore.node.backends import MAX_COMPACT_LOG, Space
from statestore.node.daemon import Node

__all__ = [
    "CHECK_EVERY",
    "MAX_BACKOFF",
    "compact_log_bytes",
    "due",
    "reclaim",
    "room_for_copy",
    "space_loop",
]

log = logging.getLogger(__name__)
CHECK_EVERY = 5.0  # seconds between two looks at the file
MAX_BACKOFF = 300.0  # seconds between two tries at most, after compactions that gave up


def due(space: Space, at: float, min_bytes: int) -> bool:
    """Whether ``space``'s free pages are worth giving back: at least ``at`` of the file
    and at least ``min_bytes`` (``at`` 0: never)."""
    return at > 0 and space.free >= min_bytes and space.free >= at * space.file


def compact_log_bytes(node: Node) -> int:
    """What a compaction may hold of the writes made during its copy: a quarter of
    ``--memory-budget``, at most :data:`MAX_COMPACT_LOG` (request bodies share the budget;
    this is memory beside it, so it is kept to a share of it)."""
    return max(1, min(MAX_COMPACT_LOG, node.config.memory_budget // 4))


def room_for_copy(space: Space, disk_free: int | None, reserve: int) -> bool:
    """Whether the disk holds a compaction's copy (the live pages) and keeps the node's
    read-only reserve (``min_free_bytes``) besides (None: the free space is unknown)."""
    return disk_free is None or disk_free - space.used >= reserve


async def reclaim(node: Node) -> tuple[int, int] | None:
    """One look, and a compaction when :func:`due` and the disk holds its copy
    (:func:`room_for_copy`; else it gives up, counted, as one that failed): ``(bytes
    before, after)`` or None."""
    backend = node.store.backend
    if backend.unsynced is not None:  # read-only until restarted: nothing to give back for
        return None
    space = await asyncio.to_thread(backend.space)
    if not due(space, node.config.reclaim_at, node.config.reclaim_min):
        return None
    disk_free = node.disk_free()
    if not room_for_copy(space, disk_free, node.config.min_free_bytes):
        node.stats["compactions_given_up"] += 1
        log.warning(
            "storage compaction skipped: its copy needs %d bytes and the disk has %d free, "
            "which would leave less than the %d-byte reserve (the node would turn read-only "
            "or the copy fail half way); it is tried again later",
            space.used,
            disk_free,
            node.config.min_free_bytes,
        )
        return None
    started = time.monotonic()
    try:
        before, after = await asyncio.to_thread(backend.compact, compact_log_bytes(node))
    except InsufficientStorage as exc:  # LMDB or the disk failed, or too much was written
        node.stats["compactions_given_up"] += 1
        log.warning("storage compaction skipped: %s", exc)
        return None
    took = time.monotonic() - started
    node.stats["compactions"] += 1
    node.stats["bytes_reclaimed"] += max(0, before - after)
    log.info(
        "storage compacted: %d -> %d bytes (%d free pages given back) in %.2f s, reads and "
        "writes held %.3f s",
        before,
        after,
        space.free,
        took,
        getattr(backend, "last_pause", 0.0),
    )
    return before, after


async def space_loop(node: Node) -> None:
    """:func:`reclaim` every :data:`CHECK_EVERY` seconds (a supervised loop: node/server.py);
    after a compaction that gave up (too much written during its copy, or LMDB failed), the
    next waits twice as long each time, up to :data:`MAX_BACKOFF` seconds: a steady writer
    must not cost a copy of the whole file every few seconds."""
    if not node.config.reclaim_at > 0 or node.store.backend.gives_space_back:
        return
    wait = CHECK_EVERY
    while True:
        await asyncio.sleep(wait)
        gave_up = node.stats["compactions_given_up"]
        await reclaim(node)
        failed = node.stats["compactions_given_up"] > gave_up
        wait = min(wait * 2, MAX_BACKOFF) if failed else CHECK_EVERY
