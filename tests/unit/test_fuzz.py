"""The fuzzer's short budget (statestore-fuzz, docs/reliability.md): every wire decoder takes
generated and mutated inputs and raises nothing outside our error tree, in bounded time and
memory; a node's endpoints answer mutated requests without a 500 or a hang and leave the
committed stores as they were. Plus the inputs the long runs found, kept as regressions."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from statestore.core.errors import MalformedData, StateStoreError
from statestore.core.ids import StoreId
from statestore.core.manifest import Manifest
from statestore.core.membership import Membership
from statestore.core.view import RingView
from statestore.testing.fuzz import TARGETS, fuzz_target
from statestore.testing.fuzz_api import fuzz_endpoints
from statestore.testing.fuzz_cli import main
from statestore.wire import frames
from statestore.wire.manifest import _to_obj, decode_manifest

BUDGET = 300  # inputs per decoder target in CI


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_decoder_short_budget(name: str) -> None:
    report = fuzz_target(name, seed=7, start=0, count=BUDGET)
    assert report.inputs == BUDGET
    assert [f.line(7) for f in report.findings] == []
    if name != "ids":  # ids runs four parsers and takes their refusals itself
        assert report.accepted and report.refused, "the generator reaches both outcomes"


@pytest.mark.parametrize("name", sorted(TARGETS))
@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=300))
def test_decoder_takes_any_bytes(name: str, data: bytes) -> None:
    try:
        result = TARGETS[name].decode(data)
    except StateStoreError:
        return
    TARGETS[name].check(result)


async def test_endpoints_short_budget(tmp_path: Path) -> None:
    report = await fuzz_endpoints(str(tmp_path), seed=3, count=1500)
    assert report.requests == 1500
    assert (report.internal, report.escaped, report.hangs) == (0, 0, 0), report.server_errors
    assert report.five_xx_committed == 0, report.server_errors
    assert report.committed_changed == []
    assert report.restores_checked == 8
    assert {200, 400, 401, 403, 404} <= set(report.by_status)


def test_cli_small_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--inputs", "400", "--requests", "0", "--targets", "rows,manifest"]) == 0
    out = capsys.readouterr().out
    assert "decoders: 400 inputs" in out


# -- what the long runs found (each raised outside the tree, hung, or was accepted) --------
def _manifest_obj() -> dict[str, object]:
    return _to_obj(Manifest(StoreId("q1", 0, 0, "default"), 1, "delta", 0, 128, (), {}))


@pytest.mark.parametrize(
    "change",
    [
        {"store": 2147483648},  # AttributeError
        {"positions": {"a": b"\x00"}},  # accepted; its restore answered 500
        {"positions": {"a": float("nan")}},
        {"chunks": [["d0-00000000000000ff/x", 0, 0, 1, 1, 1, 255]]},  # no chunk has that key
        {"chunks": [["../../x", 0, 0, 1, 1, 1, 255]]},
    ],
)
def test_manifests_found_malformed(change: dict[str, object]) -> None:
    data = msgpack.packb({**_manifest_obj(), **change}, use_bin_type=True)
    with pytest.raises(MalformedData):
        decode_manifest(data)


@pytest.mark.parametrize(
    "data",
    [
        b"\xde\xff\xffl\x7f\x9dh",  # not zstd: ZstdError
        zstandard.ZstdCompressor().compress(msgpack.packb([b"k", 1.5, b"v"])),  # position inf
        zstandard.ZstdCompressor().compress(msgpack.packb([7, 0, b"v"])),  # key not bytes
    ],
)
def test_folded_frames_found_malformed(data: bytes) -> None:
    with pytest.raises(MalformedData):
        frames.decode_folded(data, 1 << 20)


def test_ring_view_with_billions_of_vnodes_is_refused_at_once() -> None:
    view = {"epoch": 1, "replicas": 1, "write_quorum": 1, "vnodes": 2**31, "members": []}
    view["members"] = [{"id": "n1", "address": "n1:1", "status": "up"}]
    with pytest.raises(MalformedData):
        RingView.from_json(view)  # hung building 2^31 tokens
    with pytest.raises(MalformedData):
        RingView.from_json({**view, "vnodes": 16, "epoch": float("inf")})  # OverflowError


def test_gossip_table_without_members_is_merged_as_empty() -> None:
    m = Membership("n0", "n0:1", "", 1, 0.0)
    m.merge(json.loads('{"epoch": 6, "memberss": []}'), 1.0)  # KeyError before
    assert m.epoch == 6
