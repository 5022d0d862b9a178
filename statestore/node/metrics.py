"""``GET /metrics``: the node's figures in Prometheus text format (``prometheus-client``).

Each node has its own ``CollectorRegistry`` (several nodes share one process in tests and in
the simulator, and the library's global registry would mix them). Two kinds of figures:

- **events**, recorded as they happen by :func:`metrics_middleware`, the outermost middleware
  of the API: request latencies per operation (commit, restore over ``/state`` and ``relay``,
  chunk get/put, point reads), bytes in and out, and refusals (every 4xx answer, by status and
  error code: the errors middleware in node/api.py has already turned exceptions into answers
  by then) and failures (5xx);
- **state**, read when scraped by :class:`NodeCollector`: chunks, manifests and stores held,
  the repair backlog, the ring epoch, members per status, disk use of the data dir, tombstones,
  operations in flight and background loop restarts.

The metric names and their meaning are listed in docs/operations.md.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from statestore.core.errors import SetupError, StateStoreError
from statestore.core.formats import DISK_FORMAT, VERSION, WIRE_FORMAT
from statestore.core.view import STATUSES
from statestore.node.activity import ACTIVITY, Operation
from statestore.node.auth import principal
from statestore.node.daemon import NODE, Node
from statestore.node.gcpause import PAUSES

__all__ = ["METRICS", "NodeMetrics", "metrics_middleware", "register"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    float("inf"),
)
_S = "/v1/stores/{query}/{operator}/{partition}/{name}"
# (method, route pattern) -> (operation, label): which histogram times which endpoint
ROUTES: dict[tuple[str, str], tuple[str, str]] = {
    ("POST", _S + "/commit"): ("commit", ""),
    ("GET", _S + "/state"): ("restore", "state"),
    ("POST", "/v1/relay"): ("restore", "relay"),
    ("PUT", "/v1/chunks/{key}"): ("chunk", "put"),
    ("GET", "/v1/chunks/{key}"): ("chunk", "get"),
    ("POST", "/v1/chunks"): ("chunk", "batch"),
    ("GET", _S + "/key"): ("point_read", ""),
}
READY_PATH = "/v1/health/ready"
# what /v1/activity lists as in flight (chunk traffic is too fine-grained to be worth it)
IN_FLIGHT = {"commit", "restore", "point_read"}


@dataclass
class StorageFigures:
    """What a scrape reads from storage and the data dir (off the event loop)."""

    chunks: int = 0
    manifests: int = 0
    stores: int = 0
    tombstones: int = 0
    disk_used: int = 0
    disk_free: int = 0
    disk_total: int = 0
    file_bytes: int = 0  # the storage file (LMDB: data.mdb)
    free_bytes: int = 0  # its free pages (reused, not given back until compacted)
    per_query: dict[str, int] = field(default_factory=dict)


def _dir_usage(path: str) -> int:
    """Bytes the files under ``path`` occupy on disk (allocated blocks: LMDB files are sparse)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue  # removed while we walked
            total += getattr(st, "st_blocks", 0) * 512 or st.st_size
    return total


def read_storage(node: Node) -> StorageFigures:
    """Count what the node holds and measure its data dir; runs in a worker thread (the
    backends are safe to read from any thread)."""
    f = StorageFigures()
    held = node.store.counts()  # key scans only: values would be copied out
    f.chunks, f.manifests = held["chunks"], held["manifests"]
    f.stores, f.tombstones = held["stores"], held["tombstones"]
    f.disk_used = _dir_usage(node.config.data_dir)
    space = node.store.backend.space()
    f.file_bytes, f.free_bytes = space.file, space.free
    try:
        vfs = os.statvfs(node.config.data_dir)
        f.disk_free = vfs.f_bavail * vfs.f_frsize
        f.disk_total = vfs.f_blocks * vfs.f_frsize
    except OSError:
        pass
    return f


def loop_restarts(node: Node) -> dict[str, int]:
    """Restarts per background loop, from the node's loop supervisor (``Node.loop_failures``:
    loop name -> (failures, last error, when); each failure is followed by a restart). Empty
    on a node without a supervisor."""
    failures = getattr(node, "loop_failures", None)
    if not isinstance(failures, dict):
        return {}
    # every loop started, at 0 until it fails (node/daemon.py Node.loops)
    out: dict[str, int] = dict.fromkeys(map(str, getattr(node, "loops", ())), 0)
    for name, record in failures.items():
        n = record[0] if isinstance(record, tuple) and record else record
        if isinstance(n, int):
            out[str(name)] = n
    return out


class NodeCollector(Collector):
    """The state figures, read at scrape time (storage figures from the last
    :func:`read_storage`, taken by the handler just before)."""

    def __init__(self, app: web.Application) -> None:
        self._app = app
        self.storage = StorageFigures()

    def collect(self) -> Iterator[Metric]:
        node = self._app[NODE]
        f = self.storage
        build = GaugeMetricFamily(
            "statestore_build_info",
            "1, labelled with this node's version and the wire and disk formats it speaks "
            "and keeps (docs/operations.md, Versions and upgrades)",
            labels=["version", "wire_format", "disk_format"],
        )
        build.add_metric([VERSION, str(WIRE_FORMAT), str(DISK_FORMAT)], 1)
        yield build
        yield _gauge("statestore_chunks_held", "Chunks stored on this node", f.chunks)
        yield _gauge("statestore_manifests_held", "Manifests stored on this node", f.manifests)
        yield _gauge("statestore_stores_held", "Stores with a head on this node", f.stores)
        yield _gauge("statestore_tombstones", "Dropped queries remembered here", f.tombstones)
        yield _gauge(
            "statestore_disk_used_bytes", "Bytes the data dir occupies on disk", f.disk_used
        )
        yield _gauge(
            "statestore_disk_free_bytes", "Bytes free on the data dir's filesystem", f.disk_free
        )
        yield _gauge(
            "statestore_disk_total_bytes", "Size of the data dir's filesystem", f.disk_total
        )
        held = node.store.held_bytes()
        yield _gauge(
            "statestore_held_bytes",
            "Bytes of the chunks and manifests this node holds (what its storage must keep)",
            held,
        )
        yield _gauge(
            "statestore_storage_file_bytes",
            "Bytes of the storage file (LMDB's data.mdb: live and free pages)",
            f.file_bytes,
        )
        yield _gauge(
            "statestore_storage_free_bytes",
            "Free pages in the storage file: reused by writes, given back to the file system "
            "by compaction (--reclaim-at, --reclaim-min)",
            f.free_bytes,
        )
        yield _gauge(
            "statestore_disk_amplification",
            "Bytes the data dir occupies on disk / bytes held (0: nothing held)",
            f.disk_used / held if held else 0.0,
        )
        errors = CounterMetricFamily(
            "statestore_storage_errors",
            "Storage writes that failed (a full disk or LMDB map, an I/O error) since start",
        )
        errors.add_metric([], node.storage_errors[0])
        yield errors
        yield _gauge(
            "statestore_read_only",
            "1 while the node takes no new data (disk nearly full, or a write failed for room)",
            1 if node.read_only_reason() is not None else 0,
        )
        yield _gauge(
            "statestore_repair_backlog",
            "Items held here that an owner still lacks (copies and hand-offs waiting)",
            node.stats.get("repair_backlog", 0),
        )
        yield _gauge(
            "statestore_hints",
            "Tentative commits held here as hints, not handed to their owners yet",
            node.store.hint_count(),
        )
        yield _gauge("statestore_ring_epoch", "The ring epoch this node has seen", node.epoch)
        yield _gauge(
            "statestore_memory_budget_used_bytes",
            "Bytes requests in flight hold of the --memory-budget (bodies; commits 3x)",
            node.budget.used,
        )
        yield _gauge(
            "statestore_memory_budget_bytes", "This node's --memory-budget", node.budget.limit
        )
        yield _counter(
            "statestore_memory_budget_refused",
            "Requests refused (429) after waiting for room in the memory budget",
            node.budget.refused,
        )
        yield from _gc_figures()
        members = GaugeMetricFamily(
            "statestore_members", "Ring members by failure-detector state", labels=["status"]
        )
        counts = dict.fromkeys(STATUSES, 0)
        if node.membership is not None:
            for m in node.view().members:
                counts[m.status] = counts.get(m.status, 0) + 1
        for status, n in counts.items():
            members.add_metric([status], n)
        yield members
        events = CounterMetricFamily(
            "statestore_node_events",
            "Background work done: repaired (copies pushed), handed_off (copies dropped after "
            "their owners confirmed), snapshots (folded by compaction), compaction_failed "
            "(store compaction passes that failed: a fold too few replicas took), gc (items "
            "dropped below retention), gc_within_retain (floors this node planned that an "
            "owner refused as within the versions the writer keeps: a stale retain here, or an "
            "owner that lags), "
            "hints_taken (tentative commits kept as hints), "
            "tentative_confirmed and tentative_rolled_back (verdicts this node reached), "
            "have_asked (items repair and hand-over listed to peers) and digest_confirmed "
            "(items range digests showed a peer holds, unlisted); scrubbed, scrub_corrupt and "
            "scrub_replaced (items re-verified at rest, found rotted, replaced from a replica); "
            "hint_passes, hints_tried, hints_superseded and hints_expired (the hint loop's work "
            "and the hints it dropped); divergent and reconciled (manifests whose content "
            "differed from what W owners hold at one version and epoch, and those replaced); "
            "compactions, bytes_reclaimed and compactions_given_up (storage file compactions, "
            "the bytes they gave back to the file system, and those given up)",
            labels=["event"],
        )
        for name in (
            "repaired",
            "handed_off",
            "snapshots",
            "compaction_failed",
            "gc",
            "gc_within_retain",
            "hints_taken",
            "tentative_confirmed",
            "tentative_rolled_back",
            "have_asked",
            "digest_confirmed",
            "scrubbed",
            "scrub_corrupt",
            "scrub_replaced",
            "hint_passes",
            "hints_tried",
            "hints_superseded",
            "hints_expired",
            "divergent",
            "reconciled",
            "compactions",
            "bytes_reclaimed",
            "compactions_given_up",
        ):
            events.add_metric([name], node.stats.get(name, 0))
        yield events
        restarts = CounterMetricFamily(
            "statestore_loop_restarts",
            "Background loop restarts after a failure, by loop",
            labels=["loop"],
        )
        for name, n in sorted(loop_restarts(node).items()):
            restarts.add_metric([name], n)
        yield restarts
        inflight = GaugeMetricFamily(
            "statestore_in_flight", "Operations being served, by kind", labels=["kind"]
        )
        act = self._app[ACTIVITY]
        for kind in sorted(IN_FLIGHT):
            inflight.add_metric([kind], act.count(kind))
        yield inflight
        yield from query_usage(node)


def query_usage(node: Node) -> Iterator[Metric]:
    """Bytes each query holds on this node (its counters, no scan) and, for the queries with
    a quota (``--quota-file``), that quota."""
    held = GaugeMetricFamily(
        "statestore_query_bytes",
        "Bytes of chunks and manifests (retained versions included) held here, by query",
        labels=["query"],
    )
    quota = GaugeMetricFamily(
        "statestore_query_quota_bytes",
        "The quota of each query holding data here (--quota-file), by query",
        labels=["query"],
    )
    for query, n in sorted(node.store.usage.snapshot().items()):
        held.add_metric([query], n)
        limit = node.quota_limit(query)
        if limit is not None:
            quota.add_metric([query], limit)
    yield held
    yield quota


def _gc_figures() -> Iterator[Metric]:
    """The process's garbage collector: objects frozen out of its passes, and its pauses
    per generation (node/gcpause.py; only in a daemon, which times them)."""
    yield _gauge(
        "statestore_gc_frozen_objects",
        "Objects moved out of the garbage collector's passes when the node started (--gc-freeze)",
        gc.get_freeze_count(),
    )
    if not PAUSES.installed:
        return
    count = CounterMetricFamily(
        "statestore_gc_pauses", "Garbage collector passes, by generation", labels=["generation"]
    )
    seconds = CounterMetricFamily(
        "statestore_gc_pause_seconds",
        "Seconds the garbage collector held every thread of the process, by generation",
        labels=["generation"],
    )
    longest = GaugeMetricFamily(
        "statestore_gc_pause_longest_seconds",
        "The longest garbage collector pause since the node started, by generation",
        labels=["generation"],
    )
    for g in range(len(PAUSES.count)):
        count.add_metric([str(g)], PAUSES.count[g])
        seconds.add_metric([str(g)], PAUSES.seconds[g])
        longest.add_metric([str(g)], PAUSES.longest[g])
    yield from (count, seconds, longest)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


class NodeMetrics:
    """One node's registry and its event metrics."""

    def __init__(self, app: web.Application) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.commit_seconds = Histogram(
            "statestore_commit_seconds",
            "Coordinated commits (POST .../commit), from request to W acknowledgements",
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.restore_seconds = Histogram(
            "statestore_restore_seconds",
            "Restores served: path=state (coordinator, whole stream) or relay (one hop)",
            ["path"],
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.chunk_seconds = Histogram(
            "statestore_chunk_seconds",
            "Chunk requests served: op=get, put (fsynced) or batch (POST /v1/chunks stream)",
            ["op"],
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.point_read_seconds = Histogram(
            "statestore_point_read_seconds",
            "Point reads served by the coordinator (GET .../key)",
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.bytes = Counter(
            "statestore_http_bytes",
            "HTTP body bytes received (in) and sent (out) by this node's API",
            ["direction"],
            registry=r,
        )
        self.refusals = Counter(
            "statestore_refusals",
            "Requests refused (4xx), by status and error code",
            ["status", "code"],
            registry=r,
        )
        self.failures = Counter(
            "statestore_failures",
            "Requests that failed on this node (5xx), by status and error code",
            ["status", "code"],
            registry=r,
        )
        # every label value known in advance is exported at 0 from the start, so that a
        # rate() or an alert on it has a series before the first event
        for status, code in KNOWN_ERRORS:
            (self.refusals if status < 500 else self.failures).labels(str(status), code)
        # the two children every request counts into, looked up once (labels() per request
        # was a measurable share of a point read's CPU)
        self.bytes_in, self.bytes_out = self.bytes.labels("in"), self.bytes.labels("out")
        for operation, label in ROUTES.values():
            if operation == "restore":
                self.restore_seconds.labels(label)
            elif operation == "chunk":
                self.chunk_seconds.labels(label)
        # process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds, ...
        # (read from /proc at each scrape; every node of one process reports that process)
        ProcessCollector(registry=r)
        self.collector = NodeCollector(app)
        r.register(self.collector)

    def observe(self, operation: str, label: str, seconds: float) -> None:
        if operation == "commit":
            self.commit_seconds.observe(seconds)
        elif operation == "restore":
            self.restore_seconds.labels(label).observe(seconds)
        elif operation == "chunk":
            self.chunk_seconds.labels(label).observe(seconds)
        elif operation == "point_read":
            self.point_read_seconds.observe(seconds)

    def answered(self, resp: web.StreamResponse) -> None:
        if resp.status >= 400:
            self.refused(resp.status, _error_code(resp))

    def refused(self, status: int, code: str) -> None:
        """Count a refusal (4xx) or a failure (5xx) with its error code."""
        (self.refusals if status < 500 else self.failures).labels(str(status), code).inc()


METRICS = web.AppKey("metrics", NodeMetrics)


def _errors(cls: type[StateStoreError]) -> list[type[StateStoreError]]:
    return [cls, *(c for sub in cls.__subclasses__() for c in _errors(sub))]


# (status, code) of every answer the API can refuse or fail with: the error tree's classes
# (core/errors.py; setup errors never reach the wire) and the errors middleware's own codes
KNOWN_ERRORS: tuple[tuple[int, str], ...] = tuple(
    sorted(
        {
            (c.status, c.code)
            for c in _errors(StateStoreError)
            if not issubclass(c, SetupError) and c.__module__ == StateStoreError.__module__
        }
        | {(404, "http_error"), (405, "http_error"), (500, "internal")}
    )
)


def _error_code(resp: web.StreamResponse) -> str:
    """The ``code`` of an error answer's JSON body (docs/api.md), or ``http_<status>``."""
    body = resp.body if isinstance(resp, web.Response) else None
    if isinstance(body, bytes):
        try:
            code = json.loads(body)["error"]["code"]
            if isinstance(code, str) and code.isascii() and len(code) <= 64:
                return code
        except (ValueError, KeyError, TypeError):
            pass
    return f"http_{resp.status}"


def _store_label(request: web.Request) -> str:
    mi = request.match_info
    if "query" in mi and "name" in mi:
        return f"{mi['query']}/{mi.get('operator', '')}/{mi.get('partition', '')}/{mi['name']}"
    return ""


@web.middleware
async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Times the operations of :data:`ROUTES`, counts body bytes, refusals and failures, and
    lists long operations as in flight. Outermost, so it sees the answers the errors
    middleware made of exceptions."""
    app = request.app
    metrics, node = app[METRICS], app[NODE]
    route = request.match_info.route.resource
    op = ROUTES.get((request.method, route.canonical)) if route is not None else None
    started = node.clock()
    token = None
    if op is not None and op[0] in IN_FLIGHT:
        kind = op[1] if op[0] == "restore" and op[1] == "relay" else op[0]
        peer = request.remote or ""
        token = app[ACTIVITY].begin(Operation(kind, _store_label(request), peer, started))
    try:
        resp = await handler(request)
    finally:
        if token is not None:
            app[ACTIVITY].end(token)
        metrics.bytes_in.inc(request.content.total_bytes)
    if op is not None:
        metrics.observe(op[0], op[1], max(0.0, node.clock() - started))
    # a streamed answer has been sent by now; a plain one is sent after we return
    sent = resp.content_length if isinstance(resp, web.Response) else resp.body_length
    metrics.bytes_out.inc(sent or 0)
    node.served.add(sent or 0, node.clock())
    if request.path != READY_PATH:  # its 503 is an answer (not ready), not a failed request
        metrics.answered(resp)
    return resp


async def metrics_handler(request: web.Request) -> web.Response:
    """``GET /metrics``: storage is counted in a worker thread, the rest read on the loop."""
    metrics, node = request.app[METRICS], request.app[NODE]
    metrics.collector.storage = await asyncio.to_thread(read_storage, node)
    body = generate_latest(metrics.registry)
    grant = principal(request).grant
    if grant is not None:  # a token sees the per-query series of its own queries only
        body = b"\n".join(
            line
            for line in body.split(b"\n")
            if (m := _QUERY_SERIES.match(line)) is None or grant.covers(m.group(1).decode())
        )
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


# a series labelled by query (query_usage): names are letters, digits and ``._-``
_QUERY_SERIES = re.compile(rb'statestore_query(?:_quota)?_bytes\{query="([^"]*)"\}')


def register(app: web.Application) -> None:
    """Give ``app`` its registry, the ``/metrics`` route and the middleware (outermost)."""
    app[METRICS] = NodeMetrics(app)
    app.middlewares.insert(0, metrics_middleware)
    app.router.add_get("/metrics", metrics_handler)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)
