"""Discovery through a Kademlia DHT (the ``kademlia`` package, UDP).

The DHT is the node directory and the entry point, never the data path: it can stall for
seconds on dead peers, so every call here runs in a background task with a timeout and only
feeds addresses to the gossip loop (docs/design.md, Membership). Each node bootstraps from its
seeds' DHT ports (learned over HTTP from ``/v1/health``), then merges itself into the directory
value under ``statestore/directory`` (a JSON map id -> HTTP address, kept under the DHT's
~8 KB value size by dropping entries: the oldest signed first, unsigned ones by id). Each node
reads, merges and writes the whole value every 5-7 s (jittered: rounds in step lose each
other's entries), so an entry can be missing for a round; gossip carries the rest.

Anyone who reaches the DHT's UDP port can write that value. With node identity on (a cluster
secret) the directory is ``statestore/directory/signed`` instead, a JSON map id -> [address,
signed at, signature]: each node signs its own entry every round (HMAC-SHA256 under the
secret of the id, the address and the time, truncated to 128 bits) and keeps, reads and
writes back only entries whose signature holds and which were signed within
:data:`ENTRY_TTL` (a retired node's address, or an old entry replayed, drops out), the oldest
dropped first when the value is full. An entry written by anyone without the secret never
becomes a gossip target.

A read that fails (a timeout, or a peer's malformed answer the kademlia package raises on:
any node that reaches the UDP port is in its routing table) writes nothing back: a lost reply
must not overwrite the directory with this node's entry alone.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
import time
from typing import Any

from kademlia.network import Server

__all__ = ["DIRECTORY_KEY", "ENTRY_TTL", "SIGNED_DIRECTORY_KEY", "Discovery", "sign_entry"]

log = logging.getLogger(__name__)
DIRECTORY_KEY = "statestore/directory"
SIGNED_DIRECTORY_KEY = "statestore/directory/signed"
MAX_VALUE = 7000
ENTRY_TTL = 600  # seconds a signed entry stays in the directory (its node re-signs it each round)
_ID = re.compile(r"[0-9a-f]{1,40}")
_ADDRESS = re.compile(r"[!-~]{1,300}")  # printable ASCII, no space or newline


def sign_entry(secret: bytes, node_id: str, address: str, at: int) -> str:
    """The signature of a node's directory entry: HMAC-SHA256 under the ring's secret of the
    id, the address and the time it was signed (a JSON array: no two entries sign the same
    text), hex, 128 bits."""
    text = json.dumps(["statestore dht entry", node_id, address, at]).encode()
    return hmac.new(secret, text, hashlib.sha256).hexdigest()[:32]


class Discovery:
    """``secret``: the ring's cluster secret (node identity): the directory is signed.
    ``clock``: seconds since 1970 (signed entries carry it)."""

    def __init__(
        self,
        node_id: str,
        host: str,
        http_address: str,
        timeout: float = 3.0,
        secret: bytes | None = None,
        clock: Any = time.time,
    ) -> None:
        self.node_id = node_id
        self.host = host
        self.http_address = http_address
        self.timeout = timeout
        self.secret = secret
        self.clock = clock
        self.key = DIRECTORY_KEY if secret is None else SIGNED_DIRECTORY_KEY
        self.server = Server(node_id=bytes.fromhex(node_id.ljust(40, "0"))[:20])
        self.port = 0
        self._warned = 0.0

    async def listen(self, port: int) -> int:
        """Bind the DHT's UDP socket; returns the bound port."""
        await self.server.listen(port, interface=self.host)
        sock = self.server.transport.get_extra_info("sockname")
        self.port = int(sock[1])
        return self.port

    async def bootstrap(self, dht_seeds: list[tuple[str, int]]) -> None:
        if not dht_seeds:
            return
        try:
            async with asyncio.timeout(self.timeout):
                await self.server.bootstrap(dht_seeds)
        except TimeoutError:
            log.warning("DHT bootstrap from %s timed out; gossip goes on", dht_seeds)
        except Exception as exc:  # a peer's malformed answer (the DHT is anyone's)
            self._failed("bootstrap", exc)

    def has_neighbors(self) -> bool:
        """Whether the DHT knows another node (it knows none before a bootstrap answers)."""
        return bool(self.server.bootstrappable_neighbors())

    async def announce(self) -> dict[str, str]:
        """Merge ourselves into the directory; returns the directory as read (empty while
        the DHT knows no other node: there is no one to read it from or store it on, and
        the kademlia package would warn so every round; empty, and nothing written, when
        the read failed)."""
        if not self.has_neighbors():
            return {}
        entries = await self._entries()
        if entries is None:
            return {}
        mine: Any = self.http_address
        if self.secret is not None:
            at = int(self.clock())
            sig = sign_entry(self.secret, self.node_id, self.http_address, at)
            mine = [self.http_address, at, sig]
        entries[self.node_id] = mine
        raw = json.dumps(entries, sort_keys=True)
        while len(raw) > MAX_VALUE and len(entries) > 1:
            entries.pop(min((k for k in entries if k != self.node_id), key=_age(entries)))
            raw = json.dumps(entries, sort_keys=True)
        try:
            async with asyncio.timeout(self.timeout):
                await self.server.set(self.key, raw)
        except TimeoutError:
            log.warning("DHT announce timed out; will retry")
        except Exception as exc:
            self._failed("announce", exc)
        return {i: _address(e) for i, e in entries.items()}

    async def directory(self) -> dict[str, str]:
        """The directory as read: id -> HTTP address (with a secret, signed entries only)."""
        return {i: _address(e) for i, e in (await self._entries() or {}).items()}

    async def _entries(self) -> dict[str, Any] | None:
        """The directory's entries as stored, those of the wrong form, signature or age left
        out ({} for no value or one that does not parse); None when the read failed."""
        try:
            async with asyncio.timeout(self.timeout):
                raw = await self.server.get(self.key)
        except TimeoutError:
            return None
        except Exception as exc:
            self._failed("read", exc)
            return None
        if not isinstance(raw, str):
            return {}
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):
            return {}
        if not isinstance(obj, dict):
            return {}
        if self.secret is None:
            return {str(k): str(v) for k, v in obj.items()}
        now = self.clock()
        out: dict[str, Any] = {}
        for k, v in obj.items():
            if (
                isinstance(v, list)
                and len(v) == 3
                and _ID.fullmatch(k)
                and isinstance(v[0], str)
                and _ADDRESS.fullmatch(v[0])
                and type(v[1]) is int
                and abs(now - v[1]) <= ENTRY_TTL
                and isinstance(v[2], str)
                and v[2].isascii()
                and hmac.compare_digest(v[2], sign_entry(self.secret, k, v[0], v[1]))
            ):
                out[k] = [v[0], v[1], v[2]]
        return out

    def _failed(self, what: str, exc: Exception) -> None:
        """Log a DHT call that raised, once a minute at most (it may be anyone's doing)."""
        now = time.monotonic()
        if now - self._warned >= 60.0:
            self._warned = now
            log.warning("DHT %s failed (%s: %s); gossip goes on", what, type(exc).__name__, exc)

    def stop(self) -> None:
        self.server.stop()


def _address(entry: Any) -> str:
    return entry[0] if isinstance(entry, list) else str(entry)


def _age(entries: dict[str, Any]) -> Any:
    """Sort key of the entries to drop first: the oldest signed (unsigned ones: by id)."""
    return lambda k: (entries[k][1], k) if isinstance(entries[k], list) else (0, k)
