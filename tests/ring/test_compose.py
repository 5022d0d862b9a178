"""docker/docker-compose.yml started for real, with podman and podman-compose.

Docker's engine does not run on these machines; Debian's podman does, with the ``runc``
runtime and ``default_ulimits = []`` (raising rlimits is not permitted), both set in a
containers.conf of our own (``CONTAINERS_CONF``). No image registry is reachable, so the base
image is made from Debian packages (``debootstrap`` bookworm with python3 and its venv
module, then ``podman import``; cached as a tarball under ~/.cache/statestore/compose and as a
podman image, ~1 min the first time), and the image is built from docker/Dockerfile with
``BASE`` set to it and ``WHEELS`` to wheels built here (``pip wheel '.[node]'``).

The test brings up the compose ring (the file as it is: secret-init, three nodes published on
the network's gateway address), checks each node's health check, commits and restores
through the SDK from the host, kills a node's container, checks every store stays readable
and writable while the ring sees the node down, restarts it and waits until repair has given
it everything (``statestore inspect`` of every store exits 0), then tears everything down.

It installs what it lacks the way ``./run`` installs chromium for the dashboard test (as root,
with apt-get, bounded by timeouts; podman-compose from PyPI into a venv under the cache), and
is skipped, with the reason, when it cannot: not root, no apt-get, podman failing, no Python
3.11 to build wheels for bookworm's, the network's subnet taken.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from client import RingClient, StoreId

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "docker-compose.yml"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "statestore" / "compose"
PROJECT = "statestore-compose-test"
GATEWAY = "10.174.74.1"  # the compose network's gateway: RING_HOST's default
ADDRESSES = {"node1": f"{GATEWAY}:7400", "node2": f"{GATEWAY}:7401", "node3": f"{GATEWAY}:7402"}
APT_PACKAGES = ("podman", "runc", "debootstrap")
SUITE = "bookworm"  # its python3 is 3.11, as the wheels built here
BASE_PACKAGES = ("python3", "python3-venv")
BASE_RECIPE = f"debootstrap --variant=minbase {SUITE} {' '.join(BASE_PACKAGES)} v1"
BASE_KEY = hashlib.sha256(BASE_RECIPE.encode()).hexdigest()[:12]
BASE_IMAGE = f"localhost/statestore-base:{SUITE}-{BASE_KEY}"
BASE_TAR = CACHE / f"base-{SUITE}-{BASE_KEY}.tar"
LABEL = "statestore.compose-test.source"  # the hash of the sources an image was built from
JUNK = ("__pycache__", "*.pyc")
CONTAINERS_CONF = """\
# tests/ring/test_compose.py: podman on these machines
[containers]
default_ulimits = []

[engine]
runtime = "runc"
"""


# -- tools ----------------------------------------------------------------------------------
def run(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> str:
    """Run ``cmd``; its output, or a failure naming the command and what it printed."""
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{' '.join(cmd)}: no end after {timeout:.0f} s") from exc
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} exited {done.returncode}: {(done.stdout + done.stderr)[-3000:]}"
        )
    return done.stdout


def apt_install(missing: list[str]) -> None:
    """Install Debian packages once, as ./run does for chromium; skip when that cannot be."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip(
            f"needs {', '.join(missing)}: not root or no apt-get here "
            f"(`apt-get install -y {' '.join(APT_PACKAGES)}` to run it)"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        run(["apt-get", "update", "-qq"], 300, env)
        run(["apt-get", "install", "-y", "-qq", *APT_PACKAGES], 900, env)
    except RuntimeError as exc:
        pytest.skip(f"could not install {', '.join(missing)} with apt-get: {exc}")


def podman_compose() -> str:
    """podman-compose (PyPI): on PATH, next to this Python, or installed into a venv of the
    cache on first use."""
    for found in (shutil.which("podman-compose"), Path(sys.executable).parent / "podman-compose"):
        if found and Path(found).exists():
            return str(found)
    venv = CACHE / "podman-compose-venv"
    exe = venv / "bin" / "podman-compose"
    if not exe.exists():
        try:
            run([sys.executable, "-m", "venv", str(venv)], 120)
            run([str(venv / "bin" / "pip"), "install", "-q", "podman-compose>=1.1,<2"], 300)
        except RuntimeError as exc:
            shutil.rmtree(venv, ignore_errors=True)
            pytest.skip(f"could not install podman-compose from PyPI: {exc}")
    return str(exe)


def mirror() -> str:
    """The Debian mirror apt uses here (deb822 or one-line sources), else Debian's own."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for src in sources:
        if src.suffix not in (".list", ".sources", "") or not src.is_file():
            continue
        for line in src.read_text(errors="replace").splitlines():
            words = line.split()
            if words[:1] == ["URIs:"] or words[:1] == ["deb"]:
                for word in words[1:]:
                    if word.startswith("http") and word.rstrip("/").endswith("/debian"):
                        return word
    return "http://deb.debian.org/debian"


def source_key(base: str) -> str:
    """A hash of what goes into the image: the base and every file the build context takes."""
    digest = hashlib.sha256(base.encode())
    files = [ROOT / "pyproject.toml", ROOT / "README.md"]
    files += [ROOT / "docker" / "Dockerfile", ROOT / "docker" / "healthcheck.py"]
    for pkg in ("statestore", "client"):
        found = (ROOT / pkg).rglob("*")
        files += sorted(f for f in found if f.is_file() and "__pycache__" not in f.parts)
    for f in files:
        digest.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


class Podman:
    """podman and podman-compose with this machine's settings (CONTAINERS_CONF)."""

    def __init__(self, compose: str) -> None:
        CACHE.mkdir(parents=True, exist_ok=True)
        conf = CACHE / "containers.conf"
        conf.write_text(CONTAINERS_CONF)
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}
        self.env.pop("RING_HOST", None)  # the compose file's default address
        self.compose_exe = compose

    def __call__(self, *args: str, timeout: float = 120) -> str:
        return run(["podman", *args], timeout, self.env)

    def compose(self, *args: str, timeout: float = 300) -> str:
        cmd = [self.compose_exe, "-p", PROJECT, "-f", str(COMPOSE), *args]
        return run(cmd, timeout, self.env)

    def container(self, service: str) -> str:
        return f"{PROJECT}_{service}_1"

    def base_image(self) -> str:
        """The debootstrap base, made once: from podman's store, else the cached tarball,
        else debootstrap (about a minute)."""
        try:
            self("image", "exists", BASE_IMAGE)
            return BASE_IMAGE
        except RuntimeError:
            pass
        if not BASE_TAR.exists():
            rootfs = CACHE / f"rootfs-{BASE_KEY}"
            shutil.rmtree(rootfs, ignore_errors=True)
            try:
                run(
                    [
                        "debootstrap",
                        "--variant=minbase",
                        f"--include={','.join(BASE_PACKAGES)}",
                        SUITE,
                        str(rootfs),
                        mirror(),
                    ],
                    900,
                )
                for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
                    for path in (rootfs / junk).glob("*"):
                        if path.is_file():
                            path.unlink()
                partial = BASE_TAR.with_suffix(".partial")
                run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], 300)
                partial.rename(BASE_TAR)
            finally:
                shutil.rmtree(rootfs, ignore_errors=True)
        self("import", "--change", 'CMD ["/bin/bash"]', str(BASE_TAR), BASE_IMAGE, timeout=300)
        return BASE_IMAGE

    def build(self, base: str) -> None:
        """docker/Dockerfile with BASE=the debootstrap image and WHEELS=wheels built here,
        tagged as the compose file's image, unless that image was built from these very
        sources (a label holds their hash: ./run test builds it before the suite). The
        context holds what the Dockerfile's .dockerignore lets through."""
        image = yaml.safe_load(COMPOSE.read_text())["services"]["node1"]["image"]
        key = source_key(base)
        try:
            label = self(
                "image", "inspect", "--format", f'{{{{ index .Labels "{LABEL}" }}}}', image
            )
            if label.strip() == key:
                return
        except RuntimeError:
            pass  # no such image yet
        with tempfile.TemporaryDirectory(prefix="statestore-image-") as work:
            ctx = Path(work)
            (ctx / "docker").mkdir()
            for name in ("pyproject.toml", "README.md"):
                shutil.copy(ROOT / name, ctx / name)
            for pkg in ("statestore", "client"):
                shutil.copytree(ROOT / pkg, ctx / pkg, ignore=shutil.ignore_patterns(*JUNK))
            for name in ("Dockerfile", "healthcheck.py"):
                shutil.copy(ROOT / "docker" / name, ctx / "docker" / name)
            wheels = ctx / "docker" / "wheels"
            try:
                pip = [sys.executable, "-m", "pip", "wheel", "-q"]
                run([*pip, f"{ctx}[node]", "-w", str(wheels)], 600)
            except RuntimeError as exc:
                pytest.skip(f"could not build the wheels for the image: {exc}")
            self(
                "build",
                "--format",
                "docker",  # keeps the image's HEALTHCHECK
                "--layers=false",  # one image, no intermediate ones left behind
                "-f",
                str(ctx / "docker" / "Dockerfile"),
                "--build-arg",
                f"BASE={base}",
                "--build-arg",
                "WHEELS=docker/wheels",
                "--label",
                f"{LABEL}={key}",
                "-t",
                image,
                str(ctx),
                timeout=900,
            )
        # the image this one replaced, untagged now: no pile of them on a machine that reruns
        self("image", "prune", "-f", "--filter", f"label={LABEL}")

    def leftovers(self) -> None:
        """Everything of the test's compose project: containers, volumes, network."""
        label = f"label=io.podman.compose.project={PROJECT}"
        for cid in self("ps", "-aq", "--filter", label).split():
            self("rm", "-f", "-v", "-t", "0", cid)
        for vol in self("volume", "ls", "-q", "--filter", label).split():
            self("volume", "rm", "-f", vol)
        for net in self("network", "ls", "-q", "--filter", label).split():
            self("network", "rm", "-f", net)


def prepare() -> Podman:
    """podman working, the base image made, the image built: everything but the ring.
    Skips (pytest.skip) with the reason when this machine cannot."""
    if sys.version_info[:2] != (3, 11):
        pytest.skip(f"the image's Python is bookworm's 3.11: no wheels built on {sys.version}")
    missing = [t for t in APT_PACKAGES if not (shutil.which(t) or Path("/usr/sbin", t).exists())]
    if missing:
        apt_install(missing)
    pm = Podman(podman_compose())
    try:
        pm("info", timeout=60)
    except RuntimeError as exc:
        pytest.skip(f"podman does not work here: {exc}")
    try:
        base = pm.base_image()
    except RuntimeError as exc:
        pytest.skip(f"could not make the debootstrap base image: {exc}")
    pm.build(base)
    return pm


def gateway_taken() -> bool:
    """Whether an interface of this machine holds the compose network's gateway address."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.bind((GATEWAY, 0))
            return True
        except OSError:
            return False


@pytest.fixture(scope="module")
def ring() -> Iterator[Podman]:
    started = time.monotonic()
    podman = prepare()
    print(f"tools, base image and image: {time.monotonic() - started:.0f} s", file=sys.stderr)
    podman.leftovers()  # of a run that was killed
    if gateway_taken():
        pytest.skip(f"{GATEWAY}, the compose network's gateway, is taken here: is a ring up?")
    try:
        podman.compose("up", "-d", timeout=300)
        yield podman
    finally:
        try:
            podman.compose("down", "-v", "-t", "10", timeout=180)
        finally:
            podman.leftovers()


# -- the ring, from the host ----------------------------------------------------------------
def get_json(address: str, path: str) -> Any:
    with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as resp:
        return json.loads(resp.read())


def wait_for(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
            last = None
        except Exception as exc:  # a node still starting, a refused connection
            last = exc
        time.sleep(1)
    pytest.fail(
        f"{what}: not within {timeout:.0f} s" + (f" (last error: {last!r})" if last else "")
    )


def statuses(address: str) -> dict[str, str]:
    return {m["address"]: m["status"] for m in get_json(address, "/v1/ring")["members"]}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "statestore", *args], capture_output=True, text=True, timeout=120
    )


STORES = [StoreId(query="compose", operator=0, partition=p, name="default") for p in range(4)]


def rows(sid: StoreId, version: int) -> dict[bytes, bytes]:
    """Version ``version``'s puts: a new key and a new value for key 0."""
    value = os.urandom(64)
    return {f"{sid.partition}-{version}".encode(): value, b"0": value}


def test_compose_ring_serves_the_host_and_heals(ring: Podman) -> None:
    seeds = list(ADDRESSES.values())
    every_up = dict.fromkeys(seeds, "up")
    wait_for("three members up, seen from the host", lambda: statuses(seeds[0]) == every_up, 120)

    # Each node's health check (its own port, /v1/health/ready) passes once it is a member:
    # podman runs health checks from systemd timers, absent here, so they are run by hand
    def healthy(service: str) -> bool:
        ring("healthcheck", "run", ring.container(service))  # raises while unhealthy
        return True

    for service in ADDRESSES:
        wait_for(f"{service}'s health check", lambda s=service: healthy(s), 60)

    # Node identity is on: the nodes share secret-init's secret, and an unsigned gossip
    # from the host is refused
    try:
        urllib.request.urlopen(
            urllib.request.Request(f"http://{seeds[0]}/v1/gossip", data=b"{}", method="POST"),
            timeout=5,
        )
        pytest.fail("an unsigned gossip was accepted: the cluster secret is not on")
    except urllib.error.HTTPError as exc:
        assert exc.code == 401

    expected: dict[tuple[StoreId, int], dict[bytes, bytes]] = {}
    state: dict[StoreId, dict[bytes, bytes]] = {sid: {} for sid in STORES}

    def commit(client: RingClient, version: int) -> None:
        for sid in STORES:
            puts = rows(sid, version)
            client.commit(sid, version, puts, epoch=1)
            state[sid].update(puts)
            expected[(sid, version)] = dict(state[sid])

    def check_all(client: RingClient) -> None:
        for (sid, version), want in expected.items():
            assert dict(client.restore(sid, version=version)) == want, (sid, version)

    with RingClient(seeds) as client:
        commit(client, 1)
        commit(client, 2)
        check_all(client)
        assert {m.address for m in client.ring().members} == set(seeds)

    # Kill node3's container: the others declare it down, every store stays readable and
    # writable (W=2 of R=3)
    ring("kill", ring.container("node3"))
    down = {**every_up, ADDRESSES["node3"]: "down"}
    wait_for("node3 seen down", lambda: statuses(seeds[0]) == down, 60)
    with RingClient(seeds[:2]) as client:
        check_all(client)
        commit(client, 3)
        check_all(client)

    # Back: it is up again, and repair gives it what it missed (inspect exits 0 once every
    # replica holds every copy it should)
    ring("start", ring.container("node3"))
    wait_for("node3 up again", lambda: statuses(seeds[0]) == every_up, 90)

    def repaired(sid: StoreId) -> bool:
        return cli("inspect", "--seeds", seeds[0], "--store", sid.path).returncode == 0

    for sid in STORES:
        wait_for(f"repair of {sid.path}", lambda s=sid: repaired(s), 120)
    ring("healthcheck", "run", ring.container("node3"))
    with RingClient([ADDRESSES["node3"]]) as client:
        check_all(client)


if __name__ == "__main__":
    # ./run test: `python tests/ring/test_compose.py prepare` installs the tools, makes the base
    # image and builds the image before the suite starts, on cores no test uses yet
    if sys.argv[1:] != ["prepare"]:
        sys.exit("usage: python tests/ring/test_compose.py prepare")
    began = time.monotonic()
    try:
        prepare()
    except pytest.skip.Exception as exc:
        print(f"the compose test will be skipped: {exc.msg}", file=sys.stderr)
    except RuntimeError as exc:
        print(f"the compose test's image could not be built: {exc}", file=sys.stderr)
    else:
        print(f"compose test image ready ({time.monotonic() - began:.0f} s)", file=sys.stderr)
