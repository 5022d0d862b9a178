"""Fuzzing every wire decoder with generated and mutated inputs (docs/reliability.md, Fuzzing).

Each target pairs a generator of valid encodings (random content: stores, rows, manifests,
plans, bodies) with the decoder a node or a client runs on bytes from the network or the disk.
An input is a valid encoding mutated at the byte level or at the value level
(:mod:`statestore.testing.mutate`), a structure of another shape, raw random bytes, nesting
thousands deep or a container declaring billions of elements. The promise checked for every
input:

- the decoder returns, or raises a :class:`StateStoreError` (never another exception);
- what it returns keeps the decoder's contract (e.g. a manifest's positions are JSON and its
  chunk names are chunk names; folded rows are bytes, position, bytes-or-nil);
- within ``SLOW`` seconds, and (measured on a sample of inputs with ``tracemalloc``) within a
  memory budget of the target's limit plus a multiple of the input's size.

Input ``i`` of target ``t`` in a run with seed ``s`` is drawn from ``Random(f"{s}/{t}/{i}")``,
so a finding is replayed alone: ``statestore-fuzz --replay t:i --seed s``.
"""

from __future__ import annotations

import json
import random
import time
import traceback
import tracemalloc
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zstandard

from statestore.core.address import parse_address
from statestore.core.chunk import decode_chunk, encode_chunks
from statestore.core.errors import StateStoreError
from statestore.core.ids import MAX_EPOCH, StoreId, chunk_key, parse_chunk_key, parse_uint
from statestore.core.manifest import ChunkRef, Manifest
from statestore.core.membership import Membership
from statestore.core.plan import ChunkTask, Hop
from statestore.core.view import RingView
from statestore.net.streams import read_frames
from statestore.testing.mutate import Mutator, deep_json, deep_msgpack, huge_msgpack
from statestore.wire import bodies, frames, head, manifest, rows
from statestore.wire.bodies import decode_json, decode_positions

__all__ = ["MAX_RAW", "SLOW", "TARGETS", "Finding", "TargetReport", "fuzz_target", "one_input"]

MAX_RAW = 1 << 20  # the decode limit the fuzzer gives chunk and frame decoders
SLOW = 1.0  # seconds: an input slower than this is a hang
MEMORY_SAMPLE = 16  # one input in this many runs under tracemalloc


def _store(rng: random.Random) -> StoreId:
    return StoreId(
        rng.choice(("q1", "etl-a", "x", "Q.9_z")),
        rng.choice((0, 1, 7, 2**31 - 1)),
        rng.randrange(0, 64),
        rng.choice(("default", "agg", "n")),
    )


def _rows(rng: random.Random) -> tuple[dict[bytes, bytes], list[bytes]]:
    n = rng.choice((0, 1, 3, 10, 40))
    puts = {
        rng.randbytes(rng.randrange(0, 12)): rng.randbytes(rng.randrange(0, 40)) for _ in range(n)
    }
    deletes = [rng.randbytes(rng.randrange(1, 12)) for _ in range(rng.randrange(0, 4))]
    return puts, [d for d in deletes if d not in puts]


def _manifest(rng: random.Random) -> Manifest:
    puts, deletes = _rows(rng)
    groups = rng.choice((1, 16, 128))
    kind = rng.choice(("delta", "snapshot"))
    chunks = encode_chunks(puts, deletes, groups=groups, target_size=rng.choice((64, 4096)))
    positions: dict[str, Any] = rng.choice(
        ({}, {"kafka": {"t": {"0": 17}}}, {"s": [1, "x", None, 2.5]})
    )
    return Manifest(
        _store(rng),
        rng.randrange(1, 1000),
        kind,
        rng.randrange(0, 5),
        groups,
        tuple(ChunkRef.of(c) for c in chunks),
        positions,
        rng.choice((None, rng.randrange(0, 5))),
    )


def _hop(rng: random.Random, store: StoreId, depth: int) -> Hop:
    tasks = []
    for i in range(rng.randrange(0, 4)):
        v = rng.randrange(1, 50)
        name = f"d{i}-{rng.getrandbits(64):016x}"
        tasks.append(ChunkTask(chunk_key(store, v, name), i, v, name, 1, 10, 20, 2, ()))
    kids = tuple(_hop(rng, store, depth - 1) for _ in range(rng.randrange(0, 3) if depth else 0))
    return Hop(f"n{rng.randrange(9)}:7400", tuple(tasks), kids)


# -- what a target is --------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """A decoder under test.

    Args:
        valid: a valid input object drawn from the RNG (what the encoder gets).
        encode: the object's bytes.
        decode: the decoder, fed bytes.
        check: the decoder's contract on what it accepted (raises AssertionError).
        text: inputs are JSON (the mutator uses JSON tokens and JSON nesting).
        budget: memory a single input may take beyond 64 x its size (bytes).
    """

    valid: Callable[[random.Random], Any]
    encode: Callable[[Any], bytes]
    decode: Callable[[bytes], Any]
    check: Callable[[Any], None] = lambda _: None
    text: bool = False
    budget: int = 8 << 20


def _pack(obj: Any) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


def _json(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def _chunk_bytes(obj: list[Any]) -> bytes:
    # obj: [declare size?, flat rows]: compressed as a chunk, with or without a content size
    declare, flat = obj
    raw = b"\x01" + _pack(flat)
    return zstandard.ZstdCompressor(level=1, write_content_size=bool(declare)).compress(raw)


def _chunk_valid(rng: random.Random) -> list[Any]:
    puts, deletes = _rows(rng)
    flat: list[Any] = []
    for k, v in [*puts.items(), *((d, None) for d in deletes)]:
        flat += (k, v)
    return [rng.random() < 0.8, flat]


def _each(check: Callable[[Any], Any], items: list[Any]) -> None:
    for item in items:
        check(item)


def _check_manifest(m: Manifest) -> None:
    json.dumps(dict(m.positions), allow_nan=False)  # answered as a JSON header by restores
    for c in m.chunks:
        parse_chunk_key(chunk_key(m.store, m.version, c.name))  # a key chunks can have


def _check_epoch(epoch: int) -> None:
    assert type(epoch) is int and 0 <= epoch <= MAX_EPOCH, epoch


def _check_folded(triples: list[tuple[Any, Any, Any]]) -> None:
    for k, pos, v in triples:
        assert type(k) is bytes and type(pos) is int and pos >= 0, (k, pos)
        assert v is None or type(v) is bytes, v


class _Bytes:
    """A stream over bytes, as a transport's stream reads (net/streams.ByteReader)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    async def readexactly(self, n: int) -> bytes:
        import asyncio

        if self.pos + n > len(self.data):
            partial = self.data[self.pos :]
            self.pos = len(self.data)
            raise asyncio.IncompleteReadError(partial, n)
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out


def _drive(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never waits on anything (a stream over bytes) to its end."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise AssertionError("the decoder waited on something")


def _frames(data: bytes) -> list[Any]:
    async def collect() -> list[Any]:
        return [f async for f in read_frames(_Bytes(data), MAX_RAW)]

    return list(_drive(collect()))


def _frames_valid(rng: random.Random) -> list[Any]:
    out: list[Any] = []
    for _ in range(rng.randrange(0, 4)):
        kind = rng.choice("CFDE")
        metas: dict[str, dict[str, Any]] = {
            "C": {"k": "q1/0/0/default/1/d0-00000000000000ff", "p": 0},
            "F": {"hop": "n1:7400", "g": [0, 3]},
            "D": {"hop": "n1:7400", "depth": 1, "own": 2, "in": 0, "out": 5, "covers": []},
            "E": {"hop": "n2:7400", "error": "gone"},
        }
        meta = metas[kind]
        out.append([kind, meta, rng.randbytes(rng.randrange(0, 30))])
    return out


def _frames_bytes(obj: list[Any]) -> bytes:
    return b"".join(
        frames.encode_frame(str(k).encode()[:1] or b"C", m, bytes(d)) for k, m, d in obj
    )


def _gossip_membership() -> Membership:
    m = Membership("n0", "n0:7400", "", 3, 0.0)
    m.merge(
        {
            "epoch": 5,
            "members": [
                {"id": "n1", "address": "n1:7400", "zone": "", "incarnation": 2, "heartbeat": 9},
                {
                    "id": "n2",
                    "address": "10.0.0.2:7400",
                    "zone": "b",
                    "incarnation": 1,
                    "heartbeat": 1,
                },
            ],
        },
        0.0,
    )
    return m


def _gossip_valid(rng: random.Random) -> dict[str, Any]:
    members = [
        {
            "id": rng.choice(("n0", "n1", "n2", "n3", "x")),
            "address": rng.choice(("n1:7400", "n3:7400", "localhost:7400", "[::1]:7400", "h:1")),
            "zone": rng.choice(("", "a")),
            "incarnation": rng.randrange(0, 2000),
            "heartbeat": rng.randrange(0, 100),
        }
        for _ in range(rng.randrange(0, 5))
    ]
    return {"epoch": rng.randrange(0, 10), "members": members}


def _gossip_typed(data: bytes) -> Membership:
    m = _gossip_membership()
    m.merge(decode_json(data, bodies.GossipDigest, "gossip").to_dict(), 1.0)
    return m


def _gossip_raw(data: bytes) -> Membership | None:
    # Membership.merge's own contract (a Mapping of any content): MalformedData, nothing else
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        return None
    m = _gossip_membership()
    m.merge(obj, 1.0)
    return m


def _json_then(decoder: Callable[[Any], Any]) -> Callable[[bytes], Any]:
    """A client's decoder of a JSON answer: the JSON parse is the transport's (not ours)."""

    def run(data: bytes) -> Any:
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):
            return None
        return decoder(obj)

    return run


def _ring_valid(rng: random.Random) -> dict[str, Any]:
    return {
        "epoch": rng.randrange(1, 100),
        "replicas": 3,
        "write_quorum": 2,
        "vnodes": 16,
        "members": [
            {"id": f"n{i}", "address": f"n{i}:7400", "status": "up", "zone": ""}
            for i in range(rng.randrange(1, 5))
        ],
    }


def _ids(data: bytes) -> None:
    text = data.decode("utf-8", "surrogateescape")
    for fn in (
        StoreId.parse,
        parse_chunk_key,
        lambda t: parse_uint(t, "n", 2**62),
        parse_address,
    ):
        try:
            fn(text)
        except StateStoreError:
            pass


TARGETS: dict[str, Target] = {
    "chunk": Target(
        valid=_chunk_valid,
        encode=_chunk_bytes,
        decode=lambda d: decode_chunk(d, max_raw=MAX_RAW),
        budget=4 * MAX_RAW,
    ),
    "manifest": Target(
        valid=lambda rng: manifest._to_obj(_manifest(rng)),
        encode=_pack,
        decode=manifest.decode_manifest,
        check=_check_manifest,
    ),
    "manifest-epoch": Target(
        valid=lambda rng: manifest._to_obj(_manifest(rng)),
        encode=_pack,
        decode=manifest.manifest_epoch,
        check=_check_epoch,
    ),
    "chain": Target(
        valid=lambda rng: [manifest._to_obj(_manifest(rng)) for _ in range(rng.randrange(0, 4))],
        encode=_pack,
        decode=manifest.decode_chain,
        check=lambda ms: _each(_check_manifest, ms),
    ),
    "copies": Target(
        valid=lambda rng: [
            manifest.encode_manifest(_manifest(rng)) for _ in range(rng.randrange(0, 4))
        ],
        encode=_pack,
        decode=lambda d: [
            manifest.decode_manifest(raw)
            for raw in manifest.decode_copies(d, bodies.MAX_COPIES)
            if raw is not None
        ],
        check=lambda ms: _each(_check_manifest, ms),
    ),
    "body-manifests": Target(
        valid=lambda rng: {
            "manifests": [[_store(rng).path, rng.randrange(1, 9), "delta", rng.randrange(0, 3)]]
            * rng.randrange(0, 3)
        },
        encode=_json,
        decode=lambda d: decode_json(d, bodies.ManifestsRequest, "manifest copies"),
        text=True,
    ),
    "frame-meta": Target(
        valid=lambda rng: ([*_frames_valid(rng), ["C", {}, b""]])[0][1],
        encode=_pack,
        decode=frames.decode_meta,
    ),
    "frame-stream": Target(
        valid=_frames_valid,
        encode=_frames_bytes,
        decode=_frames,
    ),
    "folded": Target(
        valid=lambda rng: [
            x
            for _ in range(rng.randrange(0, 8))
            for x in (rng.randbytes(rng.randrange(0, 8)), rng.randrange(0, 9), rng.randbytes(3))
        ],
        encode=lambda flat: zstandard.ZstdCompressor(level=1).compress(_pack(flat)),
        decode=lambda d: frames.decode_folded(d, MAX_RAW),
        check=_check_folded,
        budget=4 * MAX_RAW,
    ),
    "hop": Target(
        valid=lambda rng: msgpack.unpackb(
            frames.encode_hop(
                (s := _store(rng)), _hop(rng, s, 3), rng.random() < 0.5, rng.randrange(0, 3), 128
            )
        ),
        encode=_pack,
        decode=frames.decode_hop,
    ),
    "rows": Target(
        valid=lambda rng: _rows(rng),
        encode=lambda r: b"".join(rows.encode_rows([*r[0].items(), *((k, None) for k in r[1])])),
        decode=rows.decode_rows,
    ),
    "head-stored": Target(
        valid=lambda rng: [rng.randrange(0, 9), rng.randrange(1, 99)],
        encode=_pack,
        decode=head.decode_stored,
    ),
    "head-json": Target(
        valid=lambda rng: {"version": rng.randrange(1, 99), "epoch": rng.randrange(0, 9)},
        encode=_json,
        decode=_json_then(head.from_json),
        text=True,
    ),
    "ring-view": Target(
        valid=_ring_valid, encode=_json, decode=_json_then(RingView.from_json), text=True
    ),
    "ids": Target(
        valid=lambda rng: rng.choice(
            ("q1/0/3/default", "q1/0/3/default/7/d0-00000000000000ff", "127.0.0.1:7400", "42")
        ),
        encode=lambda s: str(s).encode(),
        decode=_ids,
        text=True,
    ),
    "gossip": Target(valid=_gossip_valid, encode=_json, decode=_gossip_typed, text=True),
    "gossip-raw": Target(valid=_gossip_valid, encode=_json, decode=_gossip_raw, text=True),
    "body-have": Target(
        valid=lambda rng: {
            "chunks": ["q1/0/0/default/1/d0-00000000000000ff"] * rng.randrange(0, 3),
            "manifests": [["q1/0/0/default", rng.randrange(1, 9), "delta"]] * rng.randrange(0, 3),
        },
        encode=_json,
        decode=lambda d: decode_json(d, bodies.HaveRequest, "have"),
        text=True,
    ),
    "body-keys": Target(
        valid=lambda rng: {"keys": ["q1/0/0/default/1/d0-00000000000000ff"] * rng.randrange(0, 3)},
        encode=_json,
        decode=lambda d: decode_json(d, bodies.KeysRequest, "keys"),
        text=True,
    ),
    "body-stores": Target(
        valid=lambda rng: {"stores": [_store(rng).path for _ in range(rng.randrange(0, 3))]},
        encode=_json,
        decode=lambda d: decode_json(d, bodies.StoresRequest, "heads"),
        text=True,
    ),
    "body-chains": Target(
        valid=lambda rng: {"stores": [[_store(rng).path, rng.randrange(1, 9)] for _ in range(2)]},
        encode=_json,
        decode=lambda d: decode_json(d, bodies.ChainsRequest, "chains"),
        text=True,
    ),
    "body-gc": Target(
        valid=lambda rng: {"floor": rng.randrange(1, 99)},
        encode=_json,
        decode=lambda d: decode_json(d, bodies.GcRequest, "gc"),
        text=True,
    ),
    "body-chunk-ack": Target(
        valid=lambda rng: {"stored": "q1/0/0/default/1/d0-00000000000000ff"},
        encode=_json,
        decode=lambda d: decode_json(d, bodies.ChunkAck, "ack"),
        text=True,
    ),
    "body-manifest-ack": Target(
        valid=lambda rng: {"stored": rng.random() < 0.5},
        encode=_json,
        decode=lambda d: decode_json(d, bodies.ManifestAck, "ack"),
        text=True,
    ),
    "positions": Target(
        valid=lambda rng: rng.choice(({}, {"kafka": {"t": {"0": 17}}}, {"a": [1, 2, {"b": None}]})),
        encode=_json,
        decode=lambda d: decode_positions(d, "positions"),
        check=lambda p: _each(json.dumps, [p]),
        text=True,
    ),
}


# -- running -----------------------------------------------------------------------------
def one_input(name: str, seed: int, index: int) -> bytes:
    """Input ``index`` of target ``name`` in a run seeded ``seed`` (the same every time)."""
    target = TARGETS[name]
    rng = random.Random(f"{seed}/{name}/{index}")
    mut = Mutator(rng)
    roll = rng.random()
    if roll < 0.04:
        return rng.randbytes(rng.randrange(0, 64))
    if roll < 0.07:
        depth = rng.choice((100, 1000, 5000, 100_000))
        return deep_json(depth, rng) if target.text else deep_msgpack(depth, rng)
    if roll < 0.09 and not target.text:
        return huge_msgpack(rng)
    valid = target.valid(rng)
    if roll < 0.40:  # a structure of another shape, re-encoded
        obj = valid
        for _ in range(rng.choice((1, 1, 2, 3))):
            obj = mut.mutate_value(obj, keep_types=rng.random() < 0.5)
        try:
            return target.encode(obj)
        except Exception:
            pass
    data = target.encode(valid)
    if roll < 0.45:
        return data  # valid inputs are part of the promise too
    corpus = [target.encode(target.valid(rng)) for _ in range(2)]
    return mut.mutate_bytes(data, corpus, text=target.text)


@dataclass
class Finding:
    """A crash (an exception outside our tree, or a broken contract), a slow input or an
    input over its memory budget; ``index`` replays it."""

    target: str
    index: int
    kind: str  # crash | contract | slow | memory
    what: str
    where: str
    input: bytes

    def line(self, seed: int) -> str:
        return (
            f"{self.kind} in {self.target} (replay: --replay {self.target}:{self.index} "
            f"--seed {seed}): {self.what} at {self.where}; input {self.input[:96].hex()}"
            + ("..." if len(self.input) > 96 else "")
        )


@dataclass
class TargetReport:
    target: str
    inputs: int = 0
    accepted: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # error code -> inputs
    findings: list[Finding] = field(default_factory=list)  # first of each kind and place
    crashes: int = 0
    contract: int = 0
    slow: int = 0
    memory: int = 0
    seconds: float = 0.0
    max_seconds: float = 0.0
    max_peak: int = 0  # bytes, over the sampled inputs
    sampled: int = 0

    def merge(self, other: TargetReport) -> None:
        self.inputs += other.inputs
        self.accepted += other.accepted
        for code, n in other.refused.items():
            self.refused[code] = self.refused.get(code, 0) + n
        seen = {(f.kind, f.where) for f in self.findings}
        self.findings += [f for f in other.findings if (f.kind, f.where) not in seen]
        self.crashes += other.crashes
        self.contract += other.contract
        self.slow += other.slow
        self.memory += other.memory
        self.seconds += other.seconds
        self.max_seconds = max(self.max_seconds, other.max_seconds)
        self.max_peak = max(self.max_peak, other.max_peak)
        self.sampled += other.sampled


def _where(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    frame = tb[-1] if tb else None
    return f"{frame.filename.rsplit('/', 2)[-1]}:{frame.lineno}" if frame else "?"


def fuzz_target(name: str, seed: int, start: int, count: int) -> TargetReport:
    """Run inputs ``start .. start+count-1`` of target ``name``."""
    target = TARGETS[name]
    report = TargetReport(name)
    seen: set[tuple[str, str]] = set()

    def note(index: int, kind: str, what: str, where: str, data: bytes) -> None:
        setattr(
            report,
            {"crash": "crashes"}.get(kind, kind),
            getattr(report, {"crash": "crashes"}.get(kind, kind)) + 1,
        )
        if (kind, where) not in seen:
            seen.add((kind, where))
            report.findings.append(Finding(name, index, kind, what, where, data))

    for index in range(start, start + count):
        data = one_input(name, seed, index)
        sample = index % MEMORY_SAMPLE == 0
        if sample:
            tracemalloc.start()
        began = time.perf_counter()
        try:
            result = target.decode(data)
        except StateStoreError as exc:
            report.refused[exc.code] = report.refused.get(exc.code, 0) + 1
        except Exception as exc:
            note(index, "crash", f"{type(exc).__name__}: {str(exc)[:160]}", _where(exc), data)
        else:
            report.accepted += 1
            try:
                target.check(result)
            except Exception as exc:
                what = f"accepted, but {type(exc).__name__}: {str(exc)[:160]}"
                note(index, "contract", what, _where(exc), data)
        took = time.perf_counter() - began
        if sample:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            report.sampled += 1
            report.max_peak = max(report.max_peak, peak)
            if peak > target.budget + 64 * len(data):
                note(index, "memory", f"peak {peak} bytes for {len(data)} in", name, data)
        else:
            report.seconds += took
            report.max_seconds = max(report.max_seconds, took)
            if took > SLOW:
                note(index, "slow", f"{took:.2f}s", name, data)
        report.inputs += 1
    return report
