"""A node's settings (``statestore node`` flags), checked when built.

Importing this module loads no server, storage or DHT code, so the CLI can parse node flags on
a client-only install.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from statestore.core.formats import CHUNK_FORMAT
from statestore.core.placement import DEFAULT_VNODES
from statestore.core.quorum import validate_rw

__all__ = ["NodeConfig"]


@dataclass
class NodeConfig:
    host: str = "127.0.0.1"
    port: int = 7400
    data_dir: str = "data/node"
    seeds: list[str] = field(default_factory=list)
    replicas: int = 3
    write_quorum: int = 2
    vnodes: int = DEFAULT_VNODES
    zone: str = ""
    advertise: str = ""  # HOST:PORT others use to reach us (default: the listen address)
    storage: str = ""  # "" = lmdb in data_dir; "memory://" for tests
    max_body: int = 64 * 1024 * 1024
    max_chunk: int = 256 * 1024 * 1024
    lookup_cache: int = 32 * 1024 * 1024  # node/lookup.py: point reads' and lookups' cache
    max_commit: int = 256 * 1024 * 1024
    # bytes that requests in flight may hold in all (node/budget.py); a commit holds 3x its body
    memory_budget: int = 1024 * 1024 * 1024
    gossip_interval: float = 0.5
    suspect_after: float = 2.0
    down_after: float = 5.0
    repair_interval: float = 2.0
    # compare token ranges by digest before listing items to a peer (node/digests.py); off
    # only to measure the listing it saves (bench/digests.py)
    repair_digests: bool = True
    # seconds a hint may stay undecidable (its base held by no owner, no verdict) before it
    # is dropped (core/hints.py)
    hint_ttl: float = 3600.0
    compact_interval: float = 2.0
    snapshot_every: int = 10
    # the newest chunk layout this node lets writers use (--chunk-format; gossiped)
    chunk_format: int = CHUNK_FORMAT
    # and a snapshot only once the deltas above the last one weigh this share of it (0, the
    # default: every snapshot_every deltas; core/retention.needs_snapshot)
    rebase_at: float = 0.0
    # keep, of the snapshots above the floor, the newest and those at multiples of this (the
    # rungs the floor climbs by; at most half the store's retention; 0: every snapshot;
    # core/retention.Thinning)
    thin_snapshots: int = 50
    retain_versions: int = 100
    dht: bool = True
    inject_delay: float = 0.0  # fault injection for tests: seconds added to every chunk read
    dht_port: int | None = None  # None: same number as the HTTP port (0 -> any)
    # security (docs/security.md)
    cluster_secret_file: str = ""  # same file on every node: internal requests are signed
    auth_file: str = ""  # client bearer tokens, scoped to queries and rights
    quota_file: str = ""  # per-query storage quotas (bytes held on this node), reloaded
    tls_cert: str = ""  # PEM certificate: serve HTTPS only (with tls_key)
    tls_key: str = ""  # its private key
    tls_ca: str = ""  # PEM CA the nodes we call are verified against ("" = the system's CAs)
    header_timeout: float = 15.0  # seconds a connection may take to send its request headers
    body_timeout: float = 60.0  # seconds a request body may stall between two pieces
    min_free_bytes: int = 64 * 1024 * 1024  # below this the node turns read-only
    # elastic ring (docs/operations.md, Join and decommission)
    join: bool = False  # enter as joining: stream what we will own, then switch to normal
    # MB/s a hand-over (join or leave) may move, per node: Cassandra's default stream
    # throughput (200 Mbit/s); at 50 clients' p99 grew past 1.5x on 2 cores (docs/benchmarks.md)
    stream_mbps: float = 25.0
    # scrub (node/scrub.py): MB/s of held data re-verified (0: off), seconds between passes
    scrub_mbps: float = 8.0
    scrub_interval: float = 3600.0
    # space given back (node/space.py): compact the storage file when its free pages reach
    # this share of it (0: never) and at least reclaim_min bytes
    reclaim_at: float = 0.25
    reclaim_min: int = 64 * 1024 * 1024
    drain_on_stop: bool = False  # SIGTERM decommissions the node before it exits
    drain_timeout: float = 600.0  # seconds such a drain may take before the node gives up
    replace: str = ""  # the id of a dead node whose tokens this (new) node takes over
    auto_rebalance: float = 0.0  # max/mean bytes held past which tokens move (0: off)
    rebalance_interval: float = 60.0  # seconds between two checks of --auto-rebalance
    # how long a thread may hold the interpreter while another waits for it (ms; Python's
    # default is 5): the event loop waits that long after each system call while a worker
    # thread scans or hashes (docs/operations.md, Thread switch interval)
    switch_interval_ms: float = 1.0
    # move what is alive once the node has started (modules, classes, the app) out of the
    # garbage collector's reach: a full collection then scans only what came after
    # (docs/operations.md, Garbage collector; ``--no-gc-freeze`` turns it off)
    gc_freeze: bool = True

    def __post_init__(self) -> None:
        validate_rw(self.replicas, self.write_quorum)
        if self.snapshot_every < 1 or self.retain_versions < 1:
            raise ValueError("snapshot_every and retain_versions must be at least 1")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("--tls-cert and --tls-key go together: give both, or neither")
        if self.tls_ca and not self.tls_cert:
            raise ValueError(
                "--tls-ca needs --tls-cert and --tls-key: a ring speaks TLS on every node or "
                "on none (the CA verifies the nodes this one calls)"
            )
        if self.memory_budget < self.max_body:
            raise ValueError(
                f"--memory-budget ({self.memory_budget}) is below --max-body ({self.max_body}): "
                "a body of the largest size would never fit; raise the budget"
            )
        if not 0 <= self.reclaim_at < 1 or self.reclaim_min < 0:
            raise ValueError("--reclaim-at must be in [0, 1) and --reclaim-min not negative")
        if not 0 <= self.rebase_at <= 1000:
            raise ValueError("--rebase-at must be a share in [0, 1000] of the snapshot's bytes")
        if not 0 <= self.thin_snapshots <= 1_000_000:
            raise ValueError("--thin-snapshots must be a number of versions in [0, 1000000]")
        if not self.scrub_mbps >= 0 or not self.scrub_interval >= 0:
            raise ValueError("--scrub-mbps and --scrub-interval must not be negative")
        if not self.stream_mbps > 0:
            raise ValueError("--stream-mbps must be a positive number of MB/s")
        if self.auto_rebalance and not self.auto_rebalance > 1.0:
            raise ValueError("--auto-rebalance is a max/mean load ratio above 1 (e.g. 1.25)")
        if not self.rebalance_interval > 0:
            raise ValueError("--rebalance-interval must be a positive number of seconds")
        if not 0.05 <= self.switch_interval_ms <= 100:
            raise ValueError("--switch-interval-ms must be between 0.05 and 100 ms")
        if not self.drain_timeout > 0:
            raise ValueError("--drain-timeout must be a positive number of seconds")
        if self.replace:
            if len(self.replace) > 64 or not all(
                c.isascii() and (c.isalnum() or c in "._-") for c in self.replace
            ):
                raise ValueError(
                    f"--replace {self.replace!r:.80} is no node id (letters, digits and ._-, "
                    "at most 64): give the id `statestore ring` shows for the dead node"
                )
            if not self.seeds:
                raise ValueError(
                    "--replace needs --seeds: the ring is asked whether the node is dead"
                )
        if self.auth_file and not self.cluster_secret_file:
            # Even the first node of a ring (no --seeds): without a secret any process that
            # announced itself in the DHT and answered gossip would become a member, and
            # clients would send it their tokens, chunks and manifests (docs/security.md).
            raise ValueError(
                "--auth-file needs --cluster-secret-file too, on every node, even the first: "
                "without it this node cannot tell a ring node from any process that announces "
                "itself, and clients would send their tokens to it; create one with `head -c "
                "32 /dev/urandom | base64 > cluster.secret` and give the same file to every "
                "node"
            )
