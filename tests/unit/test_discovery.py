"""The DHT directory's entries as a node reads them (node/discovery.py): with a cluster
secret only entries signed with it, whatever else anyone who reaches the UDP port wrote."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from statestore.node.discovery import DIRECTORY_KEY, SIGNED_DIRECTORY_KEY, Discovery, sign_entry

SECRET = b"0123456789abcdef0123456789abcdef"


def _read(d: Discovery, value: Any) -> dict[str, str]:
    asked: list[str] = []

    async def get(key: str) -> Any:  # what the DHT answers for the key
        asked.append(key)
        return value

    d.server.get = get  # type: ignore[method-assign]
    out = asyncio.run(d.directory())
    assert asked == [d.key]
    return out


def test_a_signed_directory_keeps_only_entries_signed_with_the_secret() -> None:
    d = Discovery("a1", "127.0.0.1", "127.0.0.1:1", secret=SECRET)
    assert d.key == SIGNED_DIRECTORY_KEY
    good = ["127.0.0.1:7400", sign_entry(SECRET, "b2", "127.0.0.1:7400")]
    value = {
        "b2": good,
        "c3": ["10.0.0.1:1", sign_entry(b"another secret of 32 bytes......", "c3", "10.0.0.1:1")],
        "d4": ["127.0.0.1:7400", good[1]],  # another id under b2's signature
        "e5": "127.0.0.1:7401",  # unsigned, as the build before wrote
        "f6": ["127.0.0.1:7402"],
        "g7": ["\udc80", "\udc80"],  # lone surrogates: not ASCII
        "h8": ["é", "é"],
        "i9": [1, 2],
        "j0": ["x" * 1000, "0" * 64],
    }
    assert _read(d, json.dumps(value)) == {"b2": "127.0.0.1:7400"}
    for junk in ("[", "[" * 5000, json.dumps([1, 2]), 7, None):
        assert _read(d, junk) == {}


def test_without_a_secret_the_directory_is_the_unsigned_one() -> None:
    d = Discovery("a1", "127.0.0.1", "127.0.0.1:1")
    assert d.key == DIRECTORY_KEY
    assert _read(d, json.dumps({"b2": "127.0.0.1:7400"})) == {"b2": "127.0.0.1:7400"}
