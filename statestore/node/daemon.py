"""The node daemon: storage, membership, discovery and the background loops, under one owner.

``Node`` is a thin async shell: placement, quorum, chunk and membership decisions come from the
pure core; this module only waits (on sockets, the disk thread and timers). Every background
task (gossip, discovery, repair, compaction) is started in :meth:`Node.start` and cancelled and
awaited in :meth:`Node.stop`, in reverse order (docs/security.md, Supervised loops). Storage writes
run on a single writer thread (node/writer.py: foreground first), which is what makes the fencing
check atomic with the write.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import functools
import json
import logging
import os
import random
import shutil
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, TypeVar

from aiohttp import web

from statestore.core.balance import ServedMeter
from statestore.core.errors import (
    DataDirInUse,
    InsufficientStorage,
    NodeUnavailable,
    StateStoreError,
    Unavailable,
)
from statestore.core.formats import DISK_FORMAT, VERSION, WIRE_FORMAT, check_disk_format
from statestore.core.handover import Handover, NodeState
from statestore.core.membership import MAX_VNODES, REMOVED, Membership, Status
from statestore.core.quota import Quotas, parse_quotas
from statestore.core.view import MemberInfo, RingView
from statestore.net.restorer import Restorer
from statestore.net.tls import client_context
from statestore.net.transport import Transport
from statestore.node.auth import Access
from statestore.node.backends import Backend, open_backend
from statestore.node.budget import MemoryBudget
from statestore.node.config import NodeConfig
from statestore.node.discovery import Discovery
from statestore.node.foreground import ForegroundGate
from statestore.node.replica import NodeStore
from statestore.node.watched import WatchedFile
from statestore.node.writer import PriorityWriter
from statestore.wire.bodies import GossipDigest, decode_json

__all__ = [
    "NODE",
    "DataDirInUse",
    "Loop",
    "MoveStatus",
    "Node",
    "NodeConfig",
    "stored_identity",
    "stored_ring_state",
]

log = logging.getLogger(__name__)
T = TypeVar("T")
# Storage writes that add data: refused at the write while the node is read-only (a full disk)
_ADDS_DATA = frozenset(
    {
        NodeStore.put_chunk,
        NodeStore.put_chunk_copy,
        NodeStore.copy_pulled,
        NodeStore.put_manifest,
        NodeStore.copy_manifest,
        NodeStore.copy_manifests,
        NodeStore.put_hint,
    }
)
# what a gossip or health answer may hold: a member's entry is a few KiB (its tokens), so
# thousands of members; a process answering more is cut off, not read into memory
GOSSIP_ANSWER_BYTES = 16 << 20
STORAGE_RETRY = 10.0  # seconds read-only after a write failed for want of room, then retry
# where a storage write queues (node/writer.py): a client's, a copy's, or after everything
WriteOrder = Literal["foreground", "copy", "barrier"]


def _lock_data_dir(data_dir: str) -> int:
    """Hold an exclusive lock on the data dir for the life of the process."""
    os.makedirs(data_dir, exist_ok=True)
    fd = os.open(os.path.join(data_dir, "node.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataDirInUse(
            f"data dir {data_dir} is in use by another running node: give each node its own "
            "--data-dir (or stop the other one)"
        ) from None
    return fd


def stored_identity(data_dir: str) -> str | None:
    """The node id kept in ``data_dir`` (None: a new node)."""
    path = os.path.join(data_dir, "node.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        ident = json.load(f).get("id")
    return str(ident) if ident else None


def stored_ring_state(data_dir: str) -> str:
    """The ring state kept in ``data_dir`` (``joining``, ``normal``, ``left``; "": none)."""
    path = os.path.join(data_dir, RING_STATE_FILE)
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        return str(json.load(f).get("state", ""))


def _load_identity(data_dir: str, adopt: tuple[str, int] | None = None) -> tuple[str, int]:
    """The node id kept in the data dir, and a new incarnation (one more than last start).
    ``adopt`` (``--replace``): a new data dir takes that id, at least at that incarnation.
    The data dir's disk format is recorded here at its first start; one this build cannot
    read is :class:`UnknownDiskFormat` before anything in the dir is opened or written
    (core/formats.py)."""
    os.makedirs(data_dir, exist_ok=True)
    path = os.path.join(data_dir, "node.json")
    ident: dict[str, Any] = {}
    disk_format = DISK_FORMAT  # a new data dir
    if os.path.exists(path):
        with open(path) as f:
            ident = json.load(f)
        # one this build reads; once its storage opens, the node records this build's
        # format (_record_disk_format): it writes that from then on
        disk_format = check_disk_format(ident.get("disk_format"), data_dir, ident.get("version"))
    elif adopt is not None:
        ident = {"id": adopt[0], "incarnation": adopt[1] - 1}
    node_id = str(ident.get("id") or uuid.uuid4().hex[:16])
    incarnation = int(ident.get("incarnation", 0)) + 1
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(
            {
                "id": node_id,
                "incarnation": incarnation,
                "disk_format": disk_format,
                "version": VERSION,  # the last build that started on it
            },
            f,
        )
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return node_id, incarnation


def _record_disk_format(data_dir: str) -> None:
    """Record this build's disk format in ``node.json`` once the node's storage opened on a
    data dir of an older format it reads (core/formats.py): from then on it writes records
    of this format there, which an older build must refuse."""
    path = os.path.join(data_dir, "node.json")
    with open(path) as f:
        ident = json.load(f)
    if ident.get("disk_format") == DISK_FORMAT:
        return
    ident["disk_format"] = DISK_FORMAT
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(ident, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


RING_STATE_FILE = "ring-state.json"
SPANS = 40  # a move's timeline keeps its last 40 steps (GET /v1/handover)


def _forget(tasks: dict[str, asyncio.Task[None]], key: str, _: asyncio.Task[None]) -> None:
    tasks.pop(key, None)


def _load_ring_state(data_dir: str, join: bool) -> NodeState:
    """The ring state to start in: ``joining`` with ``--join`` unless a join already
    finished here, or when a join started here did not finish (whatever the flags: a partial
    copy must not serve reads or count in quorums), else ``normal``. A decommissioned node
    (``left`` kept in the data dir) refuses to start without ``--join``: it would take back
    ranges others now own."""
    kept = stored_ring_state(data_dir)
    if kept == NodeState.LEFT and not join:
        raise ValueError(
            f"the node in {data_dir} was decommissioned (it left the ring): start it with "
            "--join to add it again, or give it an empty --data-dir"
        )
    if kept == NodeState.JOINING or (join and kept != NodeState.NORMAL):
        return NodeState.JOINING
    return NodeState.NORMAL


def _load_vnodes(data_dir: str, key: str = "vnodes") -> int:
    """The token count a rebalance gave this node (0: the ring's ``--vnodes``), kept so that a
    restart takes back exactly the tokens it owned; ``key="next_vnodes"``: the count a token
    move under way when the node stopped was moving it to (0: none), which it resumes."""
    path = os.path.join(data_dir, RING_STATE_FILE)
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        n = json.load(f).get(key, 0)
    return n if type(n) is int and 0 <= n <= MAX_VNODES else 0


def _save_ring_state(
    data_dir: str, state: NodeState, vnodes: int = 0, next_vnodes: int = 0
) -> None:
    path = os.path.join(data_dir, RING_STATE_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"state": state.value, "vnodes": vnodes, "next_vnodes": next_vnodes}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@dataclass
class MoveStatus:
    """This node's join or leave as operators see it (``GET /v1/handover``, ``statestore
    ring``): the core's machine plus the current round's progress."""

    handover: Handover
    started: float
    round_total: int = 0
    round_done: int = 0
    bytes: int = 0
    vnodes_from: int = 0  # a rebalance: the token counts it moves from and to
    vnodes_to: int = 0
    # where the move's time went, oldest first: (step, seconds), the last SPANS kept
    spans: list[tuple[str, float]] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)  # wall clock, for the operator

    def span(self, step: str, started: float, now: float) -> None:
        """Record that ``step`` (``spread leaving``, ``round 2 list``, ...) took from
        ``started`` to ``now``."""
        self.spans = [*self.spans[-(SPANS - 1) :], (step, round(now - started, 3))]

    def to_json(self, now: float) -> dict[str, Any]:
        h = self.handover
        took = max(now - self.started, 1e-9)
        return {
            "kind": h.kind,
            "phase": h.phase.value,
            "rounds": h.rounds,
            "round_total": self.round_total,
            "round_done": self.round_done,
            "copied": h.copied,
            "bytes": self.bytes,
            "seconds": round(took, 3),
            "started_at": round(self.started_at, 3),
            "rate_mbps": round(self.bytes / took / 1e6, 3),
            "reason": h.reason,
            "last_round": None if h.last is None else vars(h.last),
            "vnodes_from": self.vnodes_from,
            "vnodes_to": self.vnodes_to,
            "spans": [list(p) for p in self.spans],
        }


def _own_hosts(*hosts: str) -> frozenset[str]:
    """Names and addresses this machine answers to: a gossip member at one of them on our
    port is this node (core/membership refuses it). Resolves names once, at start."""
    out = {h.lower() for h in hosts if h}
    for name in (socket.gethostname(), socket.getfqdn(), *hosts):
        if not name:
            continue
        out.add(name.lower())
        try:
            _, aliases, addrs = socket.gethostbyname_ex(name)
        except OSError:
            continue
        out.update(a.lower() for a in aliases)
        out.update(addrs)
    return frozenset(out)


class Node:
    """One ring node.

    Args:
        config: its settings.
        clock: the time every interval, TTL and failure-detector decision reads.
        rng: the randomness of gossip (whom to talk to); seeded in a simulation.
        transport: outbound calls (default: HTTP); the simulator passes an in-memory one.
        backend: byte storage (default: ``config.storage``'s URL); the simulator passes one
            that outlives the node, so a restarted node finds its data.
        writer: where storage writes run, one at a time (default: one thread; the simulator
            runs them inline so a run stays deterministic).
        adopt: ``(id, incarnation)`` a new data dir takes (``--replace``, checked by
            node/moves/startup.check_replace): the node enters as ``joining`` with that id.
    """

    def __init__(
        self,
        config: NodeConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        transport: Transport | None = None,
        backend: Backend | None = None,
        writer: Executor | None = None,
        adopt: tuple[str, int] | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.rng = rng or random.Random()
        # before the lock: a CA file it cannot use is a ValueError with nothing to release
        tls = client_context(config.tls_ca or None) if config.tls_cert else None
        self._lock = _lock_data_dir(config.data_dir)
        try:
            self.id, self.incarnation = _load_identity(config.data_dir, adopt)
            self.access = Access(
                self.id, config.cluster_secret_file or None, config.auth_file or None
            )
            self.quotas: WatchedFile[Quotas] | None = (
                WatchedFile(config.quota_file, parse_quotas, "--quota-file", "quotas")
                if config.quota_file
                else None
            )
            # a replacement (--replace, or node/moves/startup.check_returning) streams the dead
            # node's share before it serves: a join
            join = config.join or bool(config.replace) or adopt is not None
            self.vnodes = _load_vnodes(config.data_dir)  # 0: the ring's --vnodes
            # a token move the last run did not finish (node/moves/rebalance.resume_loop)
            self.resume_vnodes = _load_vnodes(config.data_dir, "next_vnodes")
            self.initial_state = _load_ring_state(config.data_dir, join)
            if self.initial_state is NodeState.JOINING:
                _save_ring_state(config.data_dir, NodeState.JOINING, self.vnodes)  # until done
        except BaseException:
            os.close(self._lock)
            raise
        url = config.storage or f"lmdb://{os.path.abspath(os.path.join(config.data_dir, 'db'))}"
        self.store = NodeStore(backend or open_backend(url))
        _record_disk_format(config.data_dir)
        self.writer = writer or PriorityWriter()
        self.foreground = ForegroundGate()  # client requests in flight, for copies to yield to
        self.budget = MemoryBudget(config.memory_budget, config.body_timeout, config.max_body)
        # signed, and with the secret every answer proven (node/auth.Access.transport)
        self.transport: Transport = transport or self.access.transport(10.0, tls)
        self.address = f"{config.host}:{config.port}"
        self.membership: Membership | None = None
        self.discovery: Discovery | None = None
        self._tasks: list[asyncio.Task[None]] = []
        # loop name -> (failures so far, the last error, clock time of the last failure)
        self.loop_failures: dict[str, tuple[int, str, float]] = {}
        self.loops: list[str] = []  # the background loops started, by name (for /metrics)
        self.storage_errors: tuple[int, str, float] = (0, "", 0.0)
        # a write that failed for want of room: (error, bytes free then, clock time)
        self.storage_full: tuple[str, int | None, float] | None = None
        self._view: RingView | None = None
        self._directory: list[str] = []
        # seed -> why its last gossip exchange failed (gone once it answers): _seed_watch_loop
        self._seed_errors: dict[str, str] = {}
        self.restorer: Restorer
        self.hints_arrived = asyncio.Event()  # wakes the hint loop (node/hints.py)
        # store path -> the lowest floor a peer's sync/have answer carried above this node's
        # head (it lags: it missed the versions up to it): repair passes again once the head
        # reaches it (node/repair.py), not at its next safety-net slot. One entry per store.
        self.lagging_floors: dict[str, int] = {}
        # called with a query once this node purged it (a drop): the lookup cache forgets it
        self.purge_hooks: list[Callable[[str], None]] = []
        # whether the drops this node missed while away are known (node/tombstones.py): its
        # first tombstone exchange, or --down-after since it started; a new data dir held
        # nothing of a drop it missed
        self.tombstones_heard = self.incarnation == 1 and adopt is None
        self._heard = asyncio.Event()  # set with tombstones_heard (heard_drops)
        if self.tombstones_heard:
            self._heard.set()
        self.began = clock()
        self.stats: dict[str, int] = {
            "repaired": 0,
            "handed_off": 0,
            "snapshots": 0,
            "compaction_failed": 0,  # store compaction passes that failed (logged)
            "gc": 0,
            "gc_within_retain": 0,  # this node's floors an owner refused (compaction.py)
            "hints": 0,
            "hints_taken": 0,
            "tentative_confirmed": 0,
            "tentative_rolled_back": 0,
            "have_asked": 0,  # items listed to peers (/v1/sync/have)
            "digest_confirmed": 0,  # items range digests showed a peer holds
            "compactions": 0,  # storage file compactions (node/space.py)
            "compactions_given_up": 0,  # ... that gave up (written meanwhile, LMDB failed)
            "bytes_reclaimed": 0,  # bytes they gave back to the file system
        }
        self.move: MoveStatus | None = None  # a join, leave or token move, under way or done
        self.served = ServedMeter()  # requests and bytes served lately (GET /v1/load)
        self._superseded_logged = False

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self, port: int, loops: Sequence[tuple[str, Loop]] = ()) -> None:
        """Called once the HTTP socket is bound to ``port``; starts gossip, discovery and the
        given background ``loops`` (repair, compaction: node/server.py passes them)."""
        host = self.config.host
        if host in ("0.0.0.0", "::", ""):  # a wildcard is no address to give to others
            host = socket.gethostname()
        self.address = self.config.advertise or f"{host}:{port}"
        self.membership = Membership(
            self.id,
            self.address,
            self.config.zone,
            self.incarnation,
            self.clock(),
            suspect_after=self.config.suspect_after,
            down_after=self.config.down_after,
            own_hosts=_own_hosts(host, self.config.host),
            state=self.initial_state,
            vnodes=self.vnodes,
            chunk_format=self.config.chunk_format,
        )
        await self.transport.start()
        self.restorer = Restorer(self.transport, max_raw=self.config.max_chunk, clock=self.clock)
        # with identity on but no TLS a hop's stream is not proven: no tree folds are believed
        self.restorer.folds = not (self.access.identity_on and not self.config.tls_cert)
        if self.config.dht:
            self.discovery = Discovery(
                self.id, self.config.host, self.address, secret=self.access.secret
            )
            dport = port if self.config.dht_port is None else self.config.dht_port
            try:
                await self.discovery.listen(dport)
            except OSError as exc:  # the first stdout line names the port it took
                taken = await self.discovery.listen(0)
                log.warning(
                    "DHT: UDP port %d is taken (%s); listening on UDP %d instead (peers "
                    "learn it from /v1/health)",
                    dport,
                    exc.strerror or exc,
                    taken,
                )
        self._spawn(self._gossip_loop, "gossip")
        if self.config.seeds:
            self._spawn(self._seed_watch_loop, "seed-watch")
        if self.discovery is not None:
            self._spawn(self._discovery_loop, "discovery")
        for name, loop in loops:
            self._spawn(functools.partial(loop, self), name)

    def spawn(self, factory: Callable[[], Awaitable[None]], name: str) -> None:
        """Run ``factory()`` as an owned, supervised task (stopped with the node)."""
        self._spawn(factory, name)

    def set_state(self, state: NodeState) -> None:
        """Take a new ring state and gossip it; ``normal`` and ``left`` are kept in the data
        dir, so a restart neither joins again nor takes back what it handed over."""
        assert self.membership is not None
        if state in (NodeState.NORMAL, NodeState.LEFT):
            _save_ring_state(self.config.data_dir, state, self.vnodes)
        self.membership.set_state(state, self.clock())
        log.info("node %s is now %s (ring epoch %d)", self.id, state, self.membership.epoch)

    def set_vnodes(self, vnodes: int, next_vnodes: int = 0) -> None:
        """Own ``vnodes`` tokens (0: the ring's count), moving to ``next_vnodes`` (0: not
        moving), and gossip it. Both counts are kept in the data dir (``rebalance``: a
        restart takes back what it owned, never what a move had not handed over yet, and
        resumes the move)."""
        assert self.membership is not None
        _save_ring_state(self.config.data_dir, self.membership.state, vnodes, next_vnodes)
        self.vnodes = vnodes
        self.membership.set_vnodes(vnodes, next_vnodes, self.clock())
        log.info(
            "node %s owns %d tokens%s (ring epoch %d)",
            self.id,
            vnodes or self.config.vnodes,
            f", moving to {next_vnodes}" if next_vnodes else "",
            self.membership.epoch,
        )

    def _spawn(self, factory: Callable[[], Awaitable[None]], name: str) -> None:
        """Run ``factory()`` as an owned task, supervised: when it raises, the failure is
        logged and counted (``/v1/health`` reports it) and the loop starts again after a
        backoff of 0.5 s doubling to 30 s; a loop that then runs a minute clean is healthy
        again and its backoff starts over."""

        async def supervised() -> None:
            backoff = 0.5
            while True:
                started = self.clock()
                try:
                    await factory()
                    return
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    n = self.loop_failures.get(name, (0, "", 0.0))[0] + 1
                    self.loop_failures[name] = (n, f"{type(exc).__name__}: {exc}", self.clock())
                    log.exception("background loop %s failed (%d times); restarting", name, n)
                if self.clock() - started > 60.0:
                    backoff = 0.5
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

        self._tasks.append(asyncio.create_task(supervised(), name=f"statestore-{name}"))
        self.loops.append(name)

    async def stop(self) -> None:
        for task in reversed(self._tasks):
            task.cancel()
        for task in reversed(self._tasks):
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._tasks.clear()
        if self.discovery is not None:
            self.discovery.stop()
        await self.transport.close()
        self.release()

    def release(self) -> None:
        """Close storage and let go of the data dir (after in-flight writes finished)."""
        self.writer.shutdown(wait=True)
        self.store.backend.close()
        os.close(self._lock)

    async def write(self, fn: Callable[..., T], *args: Any, order: WriteOrder = "foreground") -> T:
        """Run a storage write on the single writer thread. ``order``: ``foreground`` (the
        default), ``copy`` (a replica's or a hand-over's copy: waits for every foreground
        write, node/writer.py) or ``barrier`` (after every write queued before it). A full
        disk (ENOSPC) or a failed LMDB write (the backend's InsufficientStorage) is 507,
        counted for ``/v1/health`` and ``/metrics``, and turns the node read-only
        (:meth:`read_only_reason`). A write that adds chunks, manifests or hints checks the
        free space again on the writer thread, right before it writes: the check when its
        request started may be stale after writes queued ahead of it."""
        call = fn
        if getattr(fn, "__func__", None) in _ADDS_DATA:

            def call(*a: Any) -> T:
                self.check_writable()
                return fn(*a)

        try:
            if isinstance(self.writer, PriorityWriter) and order != "foreground":
                submit = (
                    self.writer.submit_background if order == "copy" else self.writer.submit_barrier
                )
                result = await asyncio.wrap_future(submit(call, *args))
            else:
                loop = asyncio.get_running_loop()
                result = await loop.run_in_executor(self.writer, call, *args)
        except OSError as exc:
            self._storage_failed(str(exc), full=exc.errno == errno.ENOSPC)
            if exc.errno == errno.ENOSPC:
                raise InsufficientStorage(
                    f"node {self.id}'s disk is full ({exc}): it is read-only until space is "
                    "freed; the ring writes to the other replicas"
                ) from exc
            raise
        except InsufficientStorage as exc:
            if exc.__cause__ is not None:  # the backend's write failed (not a refusal)
                self._storage_failed(str(exc), full=True)
            raise
        self.storage_full = None  # a write went through: try writes again
        return result

    def _storage_failed(self, error: str, *, full: bool) -> None:
        """Count a failed storage write; a full one makes the node read-only until the free
        space grows, a write succeeds, or STORAGE_RETRY seconds pass (then a write tries)."""
        now = self.clock()
        self.storage_errors = (self.storage_errors[0] + 1, error, now)
        if full:
            self.storage_full = (error, self.disk_free(), now)

    def disk_free(self) -> int | None:
        """Bytes free on the data dir's file system (None: cannot tell)."""
        try:
            return shutil.disk_usage(self.config.data_dir).free
        except OSError:
            return None

    def read_only_reason(self) -> str | None:
        """Why this node takes no new data now (None: it does): its disk is nearly full, or
        a storage write failed for want of room (a full disk or LMDB map) and neither has the
        free space grown since nor STORAGE_RETRY seconds passed; or its storage cannot make a
        write durable until the node starts again (backends.Backend.unsynced)."""
        unsynced = self.store.backend.unsynced
        if unsynced is not None:
            return f"storage: {unsynced}"
        free = self.disk_free()
        if free is not None and free < self.config.min_free_bytes:
            return (
                f"disk nearly full: {free} bytes free under {self.config.data_dir}, below the "
                f"{self.config.min_free_bytes}-byte reserve; read-only until space returns"
            )
        if self.storage_full is not None:
            error, free_then, at = self.storage_full
            grown = free is not None and free_then is not None and free > free_then
            if grown or self.clock() - at >= STORAGE_RETRY:
                self.storage_full = None
            else:
                return f"storage full: a write failed ({error}); read-only until space returns"
        return None

    def quota_limit(self, query: str) -> int | None:
        """The bytes ``query`` may hold on this node (None: no quota), from ``--quota-file``
        re-read if it changed."""
        return self.quotas.current().limit(query) if self.quotas is not None else None

    def quotas_on(self) -> bool:
        """Whether this node enforces any quota (writers then ask for room first)."""
        return self.quotas is not None and bool(self.quotas.current())

    def check_writable(self) -> None:
        """Raise InsufficientStorage (507) while the node is read-only."""
        reason = self.read_only_reason()
        if reason is not None:
            raise InsufficientStorage(f"node {self.id}: {reason}")

    # -- ring view -----------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self.membership.epoch if self.membership is not None else 0

    def view(self) -> RingView:
        assert self.membership is not None
        quotas = self.quotas_on()
        if (
            self._view is None
            or self._view.epoch != self.membership.epoch
            or self._view.quotas != quotas
        ):
            kept = [m for m in self.membership.members() if m.removal != REMOVED]
            members = tuple(
                MemberInfo(
                    m.id,
                    m.address,
                    m.status.value,
                    m.zone,
                    m.state.value,
                    m.vnodes,
                    m.next_vnodes,
                )
                for m in kept  # not those written off for good (statestore removenode)
            )
            self._view = RingView(
                self.membership.epoch,
                members,
                self.config.replicas,
                self.config.write_quorum,
                self.config.vnodes,
                quotas,
                blocks=all(m.chunk_format >= 2 for m in kept),
                whole_names=all(m.chunk_format >= 3 for m in kept),
            )
        return self._view

    # -- gossip --------------------------------------------------------------------------
    async def gossip_with(self, address: str) -> None:
        assert self.membership is not None
        resp = await self.transport.request(
            "POST",
            address,
            "/v1/gossip",
            json_body=self.membership.digest(),
            timeout=2.0,
            max_bytes=GOSSIP_ANSWER_BYTES,  # an address from the directory may be anyone's
        )
        if self.access.identity_on:
            # Push-only: the answer is not signed, so it is not believed. The peer pushes
            # its own (signed) table in its rounds; an address from the DHT directory or a
            # seed is only a place to push to until it pushes to us (docs/security.md).
            return
        digest = decode_json(resp.body, GossipDigest, f"gossip answer of {address}")
        self.membership.merge(digest.to_dict(), self.clock())
        for why in self.membership.refused:
            log.warning("gossip from %s: entry refused: %s", address, why)
        self._check_superseded()

    def _check_superseded(self) -> None:
        """Stand aside once another process took our id (``--replace``): the ring then
        knows only it, and this one must be stopped and its data dir wiped. Every background
        loop stops (gossip, repair, compaction, discovery, ...: they would act on a frozen
        view), and the API answers only health and metrics (node/api.py: a client that
        reached us would otherwise be given a view routing the id's share here)."""
        assert self.membership is not None
        aside = self.membership.superseded or self.membership.removed_self
        if aside is not None and not self._superseded_logged:
            self._superseded_logged = True
            me = asyncio.current_task()
            for task in self._tasks:
                if task is not me:
                    task.cancel()
            if self.membership.superseded is None:  # removed (statestore removenode)
                log.error("%s", self.removed_reason())
                return
            addr, inc = self.membership.superseded
            log.error(
                "node %s was replaced by the node at %s (incarnation %d, statestore node "
                "--replace): this process no longer takes part in the ring; stop it and do "
                "not start its data dir again",
                self.id,
                addr,
                inc,
            )

    def heard_drops(self) -> None:
        """The drops this node missed while away are known and purged (node/tombstones.py):
        its copies may go to peers from now on."""
        self.tombstones_heard = True
        self._heard.set()

    def copies_served(self) -> bool:
        """Whether what this node holds may be copied to peers, pulled by them or pushed by
        it (a join's or token move's listing and pulls, hints handed off, snapshots written
        to owners, a leave's pushes): not before it learned the drops it missed while away
        (its first tombstone exchange, or ``--down-after`` since it started, when no peer
        answered), or a dropped query's data would go back to peers that purged it."""
        return self.tombstones_heard or self.clock() - self.began >= self.config.down_after

    async def until_copies_served(self) -> None:
        """Wait until :meth:`copies_served` (at most ``--down-after`` since the start)."""
        left = self.config.down_after - (self.clock() - self.began)
        if self.tombstones_heard or left <= 0:
            return
        try:
            await asyncio.wait_for(self._heard.wait(), left)
        except TimeoutError:
            pass

    def check_copies_served(self) -> None:
        """NodeUnavailable until :meth:`copies_served`: a peer's pull of this node's copies."""
        if not self.copies_served():
            raise NodeUnavailable(
                f"node {self.id} has not yet learned the drops it missed while away: its "
                "copies are served once it has (a moment after it starts)"
            )

    def removed_reason(self) -> str | None:
        """Why this node stands aside when the ring removed it (None: it did not)."""
        if self.membership is None or self.membership.removed_self is None:
            return None
        mark, by = self.membership.removed_self
        return (
            f"node {self.id} was {'removed' if mark == REMOVED else 'being removed'} from the "
            f"ring by node {by} (statestore removenode): this process serves nothing and "
            "takes no part in the ring; stop it, wipe its data dir, and add the machine back "
            "as a new node with --join"
        )

    def _gossip_targets(self, extra: list[str]) -> list[str]:
        assert self.membership is not None
        others = [m for m in self.membership.members() if m.id != self.id]
        live = [m.address for m in others if m.status is not Status.DOWN]
        down = [m.address for m in others if m.status is Status.DOWN]
        known = {m.address for m in others}
        targets = self.rng.sample(live, min(2, len(live)))
        if down and self.rng.random() < 0.3:
            targets.append(self.rng.choice(down))  # notice a node that came back
        targets += [a for a in extra if a not in known and a != self.address]
        return targets

    async def _gossip_loop(self) -> None:
        assert self.membership is not None
        # A round does not wait for its exchanges: a paused or silent peer would hold every
        # round, and with it our own heartbeat, for the request timeout, and our peers then
        # saw us flap to suspect (tests/ring/test_gray.py under load). An exchange runs on its own;
        # a target whose exchange is still running is skipped until it ends.
        inflight: dict[str, asyncio.Task[None]] = {}
        try:
            while self.membership.superseded is None and self.membership.removed_self is None:
                if self.membership.tick(self.clock()):
                    log.info(
                        "ring epoch %d: %d live",
                        self.membership.epoch,
                        len(self.membership.live()),
                    )
                for a in self._gossip_targets(self.config.seeds + self._directory):
                    if a not in inflight:
                        task = asyncio.create_task(self._exchange(a))
                        inflight[a] = task
                        task.add_done_callback(partial(_forget, inflight, a))
                await asyncio.sleep(self.config.gossip_interval)
        finally:
            for task in list(inflight.values()):
                task.cancel()
        self._check_superseded()  # replaced (--replace): no more heartbeats from us

    async def _exchange(self, address: str) -> None:
        try:
            await self.gossip_with(address)
            self._seed_errors.pop(address, None)
        except StateStoreError as exc:
            # an unreachable or refusing peer: the failure detector speaks for it, and for a
            # seed the seed watch (_seed_watch_loop)
            if address in self.config.seeds:
                self._seed_errors[address] = str(exc.__cause__ or exc)
        except Exception as exc:
            log.warning("gossip with %s failed: %r", address, exc)

    def alone(self) -> bool:
        """No other member known: none of the seeds (nor anyone) has answered yet."""
        assert self.membership is not None
        return all(m.id == self.id for m in self.membership.members())

    async def _seed_watch_loop(self) -> None:
        """While no seed has answered, say so: after ``--down-after`` seconds, then every six
        times that (30 s by default), one warning naming the seeds, why each failed and what
        to check. Quiet once the node hears from the ring."""
        others = [seed for seed in self.config.seeds if seed != self.address]
        if not others:  # its own address only: the first node of a ring
            return
        started = self.clock()
        await asyncio.sleep(self.config.down_after)
        while True:
            if self.membership is not None and self.alone():
                seeds = "; ".join(
                    f"{seed}: {self._seed_errors.get(seed, 'no answer yet')}" for seed in others
                )
                log.warning(
                    "node %s has heard from none of its seeds for %.0f s (%s); it serves "
                    "alone until one answers. Check that they run, that --seeds gives their "
                    "HTTP address (their --listen or --advertise HOST:PORT), that this host "
                    "reaches them, and that they share this node's --cluster-secret-file and "
                    "TLS settings; it keeps trying",
                    self.id,
                    self.clock() - started,
                    seeds,
                )
            await asyncio.sleep(6 * self.config.down_after)

    async def _seed_dht_ports(self, said: set[str]) -> list[tuple[str, int]]:
        """The seeds' DHT addresses, from their ``/v1/health``. A seed that does not answer
        is the seed watch's to report (_seed_watch_loop); one that answers without a DHT
        port (``--no-dht``) is logged once (``said``)."""
        seeds: list[tuple[str, int]] = []
        for seed in self.config.seeds:
            try:
                resp = await self.transport.request(
                    "GET", seed, "/v1/health", timeout=2.0, max_bytes=GOSSIP_ANSWER_BYTES
                )
                host = seed.rsplit(":", 1)[0]
                seeds.append((host, int(resp.json()["dht_port"])))
            except Unavailable as exc:
                log.debug("seed %s gave no DHT port: %s", seed, exc)
            except (StateStoreError, KeyError, ValueError, TypeError) as exc:
                if seed not in said:
                    said.add(seed)
                    log.warning("seed %s gave no DHT port: %s", seed, exc)
        return seeds

    async def _discovery_loop(self) -> None:
        assert self.discovery is not None
        said: set[str] = set()
        while True:
            # bootstrapped from the seeds until the DHT knows a neighbour: a seed down when
            # this node started is tried again each round, not given up on
            if self.config.seeds and not self.discovery.has_neighbors():
                await self.discovery.bootstrap(await self._seed_dht_ports(said))
            directory = await self.discovery.announce()
            self._directory = [a for i, a in directory.items() if i != self.id]
            # 5-7 s: rounds in step (nodes started together) read the value at once and the
            # last write drops the others' entries, round after round
            await asyncio.sleep(5.0 + random.uniform(0.0, 2.0))

    def problems(self) -> list[str]:
        """Why this node is degraded (empty: healthy): loops that failed within the last
        five minutes, a tokens file that no longer parses, storage trouble."""
        now = self.clock()
        out = [
            f"background loop {name} failed {n} time(s), last: {err}"
            for name, (n, err, at) in sorted(self.loop_failures.items())
            if now - at < 300.0
        ]
        out += self.access.problems()
        if self.membership is not None and self.membership.superseded is not None:
            addr, _ = self.membership.superseded
            out.append(f"replaced by the node at {addr} (--replace): stop this process")
        removed = self.removed_reason()
        if removed is not None:
            out.append(removed)
        if self.quotas is not None and self.quotas.error:
            out.append(self.quotas.error)
        out += self.storage_problems()
        return out

    def storage_problems(self) -> list[str]:
        out = []
        reason = self.read_only_reason()
        if reason is not None:
            out.append(reason)
        n, err, at = self.storage_errors
        if n and self.clock() - at < 300.0:
            out.append(f"storage errors: {n}, last: {err}")
        return out

    def health(self) -> dict[str, Any]:
        problems = self.problems()
        return {
            "status": "degraded" if problems else "ok",
            "reasons": problems,
            "id": self.id,
            "address": self.address,
            "zone": self.config.zone,
            "version": VERSION,
            "wire_format": WIRE_FORMAT,
            "disk_format": DISK_FORMAT,
            "incarnation": self.incarnation,
            "epoch": self.epoch,
            "state": self.membership.state.value if self.membership is not None else "normal",
            "dht_port": self.discovery.port if self.discovery is not None else None,
            "dht_directory": len(self._directory),
            # hints: the tentative commits held now (the hint loop may be waiting on the owners)
            "stats": dict(self.stats) | {"hints": self.store.hint_count()},
            "storage": self.storage_figures(),
        }

    def storage_figures(self) -> dict[str, Any]:
        """Bytes held (chunks and manifests), the storage file's bytes and its free pages,
        and file / held (``statestore ring``, docs/operations.md "Disk space")."""
        held, space = self.store.held_bytes(), self.store.backend.space()
        return {
            "held_bytes": held,
            "file_bytes": space.file,
            "free_bytes": space.free,
            "amplification": round(space.file / held, 2) if held else None,
        }

    def unready(self) -> list[str]:
        """Why this node should not be sent traffic now (empty: ready, ``GET
        /v1/health/ready``): it is not a normal member of the ring yet or any more (joining,
        leaving, left, replaced, not started) or it is degraded (:meth:`problems`)."""
        out = []
        if self.membership is None:
            out.append("not started: the node has not joined the ring's gossip yet")
        elif self.membership.state is not NodeState.NORMAL:
            state = self.membership.state.value
            why = {
                "joining": "it is streaming the ranges it will own (--join or --replace) and "
                "serves no reads until that finishes",
                "leaving": "it is handing its copies to their next owners (decommission)",
                "left": "it left the ring (decommissioned)",
            }.get(state, "")
            out.append(f"ring state is {state}" + (f": {why}" if why else ""))
        return out + self.problems()


Loop = Callable[[Node], Awaitable[None]]
NODE = web.AppKey("node", Node)
