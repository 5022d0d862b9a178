"""Rolling upgrade from the previous release to this build, real processes (docs/operations.md,
Versions and upgrades).

The previous release (tag ``v0.1.0``, or its commit for a clone without tags) is built from the
git history into its own venv, cached outside the project tree under
``~/.cache/statestore-upgrade/<commit>`` (``$STATESTORE_UPGRADE_CACHE`` moves it): about a
minute the first time, nothing after. Without the history the tests are skipped, saying why.

Which clients must keep working: both SDKs. Applications are upgraded on their own schedule,
not with the ring, so while the ring is mixed (and after) a client of the previous release
must keep committing and restoring, and a client of this release must work against nodes of
the previous one. Each test therefore runs a writer and a reader of this build's SDK (threads
here) and a writer and a reader of the previous build's SDK (processes in its venv), all
through one function, :func:`run_client`, that uses only what both SDKs have.
"""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from client import RingClient, StoreId
from statestore.cli.local import LocalRing, NodeProcess, http_json
from statestore.core.formats import DISK_FORMAT, VERSION
from tests.ringkit import FAST

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
PREVIOUS_TAG = "v0.1.0"
PREVIOUS_COMMIT = "8116705"  # the tag's commit: a clone may come without tags
PREVIOUS_VERSION = "0.1.0"
# retain every version the test commits: each acknowledged one is restored at the end
ARGS = [*FAST, "--no-dht", "--retain", "5000"]
PIP_INSTALL = ["-m", "pip", "install", "-q", "--disable-pip-version-check"]


# -- the previous release, built from git history ---------------------------------------------
def _git(*args: str) -> str | None:
    if shutil.which("git") is None:
        return None
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def previous_commit() -> str:
    """The previous release's commit id, or a skip naming what is missing."""
    if _git("rev-parse", "--git-dir") is None:
        pytest.skip(
            f"no git history at {ROOT}: the previous release ({PREVIOUS_TAG}) is built from it"
        )
    for ref in (PREVIOUS_TAG, PREVIOUS_COMMIT):
        sha = _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
        if sha:
            return sha
    pytest.skip(
        f"neither the tag {PREVIOUS_TAG} nor its commit {PREVIOUS_COMMIT} is in this clone's "
        "history (a shallow clone?): `git fetch --tags --unshallow` to run the upgrade test"
    )


def cache_root() -> Path:
    explicit = os.environ.get("STATESTORE_UPGRADE_CACHE")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "statestore-upgrade"


def previous_env() -> dict[str, str]:
    """The environment the previous build runs in: never this tree's packages (``python -m``
    would import them from the working directory, which is this tree)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "STATESTORE_TOKEN")}
    env["PYTHONSAFEPATH"] = "1"
    return env


def _build(sha: str, home: Path) -> None:
    """``git archive`` the commit into ``home/src`` and install it with its node extra into
    ``home/venv``; ``home/ready`` marks a finished build (with how long it took)."""
    started = time.monotonic()
    shutil.rmtree(home, ignore_errors=True)
    src = home / "src"
    src.mkdir(parents=True)
    archive = subprocess.Popen(
        ["git", "-C", str(ROOT), "archive", "--format=tar", sha], stdout=subprocess.PIPE
    )
    assert archive.stdout is not None
    with archive.stdout, tarfile.open(fileobj=archive.stdout, mode="r|") as tar:
        tar.extractall(src, filter="data")
    assert archive.wait() == 0, f"git archive {sha} failed"
    venv = home / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    done = subprocess.run(
        [str(venv / "bin" / "python"), *PIP_INSTALL, f"{src}[node]"],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=str(home),
    )
    if done.returncode != 0:
        pytest.fail(
            f"installing the previous release ({PREVIOUS_TAG}, {sha[:7]}) into {venv} failed: "
            f"{done.stderr[-3000:]}"
        )
    (home / "ready").write_text(f"{time.monotonic() - started:.1f} s\n")


@pytest.fixture(scope="module")
def previous() -> Path:
    """The previous release's interpreter (its venv's python), built once per commit."""
    sha = previous_commit()
    base = cache_root()
    base.mkdir(parents=True, exist_ok=True)
    home = base / sha
    with open(base / f"{sha}.lock", "w") as lock:  # one build at a time (parallel runs)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / "ready").exists():
            _build(sha, home)
    python = home / "venv" / "bin" / "python"
    where = subprocess.run(
        [str(python), "-c", "import statestore, client; print(statestore.__file__)"],
        env=previous_env(),
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert where.startswith(str(home)), f"the previous build imports {where}, not its own"
    return python


# -- clients: one function, run by both SDKs -----------------------------------------------------
def state_digest(state: Mapping[bytes, bytes]) -> str:
    """Every key and value, in key order and length-prefixed: equal digests, equal bytes."""
    import hashlib

    h = hashlib.sha256()
    for k in sorted(state):
        v = state[k]
        h.update(len(k).to_bytes(4, "big") + k + len(v).to_bytes(4, "big") + v)
    return h.hexdigest()


def run_client(
    seeds: list[str], role: str, stores: list[str], out: str, stop: str, seed: int
) -> None:
    """A client of the upgrade until the file ``stop`` exists: a ``writer`` commits versions
    1, 2, ... of ``stores[0]`` (puts and deletes, positions ``{"v": N}``), a ``reader``
    restores the latest and a random earlier version of each of ``stores`` in turn. Every
    acknowledged commit (with the digest of the state it makes), every read (with the digest
    of what came back) and every error that reached this caller is a JSON line in ``out``.
    A restore that finds a version missing is tried again for up to 10 s (a ``retry`` line):
    a 0.1.0 node answers a chain only down to its first missing version, so while the ring
    still has 0.1.0 nodes one that missed a write and a restarted one not yet repaired can
    leave a held version out of every answer (CI saw it once); repair fills the gap.
    Runs here (this build's SDK) and in the previous build's venv (its SDK)."""
    import json
    import os
    import random
    import time

    import client
    from client import RingClient, StoreId

    rng = random.Random(seed)
    with open(out, "a") as log:

        def note(**event: object) -> None:
            log.write(json.dumps(event) + "\n")
            log.flush()

        note(e="start", role=role, sdk=client.__file__)
        try:
            ring = RingClient(seeds)
        except Exception as exc:
            note(e="fail", op="connect", error=repr(exc))
            return
        with ring:
            sids = [StoreId.parse(s) for s in stores]
            state: dict[bytes, bytes] = {}
            version = 0
            while not os.path.exists(stop):
                time.sleep(0.2 if role == "writer" else 0.05)
                if role == "writer":
                    sid = sids[0]
                    version += 1
                    puts = {
                        f"key-{rng.randrange(400):04d}".encode(): rng.randbytes(
                            rng.randrange(1, 120)
                        )
                        for _ in range(rng.randrange(5, 40))
                    }
                    dels = [
                        k for k in rng.sample(sorted(state), min(len(state), 5)) if k not in puts
                    ]
                    try:
                        ring.commit(sid, version, puts, dels, {"v": version}, epoch=1)
                    except Exception as exc:
                        note(e="fail", op=f"commit {sid.path} v{version}", error=repr(exc))
                        return  # a commit that failed may or may not have landed: stop here
                    state.update(puts)
                    for k in dels:
                        del state[k]
                    note(e="ack", store=sid.path, v=version, d=state_digest(state))
                    continue
                sid = rng.choice(sids)
                try:
                    head = ring.latest(sid).version
                    for v in (head, rng.randint(1, head)):
                        for attempt in range(1, 21):
                            try:
                                got = ring.restore(sid, v)
                                break
                            except Exception as exc:
                                # 0.1.0 nodes answer a chain only down to their first gap:
                                # a version they all hold past a gap can be missing from
                                # every answer until repair fills it (docs/operations.md)
                                if type(exc).__name__ != "VersionNotFound" or attempt == 20:
                                    raise
                                note(e="retry", store=sid.path, v=v, error=repr(exc))
                                time.sleep(0.5)
                        note(e="read", store=sid.path, v=v, d=state_digest(got), pos=got.positions)
                except Exception as exc:
                    note(e="fail", op=f"read {sid.path}", error=repr(exc))


CLIENT_SCRIPT = "\n".join(
    [
        "from __future__ import annotations",
        "import sys",
        inspect.getsource(state_digest),
        inspect.getsource(run_client),
        "run_client(sys.argv[1].split(','), sys.argv[2], sys.argv[3].split(','), *sys.argv[4:6],"
        " int(sys.argv[6]))",
    ]
)


@dataclass
class Clients:
    """The four clients of a test: this build's writer and reader (threads) and the previous
    build's (processes), each logging to its own file."""

    base: Path
    previous: Path
    stop: Path = field(init=False)
    threads: list[threading.Thread] = field(default_factory=list)
    procs: dict[subprocess.Popen[bytes], Path] = field(default_factory=dict)  # -> its stderr
    logs: dict[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self.stop = self.base / "stop"
        (self.base / "client.py").write_text(CLIENT_SCRIPT)

    def start(self, name: str, sdk: str, seeds: list[str], role: str, stores: list[str]) -> None:
        out = self.base / f"{name}.jsonl"
        self.logs[name] = out
        seed = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)
        if sdk == "this":
            args = (seeds, role, stores, str(out), str(self.stop), seed)
            thread = threading.Thread(target=run_client, args=args, name=name, daemon=True)
            thread.start()
            self.threads.append(thread)
            return
        cmd = [str(self.previous), str(self.base / "client.py"), ",".join(seeds), role]
        cmd += [",".join(stores), str(out), str(self.stop), str(seed)]
        err_path = self.base / f"{name}.err"
        with open(err_path, "wb") as err:
            proc = subprocess.Popen(cmd, env=previous_env(), cwd=str(self.base), stderr=err)
        self.procs[proc] = err_path

    def events(self, name: str) -> list[dict[str, Any]]:
        path = self.logs[name]
        if not path.exists():
            return []
        lines = path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]

    def acks(self, name: str) -> int:
        return sum(1 for e in self.events(name) if e["e"] == "ack")

    def wait_acks(self, more: int, timeout: float = 120.0) -> None:
        """Wait until every writer has acknowledged ``more`` commits past what it has now."""
        writers = [n for n in self.logs if n.endswith("writer")]
        goal = {n: self.acks(n) + more for n in writers}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self.acks(n) >= goal[n] for n in writers):
                return
            if any(e["e"] == "fail" for n in self.logs for e in self.events(n)):
                return  # reported by the caller's check
            for proc, err in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"a client exited: {err.read_text()[-3000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"writers did not reach {goal}: {[self.acks(n) for n in writers]}")

    def finish(self) -> None:
        self.stop.write_text("")
        for thread in self.threads:
            thread.join(60)
        for proc in self.procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        if not self.stop.exists():
            self.stop.write_text("")
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@dataclass
class Outcome:
    acked: dict[tuple[str, int], str]  # (store, version) -> the digest of its state
    reads: int
    failures: list[str]


def outcome(clients: Clients) -> Outcome:
    """Every client's log checked: failures, the SDK each ran, and each read against the
    writer's acknowledged state of that version."""
    acked: dict[tuple[str, int], str] = {}
    failures: list[str] = []
    reads: list[dict[str, Any]] = []
    for name in clients.logs:
        events = clients.events(name)
        assert events and events[0]["e"] == "start", (name, events[:1])
        sdk = events[0]["sdk"]
        want = str(ROOT) if name.startswith("this") else str(clients.previous.parent.parent)
        assert sdk.startswith(want), f"{name} ran the SDK at {sdk}, not under {want}"
        for e in events:
            if e["e"] == "ack":
                acked[(e["store"], e["v"])] = e["d"]
            elif e["e"] == "read":
                reads.append(e)
            elif e["e"] == "fail":
                failures.append(f"{name}: {e['op']}: {e['error']}")
        err = clients.base / f"{name}.err"
        if err.exists() and err.read_text().strip():
            failures.append(f"{name} stderr: {err.read_text()[-2000:]}")
    checked = 0
    for e in reads:
        want_digest = acked.get((e["store"], e["v"]))
        if want_digest is None:
            continue  # the latest, read while its commit was in flight (or never acknowledged)
        checked += 1
        if e["d"] != want_digest or e["pos"] != {"v": e["v"]}:
            failures.append(f"read {e['store']} v{e['v']} is not the acknowledged state")
    return Outcome(acked, checked, failures)


def restore_every_version(seeds: list[str], acked: Mapping[tuple[str, int], str]) -> None:
    """Each acknowledged version, restored by this build's SDK, byte for byte."""
    with RingClient(seeds) as ring:
        for (store, v), digest in sorted(acked.items()):
            got = ring.restore(StoreId.parse(store), v)
            assert state_digest(got) == digest, f"{store} v{v} does not restore exactly"
            assert got.positions == {"v": v}, (store, v, got.positions)


# -- rings of either build --------------------------------------------------------------------
def old_node(base: Path, i: int, python: Path, args: list[str]) -> NodeProcess:
    return NodeProcess(
        str(base / f"node-{i}"), 0, list(args), python=str(python), env=previous_env()
    )


def start_previous_ring(base: Path, python: Path, args: list[str]) -> LocalRing:
    ring = LocalRing(str(base), 3, args=args)
    for i in range(3):
        node = old_node(base, i, python, args)
        node.start(ring.seeds[:1])
        ring.procs.append(node)
    ring.wait_ring(3)
    for node in ring.procs:  # the previous release's health has no version: it predates it
        health = http_json(node.address, "/v1/health")
        assert isinstance(health, dict) and "version" not in health, health
    return ring


def wait_ready(address: str, timeout: float = 90.0) -> None:
    """Until this build's ``GET /v1/health/ready`` answers 200."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            answer = http_json(address, "/v1/health/ready")
            if isinstance(answer, dict) and answer.get("status") == "ready":
                return
            last = answer
        except urllib.error.HTTPError as exc:
            last = (exc.code, exc.read()[:500])
        except OSError as exc:
            last = exc
        time.sleep(0.2)
    raise TimeoutError(f"{address} not ready: {last}")


# while clients of the previous release still read, the ring keeps writing whole chunks
# (docs/operations.md, Versions and upgrades)
WHOLE = ["--chunk-format", "1"]


def start_this_build(ring: LocalRing, i: int, args: list[str]) -> None:
    """Node ``i`` (stopped) started on this build, same data dir and port, until ready,
    letting writers use only whole chunks (:data:`WHOLE`)."""
    node = ring.procs[i]
    node.python, node.env, node.args = "", None, [*args, *WHOLE]
    node.start([p.address for p in ring.procs if p is not node and p.alive])
    wait_ready(node.address)


def builds(ring: LocalRing) -> list[str | None]:
    out: list[str | None] = []
    for node in ring.procs:
        health = http_json(node.address, "/v1/health")
        assert isinstance(health, dict)
        out.append(health.get("version"))
    return out


def data_dir_bytes(path: Path) -> dict[str, str]:
    """Every file under a data dir by its content's digest (the node's own logs aside)."""
    found = {}
    for f in sorted(path.rglob("*")):
        if f.is_file() and f.name not in ("node.out", "node.log"):
            found[str(f.relative_to(path))] = hashlib.sha256(f.read_bytes()).hexdigest()
    return found


@pytest.fixture
def clients(tmp_path: Path, previous: Path) -> Iterator[Clients]:
    c = Clients(tmp_path / "clients", previous)
    yield c
    c.close()


STORE_A = "upgrade/0/0/this"  # written by this build's SDK
STORE_B = "upgrade/0/1/prev"  # written by the previous build's SDK


def start_clients(clients: Clients, seeds: list[str]) -> None:
    clients.start("this-writer", "this", seeds, "writer", [STORE_A])
    clients.start("prev-writer", "prev", seeds, "writer", [STORE_B])
    clients.wait_acks(1)  # the stores exist before they are read
    clients.start("this-reader", "this", seeds, "reader", [STORE_A, STORE_B])
    clients.start("prev-reader", "prev", seeds, "reader", [STORE_A, STORE_B])


# -- the tests ---------------------------------------------------------------------------------
def test_rolling_upgrade_without_a_secret_under_writers_and_readers(
    tmp_path: Path, previous: Path, clients: Clients
) -> None:
    """0.1.0 -> this build, one node at a time (SIGTERM, start on the same data dir and port,
    wait for ready), while both SDKs write and read: no commit fails, no read fails for good
    (:func:`run_client` tries a restore again while a gap hides a version), every acknowledged
    version restores exactly. Then a data dir marked with a newer disk format is refused by
    this build and left as it was."""
    ring = start_previous_ring(tmp_path / "ring", previous, ARGS)
    try:
        seeds = [p.address for p in ring.procs]
        start_clients(clients, seeds)
        clients.wait_acks(5)
        for i in range(3):
            ring.procs[i].stop(signal.SIGTERM)
            start_this_build(ring, i, ARGS)
            ring.wait_ring(3)
            clients.wait_acks(5)  # the mixed ring takes commits before the next node goes
        assert builds(ring) == [VERSION] * 3
        clients.finish()
        result = outcome(clients)
        assert result.failures == [], result.failures
        assert len(result.acked) >= 2 * 20 and result.reads > 0, (len(result.acked), result.reads)
        restore_every_version(ring.seeds, result.acked)
        ring_view = http_json(ring.seeds[0], "/v1/ring")
        assert isinstance(ring_view, dict) and ring_view["blocks"] is False

        # a downgrade the rule forbids: node 2's data dir as a newer build (a disk format
        # after this build's) would leave it. This build refuses it, names it, and changes
        # nothing in it. (The
        # previous release predates the check: docs/operations.md, Versions and upgrades.)
        node = ring.procs[2]
        node.stop(signal.SIGTERM)
        data = Path(node.data_dir)
        ident_path = data / "node.json"
        ident = json.loads(ident_path.read_text())
        assert (ident["disk_format"], ident["version"]) == (DISK_FORMAT, VERSION), ident
        newer = {**ident, "disk_format": DISK_FORMAT + 1, "version": "9.0.0"}
        ident_path.write_text(json.dumps(newer))
        before = data_dir_bytes(data)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "statestore",
                "node",
                "--listen",
                node.address,
                *ARGS,
                "--data-dir",
                str(data),
                "--seeds",
                ring.seeds[0],
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        assert str(data) in done.stderr and f"disk format {DISK_FORMAT + 1}" in done.stderr
        assert f"statestore {VERSION} reads disk formats 1" in done.stderr, done.stderr
        assert "listening" not in done.stdout
        assert data_dir_bytes(data) == before  # not one byte of the data dir changed
        # put back as this build left it, the node starts and the ring restores everything
        ident_path.write_text(json.dumps(ident))
        start_this_build(ring, 2, ARGS)
        ring.wait_ring(3)
        restore_every_version([node.address], result.acked)
    finally:
        clients.close()
        ring.stop()


def test_upgrade_with_a_secret_stops_every_node_then_starts_this_build(
    tmp_path: Path, previous: Path, clients: Clients
) -> None:
    """With ``--cluster-secret-file`` the two builds sign differently (wire format 1 and 2),
    so the documented path: stop all three, start all three on this build on their data
    dirs; every version acknowledged before restores exactly, and the ring takes commits."""
    secret = tmp_path / "cluster.secret"
    secret.write_bytes(os.urandom(32).hex().encode() + b"\n")
    args = [*ARGS, "--cluster-secret-file", str(secret)]
    ring = start_previous_ring(tmp_path / "ring", previous, args)
    try:
        seeds = [p.address for p in ring.procs]
        start_clients(clients, seeds)
        clients.wait_acks(10)
        clients.finish()
        before = outcome(clients)
        assert before.failures == [], before.failures
        for node in ring.procs:
            node.stop(signal.SIGTERM)
        for i in range(3):
            start_this_build(ring, i, args)
        ring.wait_ring(3)
        assert builds(ring) == [VERSION] * 3
        restore_every_version(ring.seeds, before.acked)
        last = max(v for store, v in before.acked if store == STORE_A)
        with RingClient(ring.seeds) as client:  # and the ring takes the next commit
            client.commit(StoreId.parse(STORE_A), last + 1, {b"after": b"upgrade"}, epoch=1)
            assert client.restore(StoreId.parse(STORE_A), last + 1)[b"after"] == b"upgrade"
    finally:
        clients.close()
        ring.stop()
