"""The DHT directory as a node reads and writes it (node/discovery.py): with a cluster secret
only entries signed with it, within their time, whatever else anyone who reaches the UDP port
wrote; a read that fails writes nothing back."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from statestore.node.discovery import (
    DIRECTORY_KEY,
    ENTRY_TTL,
    SIGNED_DIRECTORY_KEY,
    Discovery,
    sign_entry,
)

SECRET = b"0123456789abcdef0123456789abcdef"
NOW = 1_800_000_000


class FakeDht:
    """What the kademlia package answers: ``value``, or an exception a peer's malformed
    answer makes it raise; the values set."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.set: list[tuple[str, str]] = []

    async def get(self, key: str) -> Any:
        if isinstance(self.value, BaseException):
            raise self.value
        return self.value

    async def put(self, key: str, value: str) -> bool:
        self.set.append((key, value))
        return True


def _discovery(value: Any, secret: bytes | None = SECRET) -> tuple[Discovery, FakeDht]:
    d = Discovery("a1", "127.0.0.1", "127.0.0.1:1", secret=secret, clock=lambda: NOW)
    fake = FakeDht(value)
    d.server.get = fake.get  # type: ignore[method-assign]
    d.server.set = fake.put  # type: ignore[method-assign]
    d.server.bootstrappable_neighbors = lambda: [("127.0.0.1", 1)]  # type: ignore[method-assign]
    return d, fake


def _entry(node: str, address: str, at: int = NOW, secret: bytes = SECRET) -> list[Any]:
    return [address, at, sign_entry(secret, node, address, at)]


def test_a_signed_directory_keeps_only_entries_signed_with_the_secret_in_their_time() -> None:
    good = _entry("b2", "127.0.0.1:7400")
    value = {
        "b2": good,
        "c3": _entry("c3", "10.0.0.1:1", secret=b"another secret of 32 bytes......"),
        "d4": ["127.0.0.1:7400", NOW, good[2]],  # another id under b2's signature
        "e5": "127.0.0.1:7401",  # unsigned, as the build before wrote
        "f6": _entry("f6", "127.0.0.1:7402", at=NOW - ENTRY_TTL - 1),  # too old: retired
        "abc": ["\udc80", NOW, "\udc80"],  # lone surrogates
        "abd": ["é", NOW, "é"],
        "abe": [1, 2, 3],
        "abf": _entry("abf", "x" * 1000),
        "abg": ["127.0.0.1:7403", True, "0" * 32],
        "not-hex": _entry("not-hex", "127.0.0.1:7404"),
        "ab1": _entry("ab1", "127.0.0.1:7405\n"),  # a newline in the address
    }
    d, fake = _discovery(json.dumps(value))
    assert d.key == SIGNED_DIRECTORY_KEY
    assert asyncio.run(d.directory()) == {"b2": "127.0.0.1:7400"}
    for junk in ("[", "[" * 5000, json.dumps([1, 2]), 7, None):
        fake.value = junk
        assert asyncio.run(d.directory()) == {}
    # an announce writes back what holds, and its own entry signed now
    fake.value = json.dumps(value)
    assert asyncio.run(d.announce()) == {"b2": "127.0.0.1:7400", "a1": "127.0.0.1:1"}
    ((key, raw),) = fake.set
    assert key == SIGNED_DIRECTORY_KEY
    assert json.loads(raw) == {"b2": good, "a1": _entry("a1", "127.0.0.1:1")}


def test_a_read_that_fails_writes_nothing_back() -> None:
    """A timeout, or an exception the kademlia package raises on a peer's malformed answer
    (anyone who reaches the UDP port is a peer): the discovery loop goes on, and the
    directory is not overwritten with this node's entry alone (the build before let the
    exception out of the loop, and wrote its entry alone after a timeout)."""
    for failure in (TypeError("'list' object is not a mapping"), KeyError("value")):
        d, fake = _discovery(failure)
        assert asyncio.run(d.announce()) == {}
        assert fake.set == []
    d, fake = _discovery(None)  # no value yet: this node's entry starts it
    assert asyncio.run(d.announce()) == {"a1": "127.0.0.1:1"}
    assert len(fake.set) == 1


def test_without_a_secret_the_directory_is_the_unsigned_one() -> None:
    d, fake = _discovery(json.dumps({"b2": "127.0.0.1:7400"}), secret=None)
    assert d.key == DIRECTORY_KEY
    assert asyncio.run(d.directory()) == {"b2": "127.0.0.1:7400"}
    assert asyncio.run(d.announce()) == {"b2": "127.0.0.1:7400", "a1": "127.0.0.1:1"}
    assert json.loads(fake.set[0][1]) == {"a1": "127.0.0.1:1", "b2": "127.0.0.1:7400"}
