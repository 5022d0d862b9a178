"""TLS on real node processes (docs/security.md, "TLS"): a 3-node ring with TLS, client tokens
and a cluster secret, its CA and certificates made here with ``cryptography``.

The SDK (sync and async) and the coordinator endpoints work over HTTPS with a token; a client
without the ring's CA, or with another CA, is refused with an error that names TLS; plain HTTP
to a TLS node gets no answer; replication, gossip and repair run between nodes over TLS (a
node killed with -9 and restarted gets what was committed while it was down); the CLI finds
the CA in ``STATESTORE_TLS_CA``.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from client import AsyncRingClient, NodeUnavailable, RingClient, StoreId, TlsFailed
from statestore.cli.local import LocalRing
from statestore.core.errors import Unauthenticated
from statestore.wire.rows import decode_rows, encode_puts
from tests.certs import ADMIN, WRITER, TlsFiles, make_tls, secured_args
from tests.ringkit import FAST, local_ring

SID = StoreId("tls-q", 0, 1, "default")


@pytest.fixture
def tls(tmp_path: Path) -> TlsFiles:
    return make_tls(tmp_path / "tls")


@pytest.fixture
def secured_ring(
    tmp_path: Path, tls: TlsFiles, monkeypatch: pytest.MonkeyPatch
) -> Iterator[LocalRing]:
    monkeypatch.delenv("STATESTORE_TLS_CA", raising=False)
    monkeypatch.setenv("STATESTORE_TOKEN", ADMIN)  # LocalRing's own ring reads
    secured = [*FAST, *secured_args(tmp_path, tls)]
    with local_ring(tmp_path / "ring", 3, secured, tls_ca=str(tls.ca)) as ring:
        yield ring
    monkeypatch.delenv("STATESTORE_TOKEN")


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "statestore", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


async def test_sdk_and_coordinator_over_tls_with_a_token(
    secured_ring: LocalRing, tls: TlsFiles
) -> None:
    seeds = secured_ring.seeds
    puts = {f"k{i}".encode(): f"v{i}".encode() * 10 for i in range(500)}
    async with AsyncRingClient(seeds, token=WRITER, tls_ca=str(tls.ca)) as ring:
        result = await ring.commit(SID, 1, puts, positions={"src": 1}, epoch=1)
        assert result.version == 1 and result.chunks >= 1
        assert dict((await ring.restore(SID, 1)).items()) == puts
        assert await ring.get(SID, b"k7") == b"v7" * 10

    # the coordinator endpoints over HTTPS: the node writes the replicas over TLS itself
    ctx = ssl.create_default_context(cafile=str(tls.ca))
    headers = {"Authorization": f"Bearer {WRITER}"}
    more = {b"c1": b"x", b"c2": b"y"}
    rows = encode_puts(list(more), list(more.values()))
    base = f"https://{seeds[1]}/v1/stores/{SID.path}"
    async with aiohttp.ClientSession() as s:
        async with s.post(
            f"{base}/commit?version=2&epoch=1", data=rows, headers=headers, ssl=ctx
        ) as r:
            assert r.status == 201, await r.text()
        async with s.get(f"{base}/state?version=2", headers=headers, ssl=ctx) as r:
            assert r.status == 200
            body = await r.read()
    assert decode_rows(body) == ({**puts, **more}, [])

    with RingClient(seeds, token=WRITER, tls_ca=str(tls.ca)) as ring:
        assert dict(ring.restore(SID, 2).items()) == {**puts, **more}
    with (
        pytest.raises(Unauthenticated),
        RingClient(seeds, token="not-a-token", tls_ca=str(tls.ca)),
    ):
        pass


def test_a_client_without_the_ring_ca_gets_an_error_naming_tls(
    secured_ring: LocalRing, tls: TlsFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    seeds = secured_ring.seeds
    # no CA at all: plain HTTP, which a TLS node hangs up on
    with pytest.raises(NodeUnavailable, match="serves TLS, give its CA file as tls_ca="):
        RingClient(seeds, token=WRITER)
    # another CA: the certificate does not verify
    with pytest.raises(TlsFailed, match=r"TLS verification of node .* failed") as info:
        RingClient(seeds, token=WRITER, tls_ca=str(tls.other_ca))
    assert "certificate verify failed" in str(info.value)
    # a CA file that is not one
    with pytest.raises(ValueError, match="cannot use TLS CA file"):
        RingClient(seeds, token=WRITER, tls_ca=str(tls.key))
    # the CA from the environment
    monkeypatch.setenv("STATESTORE_TLS_CA", str(tls.ca))
    with RingClient(seeds, token=WRITER) as ring:
        assert len(ring.ring().live_addresses()) == 3


def test_plain_http_to_a_tls_node_gets_no_answer(secured_ring: LocalRing) -> None:
    address = secured_ring.seeds[0]
    req = urllib.request.Request(
        f"http://{address}/v1/ring", headers={"Authorization": f"Bearer {ADMIN}"}
    )
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        with urllib.request.urlopen(req, timeout=5) as resp:
            resp.read()


def test_replication_and_repair_over_tls_and_the_cli(
    secured_ring: LocalRing, tls: TlsFiles
) -> None:
    env = {"STATESTORE_TLS_CA": str(tls.ca), "STATESTORE_TOKEN": ADMIN}
    seeds = secured_ring.seeds
    done = cli(env, "ring", "--seeds", seeds[0], "--json")
    assert done.returncode == 0, done.stderr
    assert sum(m["status"] == "up" for m in json.loads(done.stdout)["members"]) == 3
    no_ca = cli({"STATESTORE_TOKEN": ADMIN}, "ring", "--seeds", seeds[0])
    assert no_ca.returncode == 1 and "Traceback" not in no_ca.stderr, no_ca.stderr

    first = {f"a{i}".encode(): b"1" * 100 for i in range(300)}
    second = {f"b{i}".encode(): b"2" * 100 for i in range(300)}
    with RingClient(seeds, token=WRITER, tls_ca=str(tls.ca)) as ring:
        ring.commit(SID, 1, first, epoch=1)
    secured_ring.kill(2)
    secured_ring.wait_ring(2)
    with RingClient(secured_ring.seeds, token=WRITER, tls_ca=str(tls.ca)) as ring:
        assert dict(ring.restore(SID, 1).items()) == first  # from the two survivors
        ring.commit(SID, 2, second, epoch=1)  # W=2 of the two left
    secured_ring.restart(2)
    secured_ring.wait_ring(3)
    # repair pushes what the restarted node missed, over TLS: inspect (the CLI, CA from the
    # environment) says every replica holds every copy
    deadline = time.monotonic() + 90
    while True:
        done = cli(env, "inspect", "--seeds", secured_ring.seeds[0], "--store", SID.path, "--json")
        if done.returncode == 0:
            break
        assert "Traceback" not in done.stderr, done.stderr
        assert time.monotonic() < deadline, done.stdout[-3000:] + done.stderr
        time.sleep(1.0)
    report = json.loads(done.stdout)
    assert len(report["replicas"]) == 3 and all(r["complete"] for r in report["replicas"])


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--tls-cert", "CERT"], "--tls-cert and --tls-key go together"),
        (["--tls-ca", "CA"], "--tls-ca needs --tls-cert"),
        (["--tls-cert", "CERT", "--tls-key", "CA"], "cannot use TLS certificate"),
        (["--tls-cert", "CERT", "--tls-key", "KEY", "--tls-ca", "KEY"], "cannot use TLS CA"),
    ],
)
def test_node_tls_flags_are_checked(
    tmp_path: Path, tls: TlsFiles, flags: list[str], words: str
) -> None:
    files = {"CERT": str(tls.cert), "KEY": str(tls.key), "CA": str(tls.ca)}
    args = [files.get(f, f) for f in flags]
    done = cli({}, "node", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "n"), *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert words in done.stderr and "Traceback" not in done.stderr, done.stderr
