"""Operator commands against a peer answering malformed or trickled answers (hostile
review 68: tracebacks, and `statestore ring` waiting for ever on a seed sending a byte a
second). A small stdlib HTTP server stands in for a hostile, broken or foreign node at the
seed's address: cli/main.py promises one line on stderr, never a trace, and a bounded wait.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.ringkit import cli

Route = Callable[[BaseHTTPRequestHandler], None]


def _json(obj: object) -> Route:
    def send(h: BaseHTTPRequestHandler) -> None:
        data = json.dumps(obj).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    return send


def _trickle(h: BaseHTTPRequestHandler) -> None:
    # a body that never ends, one byte every second: under urllib's 3-5 s socket timeout
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.end_headers()
    try:
        h.wfile.write(b"{")
        for _ in range(600):
            h.wfile.write(b" ")
            h.wfile.flush()
            time.sleep(1.0)
    except OSError:
        pass


def serve(routes: dict[tuple[str, str], Route]) -> Iterator[str]:
    """The address of a server answering ``routes`` (method, path), 404 otherwise."""

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def _go(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            if n:
                self.rfile.read(n)
            route = routes.get((self.command, self.path.split("?")[0]))
            if route is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            route(self)

        do_GET = do_POST = _go

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def assert_one_line(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize("view", [{}, {"members": [1]}, {"members": None, "epoch": 1}])
def test_ring_on_a_malformed_view_says_so_in_one_line(view: object) -> None:
    for address in serve({("GET", "/v1/ring"): _json(view)}):
        assert_one_line(cli(["ring", "--seeds", address]))


def test_removenode_on_a_malformed_progress_answer_says_so_in_one_line() -> None:
    view = {
        "epoch": 3,
        "members": [
            {"id": "aaaa", "address": "127.0.0.1:1", "status": "down", "state": "normal"},
        ],
    }
    routes = {
        ("GET", "/v1/ring"): _json(view),
        ("POST", "/v1/handover/remove"): _json({"id": "x"}),
        ("GET", "/v1/handover/remove"): _json(["not", "an", "object"]),
    }
    for address in serve(routes):
        assert_one_line(cli(["removenode", "--seeds", address, "--node", "aaaa"]))


def test_backup_on_a_malformed_store_listing_says_so(tmp_path: Path) -> None:
    view = {
        "epoch": 1,
        "replicas": 1,
        "write_quorum": 1,
        "vnodes": 8,
        "members": [],
    }
    routes: dict[tuple[str, str], Route] = {("GET", "/v1/ring"): _json(view)}
    for address in serve(routes):
        view["members"] = [{"id": "n1", "address": address, "status": "up"}]
        routes[("GET", "/v1/ring")] = _json(view)
        routes[("GET", "/v1/stores")] = _json({"nope": 1})
        done = cli(["backup", "--seeds", address, "--query", "q1", "--out", str(tmp_path / "b")])
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        assert "answered /v1/stores with another shape" in done.stderr, done.stderr
        assert "retry when they answer" in done.stderr, done.stderr


def test_ring_does_not_hang_on_a_trickled_answer() -> None:
    # the promise: a seed that does not answer in time is a RequestTimeout (3 s for /v1/ring)
    for address in serve({("GET", "/v1/ring"): _trickle}):
        began = time.monotonic()
        try:
            done = cli(["ring", "--seeds", address], timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"`statestore ring` still waiting after {time.monotonic() - began:.0f}s")
        assert_one_line(done)
