"""The dashboard in a real browser: headless Chromium opens ``/dashboard`` on a node of a real
3-node ring with one node killed, takes a screenshot, and the members it drew (the SVG circles'
``data-id`` and ``data-status``) must be those ``statestore ring --json`` shows.

Needs Debian's ``chromium`` (``apt-get install -y chromium``); skipped with that reason when no
Chromium binary is on the PATH.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from client import RingClient, StoreId
from tests.ringkit import local_ring

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome", "headless_shell")
BROWSER = next((b for b in map(shutil.which, BROWSERS) if b), None)
pytestmark = pytest.mark.skipif(
    BROWSER is None,
    reason="no Chromium binary on the PATH: install Debian's package with "
    "`apt-get update && apt-get install -y chromium` to run the dashboard test",
)


class Drawn(HTMLParser):
    """The members the page drew, the store rows, and whether its first refresh finished."""

    def __init__(self) -> None:
        super().__init__()
        self.members: dict[str, str] = {}
        self.ready = False
        self.cells: list[str] = []
        self._in_td = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "circle" and a.get("data-id"):
            self.members[str(a["data-id"])] = str(a.get("data-status"))
        if tag == "body" and a.get("data-ready") == "1":
            self.ready = True
        self._in_td = tag == "td"

    def handle_data(self, data: str) -> None:
        if self._in_td:
            self.cells.append(data.strip())

    def handle_endtag(self, tag: str) -> None:
        self._in_td = False


def browse(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    assert BROWSER is not None
    cmd = [
        BROWSER,
        "--headless",
        "--no-sandbox",  # tests run as root in containers
        "--disable-gpu",
        "--hide-scrollbars",
        "--window-size=1280,900",
        "--virtual-time-budget=10000",
        *args,
        url,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def drawn(url: str) -> Drawn:
    """The page's DOM once its first refresh has drawn everything (a few tries)."""
    page = Drawn()
    for _ in range(5):
        out = browse("--dump-dom", url=url)
        page = Drawn()
        page.feed(out.stdout)
        if page.ready:
            return page
        time.sleep(1)
    raise AssertionError(f"the dashboard never finished a refresh: {out.stdout[-2000:]}")


def ring_json(address: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "statestore", "ring", "--seeds", address, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    view = json.loads(out.stdout)
    assert isinstance(view, dict)
    return view


def test_dashboard_draws_the_ring_the_cli_shows(tmp_path: Path) -> None:
    with local_ring(tmp_path / "ring", 3) as ring:
        sid = StoreId("dash", 0, 1, "default")
        with RingClient(ring.seeds) as client:
            client.commit(sid, 1, {b"k": b"v"}, [], {}, epoch=1)
        dead = ring.procs[2].id
        ring.kill(2)
        ring.wait_ring(2)
        address = ring.seeds[0]
        deadline = time.monotonic() + 30
        while {m["id"]: m["status"] for m in ring.ring(address)["members"]}[dead] != "down":
            assert time.monotonic() < deadline, "the killed node was never declared down"
            time.sleep(0.3)

        url = f"http://{address}/dashboard"
        page = drawn(url)
        view = ring_json(address)
        members = view["members"]
        assert isinstance(members, list)
        assert page.members == {m["id"]: m["status"] for m in members}
        assert page.members[dead] == "down"
        assert sorted(page.members.values()) == ["down", "up", "up"]
        assert sid.path in page.cells  # the store table, merged over the live members

        shot = tmp_path / "dashboard.png"
        out = browse(f"--screenshot={shot}", url=url)
        assert shot.exists(), out.stderr[-2000:]
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert shot.stat().st_size > 10_000  # a drawn page, not a blank one
