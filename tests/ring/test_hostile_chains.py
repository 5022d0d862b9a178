"""``POST /v1/chains`` naming one long chain many times (hostile review 64): each store's
manifests are scanned once a request however often it is named, and the answer is held to
the node's ``--memory-budget`` (the builds before scanned and decoded every manifest of the
store once per entry, on the event loop, and built the answer outside the budget: a read
token's 1,000 entries stalled a node for 7.8 s and answered 38 MB)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import msgpack
import pytest

from statestore.core.ids import StoreId
from statestore.net.http import HttpTransport
from statestore.net.reads import read_chains
from statestore.wire.rows import encode_rows
from tests.ringkit import call, nodes

STORE = StoreId("q", 0, 0, "s")


@pytest.mark.parametrize("budget", [4 << 20])
async def test_a_chain_named_a_thousand_times_is_scanned_once_and_held_to_the_budget(
    tmp_path: Path, budget: int
) -> None:
    kw = {"replicas": 1, "write_quorum": 1, "memory_budget": budget, "max_body": 1 << 20}
    async with nodes(tmp_path, 1, **kw) as (node,):
        for v in range(1, 151):  # deltas only: the chain of version 150 names all 150
            body = b"".join(encode_rows([(b"k%d" % v, b"v")]))
            path = f"/v1/stores/{STORE.path}/commit?version={v}&epoch=1"
            assert (await call(node, "POST", path, data=body))[0] == 201
        scans = 0
        manifests = node.store.manifests

        def counted(store: StoreId) -> object:
            nonlocal scans
            scans += 1
            return manifests(store)

        node.store.manifests = counted  # type: ignore[method-assign]
        one = [[STORE.path, 150]]
        async with aiohttp.ClientSession() as s:
            url = f"http://{node.address}/v1/chains"
            async with s.post(url, json={"stores": one}) as r:
                assert r.status == 200
                (chain,) = msgpack.unpackb(await r.read())
        assert 1000 * len(chain) > 2 * budget  # the premise: a thousand of it do not fit
        assert scans == 1
        scans = 0
        # 1,000 entries of a ~20 KB chain: ~20 MB of answer, over the 4 MiB budget
        status, body = await call(node, "POST", "/v1/chains", json={"stores": one * 1000})
        assert status == 413, body
        assert body["error"]["code"] == "payload_too_large"
        assert "chains answer" in body["error"]["message"]
        assert scans == 1
        # as many entries as fit: answered, each the same chain, from one scan
        scans = 0
        status, _ = await call(node, "POST", "/v1/chains", json={"stores": one * 20})
        assert status == 200 and scans == 1


async def test_chains_over_the_budget_are_asked_in_halves(tmp_path: Path) -> None:
    """A reader's batch of chains whose answer is more than the node's budget holds (a
    backup's 150 versions of one store: every chain holds every manifest above its version)
    is asked again in halves, down to what fits, where it failed (hostile review 65)."""
    kw = {"replicas": 1, "write_quorum": 1, "memory_budget": 4 << 20, "max_body": 1 << 20}
    async with nodes(tmp_path, 1, **kw) as (node,):
        for v in range(1, 151):
            body = b"".join(encode_rows([(b"k%d" % v, b"v")]))
            path = f"/v1/stores/{STORE.path}/commit?version={v}&epoch=1"
            assert (await call(node, "POST", path, data=body))[0] == 201
        transport = HttpTransport()
        try:
            wanted = [(STORE, v) for v in range(1, 151)]
            chains = await read_chains(transport, node.view(), wanted)
        finally:
            await transport.close()
        assert [len(c) for c in chains] == list(range(1, 151))
