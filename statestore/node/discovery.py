"""Discovery through a Kademlia DHT (the ``kademlia`` package, UDP).

The DHT is the node directory and the entry point, never the data path: it can stall for
seconds on dead peers, so every call here runs in a background task with a timeout and only
feeds addresses to the gossip loop (docs/design.md, Membership). Each node bootstraps from its
seeds' DHT ports (learned over HTTP from ``/v1/health``), then merges itself into the directory
value under ``statestore/directory`` (a JSON map id -> HTTP address, kept under the DHT's
~8 KB value size by dropping the entries it has heard least from).
"""

from __future__ import annotations

import asyncio
import json
import logging

from kademlia.network import Server

__all__ = ["DIRECTORY_KEY", "Discovery"]

log = logging.getLogger(__name__)
DIRECTORY_KEY = "statestore/directory"
MAX_VALUE = 7000


class Discovery:
    def __init__(self, node_id: str, host: str, http_address: str, timeout: float = 3.0) -> None:
        self.node_id = node_id
        self.host = host
        self.http_address = http_address
        self.timeout = timeout
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
        directory = await self.directory()
        directory[self.node_id] = self.http_address
        raw = json.dumps(directory, sort_keys=True)
        while len(raw) > MAX_VALUE and len(directory) > 1:
            directory.pop(next(k for k in directory if k != self.node_id))
            raw = json.dumps(directory, sort_keys=True)
        try:
            async with asyncio.timeout(self.timeout):
                await self.server.set(DIRECTORY_KEY, raw)
        except TimeoutError:
            log.warning("DHT announce timed out; will retry")
        return directory

    async def directory(self) -> dict[str, str]:
        try:
            async with asyncio.timeout(self.timeout):
                raw = await self.server.get(DIRECTORY_KEY)
        except TimeoutError:
            return {}
        if not isinstance(raw, str):
            return {}
        try:
            obj = json.loads(raw)
        except ValueError:
            return {}
        if not isinstance(obj, dict):
            return {}
        return {str(k): str(v) for k, v in obj.items()}

    def stop(self) -> None:
        self.server.stop()
