"""Per-request consistency against real node processes: ``one``, ``quorum``, ``all`` for
commits and restores, ``delay_bound``, ``allow_tentative`` (docs/client.md; tentative
commits themselves: tests/ring/test_tentative.py)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from client import (
    DelayBoundExceeded,
    InvalidRequest,
    QuorumNotReached,
    RingClient,
    StoreId,
    Unavailable,
)
from statestore.wire.rows import encode_rows
from tests.ringkit import local_ring

pytestmark = pytest.mark.slow

ARGS = ["--no-dht", "--gossip-interval", "0.2", "--suspect-after", "1", "--down-after", "30"]


def test_consistency_levels_on_a_ring_losing_nodes(tmp_path: Path) -> None:
    """3 nodes, R=3, W=2; the failure detector is slow (30 s), so killed nodes stay in the
    view as replicas that do not answer, as during a partition."""
    with local_ring(tmp_path, 3, ARGS) as ring:
        sid = StoreId("cons", 0, 0)
        with RingClient(ring.seeds, timeout=2.0) as c:
            r = c.commit(sid, 1, {b"a": b"1"}, epoch=1, consistency="all")
            assert r.tentative is False
            st = c.restore(sid, consistency="all")
            assert dict(st) == {b"a": b"1"} and st.tentative is False
            with pytest.raises(InvalidRequest, match="needs a delay_bound"):
                c.commit(sid, 2, {b"b": b"2"}, epoch=1, allow_tentative=True)
            with pytest.raises(InvalidRequest):
                c.commit(sid, 2, {b"b": b"2"}, epoch=1, consistency="most")
            with pytest.raises(ValueError):
                c.restore(sid, delay_bound=0)

            ring.kill(2)  # one of three down
            with pytest.raises(QuorumNotReached):
                c.commit(sid, 2, {b"b": b"2"}, epoch=1, consistency="all")
            with pytest.raises(QuorumNotReached):
                c.restore(sid, consistency="all")
            c.commit(sid, 2, {b"b": b"2"}, epoch=1)  # quorum: the two that answer
            assert dict(c.restore(sid)) == {b"a": b"1", b"b": b"2"}

            ring.kill(1)  # two of three down
            with pytest.raises(QuorumNotReached):
                c.commit(sid, 3, {b"c": b"3"}, epoch=1)
            with pytest.raises(QuorumNotReached):
                c.restore(sid)
            r = c.commit(sid, 3, {b"c": b"3"}, epoch=1, consistency="one")
            assert r.version == 3 and r.tentative is False
            st = c.restore(sid, consistency="one")
            assert st.version == 3 and dict(st) == {b"a": b"1", b"b": b"2", b"c": b"3"}

            ring.restart(1)
            ring.restart(2)
            ring.wait_ring(3)


def test_delay_bound_on_a_paused_replica(tmp_path: Path) -> None:
    """A paused replica answers nothing: ``all`` with a delay bound does not wait out the
    10 s request timeout. A restore of the latest returns, within its bound, the best
    version the nodes that answer hold, marked tentative; a restore of a given version and a
    commit fail with DelayBoundExceeded (an Unavailable)."""
    with local_ring(tmp_path, 3, ARGS) as ring:
        sid = StoreId("cons", 0, 1)
        with RingClient(ring.seeds, timeout=10.0) as c:
            c.commit(sid, 1, {b"a": b"1"}, epoch=1)
            ring.pause(2)
            try:
                # a bound of 2 s, not 0.5: well below the 10 s timeout it must not wait out,
                # and the answer's own path does not race it on two loaded cores (a CI run
                # sharing the machine missed 0.5 s once)
                st = c.restore(sid, consistency="all", delay_bound=2.0)
                assert (st.tentative, st.version, dict(st)) == (True, 1, {b"a": b"1"})
                # the HTTP coordinator does the same
                url = f"http://{ring.seeds[0]}/v1/stores/{sid.path}/state"
                with urllib.request.urlopen(
                    url + "?consistency=all&delay_bound=2", timeout=10
                ) as resp:
                    assert resp.headers["X-Statestore-Tentative"] == "true"
                    assert resp.headers["X-Statestore-Version"] == "1"
                with pytest.raises(DelayBoundExceeded) as exc:
                    c.restore(sid, 1, consistency="all", delay_bound=0.5)
                assert isinstance(exc.value, Unavailable)
                with pytest.raises(DelayBoundExceeded):
                    c.commit(sid, 2, {b"b": b"2"}, epoch=1, consistency="all", delay_bound=0.5)
            finally:
                ring.resume(2)


def test_http_coordinator_takes_consistency(tmp_path: Path) -> None:
    with local_ring(tmp_path, 3, ARGS) as ring:
        base = f"http://{ring.seeds[0]}/v1/stores/cons/0/2/default"
        body = b"".join(encode_rows([(b"k", b"v")]))

        def post(query: str) -> dict[str, object]:
            req = urllib.request.Request(f"{base}/commit?{query}", data=body, method="POST")
            with urllib.request.urlopen(req, timeout=10) as resp:
                out = json.loads(resp.read())
                assert isinstance(out, dict)
                return out

        out = post("version=1&epoch=1&consistency=all")
        assert out["consistency"] == "all" and out["tentative"] is False
        with urllib.request.urlopen(f"{base}/state?consistency=one", timeout=10) as resp:
            assert resp.headers["X-Statestore-Tentative"] == "false"
        for bad, status in (("consistency=most", 400), ("allow_tentative=1", 400)):
            with pytest.raises(urllib.error.HTTPError) as err:
                post(f"version=2&epoch=1&{bad}")
            err.value.close()
            assert err.value.code == status
        ring.kill(2)
        with pytest.raises(urllib.error.HTTPError) as err:
            post("version=2&epoch=1&consistency=all")
        err.value.close()
        assert err.value.code == 503
        # "all" cannot be had with a node down: within its bound the commit is tentative,
        # held as hints by the two that answer (handed off as a quorum commit later)
        out = post("version=2&epoch=1&consistency=all&allow_tentative=1&delay_bound=2")
        assert out["tentative"] is True
        assert post("version=2&epoch=1")["version"] == 2
