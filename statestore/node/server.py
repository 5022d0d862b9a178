"""Run one node daemon: bind the HTTP API, start the node, stop gracefully on SIGTERM/SIGINT.

Graceful means: stop accepting connections, let in-flight requests (a chunk being fsynced, a
manifest being written) finish, then cancel and await the background loops and close storage.
With ``--drain-on-stop`` the first SIGTERM (or SIGINT) first decommissions the node
(node/moves/leave.py ``drain``) while it keeps serving; a second one abandons the drain.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import sys
from dataclasses import replace
from typing import Any

from aiohttp import web

from statestore.core.errors import DataDirInUse, UnknownDiskFormat
from statestore.net.tls import server_context
from statestore.node.api import build_app
from statestore.node.compaction import compaction_loop
from statestore.node.daemon import Loop, Node, NodeConfig
from statestore.node.gcpause import PAUSES, freeze
from statestore.node.hints import hint_loop
from statestore.node.moves import (
    auto_rebalance_loop,
    check_join,
    check_replace,
    check_returning,
    drain,
    join_loop,
    resume_loop,
)
from statestore.node.removal import check_removed, removal_loop
from statestore.node.repair import repair_loop
from statestore.node.scrub import scrub_loop
from statestore.node.space import space_loop
from statestore.node.tombstones import tombstone_loop

__all__ = ["run_node", "serve", "start_node", "stop_node", "tune_interpreter"]

log = logging.getLogger(__name__)
LOOPS: tuple[tuple[str, Loop], ...] = (
    ("repair", repair_loop),
    ("compaction", compaction_loop),
    ("join", join_loop),
    ("hints", hint_loop),
    ("auto-rebalance", auto_rebalance_loop),
    ("resume-tokens", resume_loop),
    ("scrub", scrub_loop),
    ("space", space_loop),
)


async def start_node(config: NodeConfig) -> tuple[Node, web.AppRunner]:
    """Bind the API (HTTPS with ``config.tls_cert``) and start the node; stop with
    :func:`stop_node`. Raises ValueError for a secret, tokens or TLS file it cannot use, or
    a ``--join`` or ``--replace`` the ring refuses."""
    tls = server_context(config.tls_cert, config.tls_key) if config.tls_cert else None
    adopt = None
    await check_removed(config)  # raises ValueError for a node the ring removed for good
    if config.join or config.replace:  # raises ValueError while a member moves tokens
        await check_join(config)
    if config.replace:  # raises ValueError when the node may not be replaced
        incarnation = await check_replace(config)
        adopt = None if incarnation is None else (config.replace, incarnation)
    elif adopt := await check_returning(config):  # an empty data dir at a member's address
        await check_join(replace(config, replace=adopt[0]))
    if config.thin_snapshots and config.chunk_format < 3:
        log.warning(
            "--thin-snapshots %d with --chunk-format %d: a rewinding writer's whole commit "
            "that only nodes which missed a thinning line took can be lost to that line (its "
            "chunks cannot be named whole before format 3); keep --thin-snapshots 0 until "
            "every member and client reads format 3 (docs/operations.md, Thinning)",
            config.thin_snapshots,
            config.chunk_format,
        )
    node = Node(config, adopt=adopt)
    # keepalive_timeout doubles as the header read timeout: aiohttp arms it when a connection
    # opens and closes a connection still waiting for a whole request line and headers when
    # it fires (300 half-open connections would otherwise hold 300 file descriptors).
    runner = web.AppRunner(
        build_app(node),
        access_log=None,
        shutdown_timeout=30.0,
        keepalive_timeout=config.header_timeout,
    )
    await runner.setup()
    site = _Site(
        runner,
        config.host,
        config.port,
        reuse_address=True,
        ssl_context=tls,
        handshake_timeout=config.header_timeout,
    )
    try:
        await site.start()
    except (OSError, ValueError):  # the address is taken, or a setting create_server refuses
        await runner.cleanup()
        node.release()
        raise
    # removals: statestore removenode's marks, kept in the data dir (node/removal.py)
    loops = (*LOOPS, ("tombstones", tombstone_loop), ("removals", removal_loop))
    await node.start(int(runner.addresses[0][1]), loops)
    return node, runner


class _Site(web.TCPSite):
    """aiohttp's TCP site with the TLS handshake held to ``handshake_timeout`` (the node's
    header timeout), where asyncio's default gives a connection that never finishes its
    handshake 60 s; a plain-TCP site is the same as aiohttp's."""

    __slots__ = ("_handshake_timeout",)

    def __init__(self, *args: Any, handshake_timeout: float, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._handshake_timeout = handshake_timeout

    async def start(self) -> None:
        if self._ssl_context is None:
            return await super().start()
        await web.BaseSite.start(self)  # registered with the runner, as TCPSite does
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            server,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
            ssl_handshake_timeout=self._handshake_timeout,
        )
        sockets = self._server.sockets
        if hasattr(self, "_bound_port"):  # the port ``name`` shows (aiohttp 3.10 and later)
            self._bound_port = sockets[0].getsockname()[1] if sockets else self._port


async def stop_node(node: Node, runner: web.AppRunner) -> None:
    await runner.cleanup()  # stops accepting, waits for in-flight requests
    await node.stop()


async def serve(config: NodeConfig, stop: asyncio.Event, now: asyncio.Event | None = None) -> int:
    """Run a node until ``stop`` is set; with ``config.drain_on_stop`` it then drains
    (decommissions) before stopping, unless ``now`` is set meanwhile. Returns the exit code:
    0, or 1 when a drain was asked for and did not finish."""
    node, runner = await start_node(config)
    code = 0
    if config.gc_freeze:  # once started: what is alive now lives as long as the process
        log.info("node %s: %d objects frozen out of the collector's passes", node.id, freeze())
    # The first line on stdout is the contract for scripts and tests that start nodes on port 0.
    print(
        f"statestore node {node.id} listening on {node.address} "
        f"(dht udp {node.discovery.port if node.discovery else 'off'}"
        f"{', https' if config.tls_cert else ''})",
        flush=True,
    )
    try:
        await stop.wait()
        if config.drain_on_stop:
            print(f"statestore node {node.id} draining before it stops", flush=True)
            why = await drain(node, config.drain_timeout, now or asyncio.Event())
            if why is None:
                print(f"statestore node {node.id} drained: it left the ring", flush=True)
            else:
                log.error("node %s stops without a finished drain: %s", node.id, why)
                code = 1
    finally:
        log.info("node %s stopping", node.id)
        await stop_node(node, runner)
        print(f"statestore node {node.id} stopped", flush=True)
    return code


def _raise_open_file_limit() -> None:
    """Take the hard limit on open files as the soft one: each connection is a descriptor."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = 1 << 16
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.warning("cannot raise the open-file limit: %s", exc)


def tune_interpreter(config: NodeConfig) -> None:
    """Process-wide settings for a node daemon. The thread switch interval: a node's event
    loop gives up the interpreter at each system call (a socket read or write, an fsync);
    while a worker thread runs Python (a digest scan, a listing, a chunk's decoding) the loop
    gets it back only when that thread is made to yield, after the interval. Python's 5 ms
    default makes every system call of a request wait up to 5 ms during such work. And the
    garbage collector's pauses are timed for ``GET /metrics`` (node/gcpause.py; ``--gc-freeze``
    freezes once the node has started, in :func:`serve`)."""
    sys.setswitchinterval(config.switch_interval_ms / 1000)
    PAUSES.install()


def run_node(config: NodeConfig) -> int:
    _raise_open_file_limit()
    tune_interpreter(config)

    async def main() -> int:
        stop = asyncio.Event()
        now = asyncio.Event()  # a second signal: stop at once (abandon a drain)

        def on_signal() -> None:
            if stop.is_set():
                now.set()
            stop.set()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        return await serve(config, stop, now)

    try:
        return asyncio.run(main())
    # ValueError: a secret, tokens or TLS file; UnknownDiskFormat: a newer build's data dir
    except (DataDirInUse, UnknownDiskFormat, ValueError) as exc:
        print(f"statestore node: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.filename:
            # a file of the data dir; any other file a setting names says so itself (a
            # ValueError naming its flag), so only the data dir's are blamed on --data-dir
            data_dir, path = os.path.abspath(config.data_dir), os.path.abspath(exc.filename)
            ours = os.path.commonpath([data_dir, path]) in (data_dir, path)  # in it, or above
            hint = "give a --data-dir this user can write" if ours else "check that file"
            print(
                f"statestore node: cannot use {exc.filename}: {exc.strerror}; {hint}",
                file=sys.stderr,
            )
        else:
            print(
                f"statestore node: cannot listen on {config.host}:{config.port}: "
                f"{exc.strerror}; pick another --listen port",
                file=sys.stderr,
            )
        return 2
