"""A seeded mutator of wire inputs, for the fuzzer (testing/fuzz.py).

Two levels, both driven by one ``random.Random`` so that an input is reproduced by its seed:

- **bytes**: bit flips, interesting bytes (msgpack type markers, 0x00, 0xff), truncation,
  deletion, duplication and insertion of ranges, splicing with another valid encoding, and
  length-field inflation (a big-endian u16/u32 overwritten with a huge or off-by-one count);
- **values**: a decoded structure with one subtree replaced by a value of another type or
  range (huge and negative integers, floats, booleans, nil, long or odd strings, bytes, empty
  containers, deep nesting), re-encoded by the caller.

Plus the shapes no mutation of a small valid input reaches: nesting thousands deep and
containers that declare billions of elements.
"""

from __future__ import annotations

import random
import struct
from typing import Any

__all__ = ["Mutator", "deep_json", "deep_msgpack", "huge_msgpack"]

# msgpack markers that change what follows: nil, false, true, bin8/16/32, ext, float,
# uint64, int64, str8/16/32, array16/32, map16/32, the never-used 0xc1
_MSGPACK_MARKERS = bytes(
    [
        0xC0,
        0xC1,
        0xC2,
        0xC3,
        0xC4,
        0xC5,
        0xC6,
        0xC7,
        0xCB,
        0xCF,
        0xD3,
        0xD9,
        0xDA,
        0xDB,
        0xDC,
        0xDD,
        0xDE,
        0xDF,
        0x90,
        0x9F,
        0x80,
        0x8F,
        0xA0,
        0xBF,
        0xFF,
        0x00,
        0x7F,
        0x80,
    ]
)
_JSON_TOKENS = [
    b"{",
    b"}",
    b"[",
    b"]",
    b'"',
    b",",
    b":",
    b"null",
    b"true",
    b"-1",
    b"1e309",
    b"18446744073709551616",
    b"\\u0000",
    b"\\ud800",
    b"\xff",
    b"\xc3(",
    b"0.5",
]
_COUNTS = (0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 0x10000, 0x100000)
INTERESTING_INTS: tuple[int, ...] = (
    0,
    1,
    -1,
    2,
    127,
    128,
    255,
    65535,
    65536,
    2**31 - 1,
    2**31,
    2**32,
    2**53,
    2**62,
    2**62 + 1,
    2**63 - 1,
    2**63,
    2**64 - 1,
    -(2**63),
)


def deep_msgpack(depth: int, rng: random.Random) -> bytes:
    """A msgpack value nested ``depth`` deep (arrays or maps of one element)."""
    if rng.random() < 0.5:
        return b"\x91" * depth + b"\xc0"
    return b"\x81\xa1k" * depth + b"\xc0"


def huge_msgpack(rng: random.Random) -> bytes:
    """A container or string that declares far more than follows."""
    marker = rng.choice([b"\xdd", b"\xdf", b"\xdb", b"\xc6", b"\xdc", b"\xde"])
    width = 4 if marker in (b"\xdd", b"\xdf", b"\xdb", b"\xc6") else 2
    count = rng.choice((0xFFFFFFFF, 0x7FFFFFFF, 0x10000000)) if width == 4 else 0xFFFF
    return marker + count.to_bytes(width, "big") + rng.randbytes(rng.randrange(0, 64))


def deep_json(depth: int, rng: random.Random) -> bytes:
    """A JSON value nested ``depth`` deep."""
    if rng.random() < 0.5:
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


class Mutator:
    """Mutations drawn from ``rng``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    # -- bytes ---------------------------------------------------------------------------
    def mutate_bytes(
        self, data: bytes, corpus: list[bytes] | None = None, *, text: bool = False
    ) -> bytes:
        """``data`` with one to four byte-level mutations (``text``: JSON-aware tokens too)."""
        out = bytearray(data)
        for _ in range(self.rng.choice((1, 1, 1, 2, 2, 3, 4))):
            self._one(out, corpus or [], text)
        return bytes(out)

    def _one(self, out: bytearray, corpus: list[bytes], text: bool) -> None:
        rng = self.rng
        n = len(out)
        op = rng.randrange(11)
        if n == 0:
            op = 4
        if op == 0:  # bit flip
            i = rng.randrange(n)
            out[i] ^= 1 << rng.randrange(8)
        elif op == 1:  # an interesting byte
            out[rng.randrange(n)] = rng.choice(_MSGPACK_MARKERS)
        elif op == 2:  # truncate
            del out[rng.randrange(n) :]
        elif op == 3:  # delete a range
            i = rng.randrange(n)
            del out[i : i + rng.randrange(1, 17)]
        elif op == 4:  # insert random bytes or a token
            i = rng.randrange(n + 1)
            if text and rng.random() < 0.6:
                out[i:i] = rng.choice(_JSON_TOKENS)
            else:
                out[i:i] = rng.randbytes(rng.randrange(1, 9))
        elif op == 5:  # duplicate a range
            i = rng.randrange(n)
            piece = out[i : i + rng.randrange(1, 65)]
            j = rng.randrange(n + 1)
            out[j:j] = piece * rng.choice((1, 1, 2, 16))
        elif op == 6 and corpus:  # splice with another valid input
            other = rng.choice(corpus)
            i, j = rng.randrange(n + 1), rng.randrange(len(other) + 1)
            out[i:] = other[j:]
        elif op == 7:  # length-field inflation: a big-endian count overwritten
            width = rng.choice((1, 2, 4))
            if n >= width:
                i = rng.randrange(n - width + 1)
                count = rng.choice(_COUNTS) & ((1 << (8 * width)) - 1)
                out[i : i + width] = count.to_bytes(width, "big")
        elif op == 8:  # a byte nudged by one (off-by-one lengths)
            i = rng.randrange(n)
            out[i] = (out[i] + rng.choice((1, -1))) & 0xFF
        elif op == 9:  # overwrite with a u32 / i32 of an interesting value
            if n >= 4:
                i = rng.randrange(n - 3)
                v = rng.choice((-1, -2, 0, 1, 0x7FFFFFFF, -(2**31), n, n + 1, n * 2))
                out[i : i + 4] = struct.pack(">i", v)
        else:  # append garbage
            out += rng.randbytes(rng.randrange(1, 33))

    # -- values --------------------------------------------------------------------------
    def mutate_value(self, obj: Any, *, keep_types: bool = False) -> Any:
        """``obj`` (JSON- or msgpack-shaped) with one subtree replaced; ``keep_types``
        prefers a value of the same type out of its range (what typed decoders see most)."""
        paths = list(self._paths(obj, ()))
        path = self.rng.choice(paths)
        return self._replace(obj, path, keep_types)

    def _paths(self, obj: Any, at: tuple[Any, ...]) -> Any:
        yield at
        if len(at) > 12:
            return
        if isinstance(obj, dict):
            for k, v in obj.items():
                yield from self._paths(v, (*at, k))
        elif isinstance(obj, list | tuple):
            for i, v in enumerate(obj):
                yield from self._paths(v, (*at, i))

    def _replace(self, obj: Any, path: tuple[Any, ...], keep_types: bool) -> Any:
        if not path:
            return self._swap(obj, keep_types)
        head, rest = path[0], path[1:]
        rng = self.rng
        if isinstance(obj, dict):
            out = dict(obj)
            if not rest and rng.random() < 0.15:
                out.pop(head, None)  # a missing field
            elif not rest and rng.random() < 0.1:
                out[rng.choice(("zz", "", 7, b"k", "schema"))] = self.scalar()  # unknown field
            else:
                out[head] = self._replace(obj[head], rest, keep_types)
            return out
        items = list(obj)
        if not rest and rng.random() < 0.15:
            del items[head]
        elif not rest and rng.random() < 0.1:
            items.insert(head, self.scalar())
        else:
            items[head] = self._replace(items[head], rest, keep_types)
        return items

    def _swap(self, old: Any, keep_types: bool) -> Any:
        rng = self.rng
        if keep_types and rng.random() < 0.6:
            if type(old) is int:
                return rng.choice((*INTERESTING_INTS, old + 1, old - 1, -old))
            if isinstance(old, str):
                return rng.choice(("", "..", "a" * 2000, old + "/x", old * 3, "²", "\u0000"))
            if isinstance(old, list):
                return old * rng.choice((0, 2, 50)) if len(old) < 200 else []
            if isinstance(old, bytes):
                return rng.choice((b"", old * 2, rng.randbytes(16)))
        if rng.random() < 0.1:
            depth = rng.randrange(1, 200)
            v: Any = None
            for _ in range(depth):
                v = [v] if rng.random() < 0.5 else {"k": v}
            return v
        return self.scalar()

    def scalar(self) -> Any:
        """A value of a random type, often at an edge of its range."""
        rng = self.rng
        return rng.choice(
            (
                lambda: rng.choice(INTERESTING_INTS),
                lambda: rng.randrange(-(2**70), 2**70),
                lambda: rng.choice((0.0, -0.0, 1.5, 1e308, float("inf"), float("nan"))),
                lambda: rng.choice((True, False)),
                lambda: None,
                lambda: rng.choice(("", "x", "é", "²", "q/0/0/x", "a" * 300, "\ud800")),
                lambda: rng.randbytes(rng.randrange(0, 20)),
                lambda: [],
                lambda: {},
                lambda: [rng.choice(INTERESTING_INTS)] * rng.randrange(0, 8),
            )
        )()
