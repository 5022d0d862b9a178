"""A faulty network in front of real ring nodes: one HTTP proxy per node.

Each proxy forwards requests to its node and rewrites ``GET /v1/ring`` so that clients learn
the proxies' addresses instead of the nodes'. Faults are queued per kind of request in a plan
shared by all proxies and consumed one per matching request, whichever proxy it reaches:
``commit`` (a coordinator's ``POST .../commit``, or on the provider's direct path any
``PUT`` of a chunk or manifest), ``state`` (a coordinator's ``GET .../state``, or on the direct
path a chunk read), ``head``:

- ``stall``: send the headers and half the body, then stop sending (the connection stays open)
- ``cut``: send the headers and half the body, then close the connection
- ``hang``: accept the request and never answer
- ``trickle``: send a status line, then a header line every half second, never ending the
  headers (each socket read gets a byte in time: only a bound on the whole wait ends it)
- ``bloat``: send the headers with a Content-Length 10 MiB past the real body, the body and
  256 KiB more, then stop sending (a reader must refuse past the size it expects, unread)
- ``503``: answer ``503 unavailable`` without forwarding

``down_until`` (a ``time.monotonic()`` value) makes every proxy answer 503 to everything
until then: a ring outage as a client sees it.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FaultPlan", "FaultProxy", "start_proxies"]


@dataclass
class FaultPlan:
    faults: dict[str, list[str]] = field(default_factory=dict)
    down_until: float = 0.0
    seen: dict[str, int] = field(default_factory=dict)
    agents: dict[str, set[str]] = field(default_factory=dict)  # kind -> User-Agents seen
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    mapping: dict[str, str] = field(default_factory=dict)  # node address -> proxy address

    def take(self, kind: str, agent: str = "") -> str | None:
        with self.lock:
            self.seen[kind] = self.seen.get(kind, 0) + 1
            self.agents.setdefault(kind, set()).add(agent)
            queue = self.faults.get(kind) or []
            return queue.pop(0) if queue else None


def _kind(method: str, path: str) -> str:
    if (method == "POST" and "/commit" in path) or method == "PUT":
        return "commit"
    if "/state" in path or (method == "GET" and path.startswith("/v1/chunks/")):
        return "state"
    if path.split("?")[0].endswith("/head"):
        return "head"
    return "other"


class FaultProxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, target: str, plan: FaultPlan) -> None:
        self.target = target
        self.plan = plan
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def address(self) -> str:
        host, port = self.server_address[:2]
        return f"{host!s}:{port}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FaultProxy

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._forward("GET")

    def do_POST(self) -> None:
        self._forward("POST")

    def do_PUT(self) -> None:
        self._forward("PUT")

    def _reply(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
        self.send_response(status)
        for k, v in headers:
            if k.lower() not in ("content-length", "transfer-encoding", "connection", "date"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _forward(self, method: str) -> None:
        plan = self.server.plan
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        kind = _kind(method, self.path)
        if time.monotonic() < plan.down_until:
            self._reply(503, b'{"error":{"code":"unavailable","message":"outage"}}', [])
            return
        fault = plan.take(kind, self.headers.get("User-Agent", ""))
        if fault == "hang":
            plan.stop.wait(120)
            self.close_connection = True
            return
        if fault == "trickle":
            self.wfile.write(b"HTTP/1.1 200 OK\r\n")
            while not plan.stop.wait(0.5):
                try:
                    self.wfile.write(b"X-Trickle: 1\r\n")
                    self.wfile.flush()
                except OSError:
                    break  # the reader gave up
            self.close_connection = True
            return
        if fault == "503":
            self._reply(503, b'{"error":{"code":"unavailable","message":"injected"}}', [])
            return
        conn = http.client.HTTPConnection(self.server.target, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            conn.request(method, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            out_headers = resp.getheaders()
            status = resp.status
        finally:
            conn.close()
        if self.path.startswith("/v1/ring") and status == 200:
            view = json.loads(data)
            for m in view.get("members", []):
                m["address"] = plan.mapping.get(m["address"], m["address"])
            data = json.dumps(view).encode()
        if fault == "bloat":
            self.send_response(status)
            self.send_header("Content-Length", str(len(data) + (10 << 20)))
            self.end_headers()
            try:
                self.wfile.write(data + bytes(256 << 10))
                self.wfile.flush()
            except OSError:
                pass  # the reader refused it
            plan.stop.wait(120)
            self.close_connection = True
            return
        if fault in ("stall", "cut") and len(data) > 1:
            self.send_response(status)
            for k, v in out_headers:
                if k.lower() not in ("content-length", "transfer-encoding", "connection", "date"):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            if fault == "stall":
                plan.stop.wait(120)
            self.close_connection = True
            return
        self._reply(status, data, out_headers)


def start_proxies(targets: list[str]) -> tuple[list[FaultProxy], FaultPlan]:
    """One proxy per node address; serve until ``shutdown()``."""
    plan = FaultPlan()
    proxies = [FaultProxy(t, plan) for t in targets]
    for t, p in zip(targets, proxies, strict=True):
        plan.mapping[t] = p.address
        threading.Thread(target=p.serve_forever, daemon=True).start()
    return proxies, plan
