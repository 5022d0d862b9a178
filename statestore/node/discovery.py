"""Discovery through a Kademlia DHT (the ``kademlia`` package, UDP).

The DHT is the node directory and the entry point, never the data path: it can stall for
seconds on dead peers, so every call here runs in a background task with a timeout and only
feeds addresses to the gossip loop (docs/design.md, Membership). Each node bootstraps from its
seeds' DHT ports (learned over HTTP from ``/v1/health``), then merges itself into the directory
value under ``statestore/directory`` (a JSON map id -> HTTP address, kept under the DHT's
~8 KB value size by dropping the entries it has heard least from).

Anyone who reaches the DHT's UDP port can write that value. With node identity on (a cluster
secret) the directory is ``statestore/directory/signed`` instead, a JSON map id -> [address,
signature]: each node signs its own entry (HMAC-SHA256 under the secret of the id and the
address) and keeps, reads and writes back only entries whose signature holds, so an entry
written by anyone without the secret never becomes a gossip target.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
from typing import Any

from kademlia.network import Server

__all__ = ["DIRECTORY_KEY", "SIGNED_DIRECTORY_KEY", "Discovery", "sign_entry"]

log = logging.getLogger(__name__)
DIRECTORY_KEY = "statestore/directory"
SIGNED_DIRECTORY_KEY = "statestore/directory/signed"
MAX_VALUE = 7000


def sign_entry(secret: bytes, node_id: str, address: str) -> str:
    """The signature of a node's directory entry: hex HMAC-SHA256 under the ring's secret."""
    text = f"statestore dht entry\n{node_id}\n{address}".encode()
    return hmac.new(secret, text, hashlib.sha256).hexdigest()


class Discovery:
    """``secret``: the ring's cluster secret (node identity): the directory is signed."""

    def __init__(
        self,
        node_id: str,
        host: str,
        http_address: str,
        timeout: float = 3.0,
        secret: bytes | None = None,
    ) -> None:
        self.node_id = node_id
        self.host = host
        self.http_address = http_address
        self.timeout = timeout
        self.secret = secret
        self.key = DIRECTORY_KEY if secret is None else SIGNED_DIRECTORY_KEY
        self.server = Server(node_id=bytes.fromhex(node_id.ljust(40, "0"))[:20])
        self.port = 0

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

    def has_neighbors(self) -> bool:
        """Whether the DHT knows another node (it knows none before a bootstrap answers)."""
        return bool(self.server.bootstrappable_neighbors())

    async def announce(self) -> dict[str, str]:
        """Merge ourselves into the directory; returns the directory as read (empty while
        the DHT knows no other node: there is no one to read it from or store it on, and
        the kademlia package would warn so every round)."""
        if not self.has_neighbors():
            return {}
        entries = await self._entries()
        mine: Any = self.http_address
        if self.secret is not None:
            mine = [self.http_address, sign_entry(self.secret, self.node_id, self.http_address)]
        entries[self.node_id] = mine
        raw = json.dumps(entries, sort_keys=True)
        while len(raw) > MAX_VALUE and len(entries) > 1:
            entries.pop(next(k for k in entries if k != self.node_id))
            raw = json.dumps(entries, sort_keys=True)
        try:
            async with asyncio.timeout(self.timeout):
                await self.server.set(self.key, raw)
        except TimeoutError:
            log.warning("DHT announce timed out; will retry")
        return {i: _address(e) for i, e in entries.items()}

    async def directory(self) -> dict[str, str]:
        """The directory as read: id -> HTTP address (with a secret, signed entries only)."""
        return {i: _address(e) for i, e in (await self._entries()).items()}

    async def _entries(self) -> dict[str, Any]:
        """The directory's entries as stored, those of the wrong form or signature left
        out."""
        try:
            async with asyncio.timeout(self.timeout):
                raw = await self.server.get(self.key)
        except TimeoutError:
            return {}
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
        out: dict[str, Any] = {}
        for k, v in obj.items():
            if (
                isinstance(v, list)
                and len(v) == 2
                and all(isinstance(x, str) and x.isascii() and len(x) <= 300 for x in (k, *v))
                and hmac.compare_digest(v[1], sign_entry(self.secret, k, v[0]))
            ):
                out[k] = [v[0], v[1]]
        return out

    def stop(self) -> None:
        self.server.stop()


def _address(entry: Any) -> str:
    return entry[0] if isinstance(entry, list) else str(entry)
