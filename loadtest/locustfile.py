"""Locust load test of a running ring: delta commits, restores and point reads.

Each simulated user owns one store (an operator partition) and, like a streaming query,
commits a delta per micro-batch, now and then restores its state, and serves point reads:

* ``POST /v1/stores/{store}/commit`` (weight 5): a delta of ``STATESTORE_DELTA_ROWS`` rows of
  ~100 B (80 % updates, 15 % new keys, 5 % deletes) as framed rows, through the coordinator
  endpoint of the ``--host`` node, acknowledged at W.
* ``GET /v1/stores/{store}/state`` (weight 1): the latest version restored by the ``--host``
  node and streamed back as framed rows.
* ``point read`` (weight 4): what ``RingClient.get`` does, over plain HTTP: the chain of
  manifests from a replica of the store, then only the chunks of the key's key group, decoded
  here. Its sub-requests show up as ``get: chain`` and ``get: chunk``.

The SDK's RingClient is not used: it runs an asyncio loop on a thread, which gevent's
monkeypatching turns into a greenlet; the pure pieces of the SDK (ring view, chain
resolution, chunk codec) are used instead. Locust stays out of the pytest run.

    statestore local --nodes 3 &
    locust -f loadtest/locustfile.py --headless -u 20 -r 5 -t 60s --host http://127.0.0.1:7400

Environment: ``STATESTORE_SEEDS`` (default ``127.0.0.1:7400``; the first seed is the default
host), ``STATESTORE_DELTA_ROWS`` (1000), ``STATESTORE_INITIAL_ROWS`` (5000).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import time
import uuid

from locust import FastHttpUser, between, task

from statestore.core.chunk import decode_chunk, key_group
from statestore.core.errors import StateStoreError
from statestore.core.fold import apply as fold
from statestore.core.ids import StoreId, chunk_key
from statestore.core.manifest import resolve_chain
from statestore.core.view import RingView
from statestore.wire.manifest import decode_chain
from statestore.wire.rows import encode_rows

SEEDS = [s.strip() for s in os.environ.get("STATESTORE_SEEDS", "127.0.0.1:7400").split(",")]
DELTA_ROWS = int(os.environ.get("STATESTORE_DELTA_ROWS", "1000"))
INITIAL_ROWS = int(os.environ.get("STATESTORE_INITIAL_ROWS", "5000"))
RUN = uuid.uuid4().hex[:8]  # a fresh query name per run: stores never collide with old runs
_partitions = itertools.count()


def _value(rng: random.Random) -> bytes:
    return rng.randbytes(42).hex().encode()  # 84 B, compresses about 2:1


class StateStoreUser(FastHttpUser):
    host = f"http://{SEEDS[0]}"
    wait_time = between(0.1, 0.5)

    def on_start(self) -> None:
        self.rng = random.Random()
        self.store = StoreId(f"locust-{RUN}", 0, next(_partitions), "state")
        self.keys: list[bytes] = []
        self.version = 0
        self.view = self._ring()
        puts = {self._new_key(): _value(self.rng) for _ in range(INITIAL_ROWS)}
        self._commit(puts, [], snapshot=True, name="commit snapshot")

    # -- helpers -------------------------------------------------------------------------
    def _new_key(self) -> bytes:
        key = f"user-{self.store.partition}-{self.rng.randrange(10**12):012d}".encode()
        self.keys.append(key)
        return key

    def _ring(self) -> RingView:
        with self.client.get("/v1/ring", name="ring", catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"ring: {resp.status_code}")
                return getattr(self, "view", None) or RingView(0, ())
            return RingView.from_json(json.loads(resp.content))

    def _head(self) -> int:
        """The store's latest version over its replicas (after a failed commit)."""
        best = 0
        for address in self.view.store_replicas(self.store):
            url = f"http://{address}/v1/stores/{self.store.path}/head"
            with self.client.get(url, name="head", catch_response=True) as resp:
                if resp.status_code == 200:
                    best = max(best, int(json.loads(resp.content)["version"]))
                else:
                    resp.success()  # 404 before the first commit is an answer, not a failure
        return best

    def _commit(self, puts: dict[bytes, bytes], deletes: list[bytes], *, snapshot: bool, name: str):
        version = self.version + 1
        rows: list[tuple[bytes, bytes | None]] = [*puts.items(), *((k, None) for k in deletes)]
        body = b"".join(encode_rows(rows))
        url = f"/v1/stores/{self.store.path}/commit?version={version}&epoch=1" + (
            "&snapshot=1" if snapshot else ""
        )
        headers = {
            "X-Statestore-Positions": json.dumps({"source-0": version * DELTA_ROWS}),
            "Content-Type": "application/octet-stream",
        }
        with self.client.post(
            url, data=body, headers=headers, name=name, catch_response=True
        ) as resp:
            if resp.status_code == 201:
                self.version = version
                return
            resp.failure(f"{resp.status_code}: {resp.text[:200] if resp.text else ''}")
        # a timeout may still have committed: continue from what the replicas hold
        self.view = self._ring()
        self.version = max(self.version, self._head())

    # -- tasks ---------------------------------------------------------------------------
    @task(5)
    def commit_delta(self) -> None:
        n_upd = DELTA_ROWS * 80 // 100
        n_del = DELTA_ROWS * 5 // 100
        n_new = DELTA_ROWS - n_upd - n_del
        upd = self.rng.sample(self.keys, min(n_upd + n_del, len(self.keys)))
        puts = {k: _value(self.rng) for k in upd[:n_upd]}
        deletes = upd[n_upd:]
        for k in deletes:
            self.keys.remove(k)
        for _ in range(n_new):
            puts[self._new_key()] = _value(self.rng)
        self._commit(puts, deletes, snapshot=False, name="commit delta")

    @task(1)
    def restore(self) -> None:
        url = f"/v1/stores/{self.store.path}/state"
        with self.client.get(url, name="restore (state)", catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"{resp.status_code}: {resp.text[:200] if resp.text else ''}")
            elif int(resp.headers.get("X-Statestore-Version", "0")) < self.version:
                resp.failure(
                    f"restored v{resp.headers.get('X-Statestore-Version')} < v{self.version}"
                )

    @task(4)
    def point_read(self) -> None:
        """RingClient.get over HTTP: the chain from a replica, the key group's chunks."""
        key = self.rng.choice(self.keys)
        version = self.version
        started = time.perf_counter()
        size = 0
        error: Exception | None = None
        try:
            chain_resp = None
            for address in self.view.store_replicas(self.store):
                url = f"http://{address}/v1/stores/{self.store.path}/chain?version={version}"
                with self.client.get(url, name="get: chain", catch_response=True) as resp:
                    if resp.status_code == 200:
                        chain_resp = resp.content
                        break
                    resp.failure(f"{resp.status_code}")
            if chain_resp is None:
                raise StateStoreError("no replica answered the chain")
            manifests = decode_chain(chain_resp)
            deltas = {m.version: m for m in manifests if m.kind == "delta"}
            snaps = {m.version: m for m in manifests if m.kind == "snapshot"}
            state: dict[bytes, bytes] = {}
            for m in resolve_chain(self.store, version, deltas, snaps):
                g = key_group(key, m.key_groups)
                for ref in m.chunks:
                    if not ref.lo <= g <= ref.hi:
                        continue
                    ckey = chunk_key(self.store, m.version, ref.name)
                    data = self._chunk(ckey)
                    size += len(data)
                    fold(state, [r for r in decode_chunk(data, what=ckey) if r[0] == key])
            if key not in state:
                raise StateStoreError(f"key {key!r} missing at v{version}")
        except Exception as exc:  # reported to locust as a failed point read
            error = exc
        self.environment.events.request.fire(
            request_type="GET",
            name="point read",
            response_time=(time.perf_counter() - started) * 1000,
            response_length=size,
            exception=error,
            context={},
        )

    def _chunk(self, ckey: str) -> bytes:
        for address in self.view.read_order(ckey):
            url = f"http://{address}/v1/chunks/{ckey}"
            with self.client.get(url, name="get: chunk", catch_response=True) as resp:
                if resp.status_code == 200:
                    return resp.content
                resp.failure(f"{resp.status_code}")
        raise StateStoreError(f"chunk {ckey} on no live holder")
