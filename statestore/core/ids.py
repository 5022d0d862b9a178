"""Names of things: stores, versions and chunks, validated before anything else touches them.

A store is one operator partition's state, ``StoreId(query, operator, partition, name)``.
Its path form ``query/operator/partition/name`` is used in URLs, storage keys and ring tokens,
so every part is checked here: letters, digits and ``._-`` only, no ``.``/``..``, bounded length.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property, lru_cache

from statestore.core.errors import InvalidStoreId

__all__ = [
    "MAX_EPOCH",
    "MAX_NAME_LEN",
    "MAX_VERSION",
    "StoreId",
    "check_chunk_name",
    "check_epoch",
    "check_version",
    "chunk_key",
    "parse_chunk_key",
    "parse_uint",
]

MAX_NAME_LEN = 128
MAX_PART = 2**31 - 1
MAX_VERSION = 2**62
MAX_EPOCH = 2**63 - 1  # what a Java long holds: the Spark provider reads epochs too
# Every pattern here is used with fullmatch: ``$`` would also match before a trailing newline,
# so "q1\n" would pass as a name (docs/security.md, Hardened endpoints).
_UINT = re.compile(r"[0-9]{1,19}")  # ASCII digits only: int("²") would be a 500
_NAME = re.compile(r"[A-Za-z0-9._-]+")
_CHUNK_NAME = re.compile(r"[dsw][0-9]{1,6}-[0-9a-f]{16}")


def _check_name(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidStoreId(f"store {field} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidStoreId(f"store {field} is empty: give a name of letters, digits or ._-")
    if len(value) > MAX_NAME_LEN:
        raise InvalidStoreId(
            f"store {field} is {len(value)} characters long: the limit is {MAX_NAME_LEN}"
        )
    if not _NAME.fullmatch(value) or value in (".", ".."):
        raise InvalidStoreId(
            f"store {field} {value!r} has characters that are not allowed: "
            "use only letters, digits, '.', '_' and '-' (and not '.' or '..' alone)"
        )
    return value


def _check_part(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidStoreId(f"store {field} must be an integer, got {value!r}")
    if not 0 <= value <= MAX_PART:
        raise InvalidStoreId(f"store {field} {value} is out of range: use 0..{MAX_PART}")
    return value


def check_version(version: object, *, allow_zero: bool = False) -> int:
    """Return ``version`` if it is a valid version number, else raise InvalidRequest."""
    from statestore.core.errors import InvalidRequest

    low = 0 if allow_zero else 1
    if isinstance(version, bool) or not isinstance(version, int):
        raise InvalidRequest(f"version must be an integer, got {version!r}")
    if not low <= version <= MAX_VERSION:
        raise InvalidRequest(f"version {version} is out of range: use {low}..{MAX_VERSION}")
    return version


def check_epoch(epoch: object) -> int:
    """Return ``epoch`` if it is a valid writer epoch (0..MAX_EPOCH), else raise
    InvalidRequest: an epoch past a Java long would lock every real writer out for good."""
    from statestore.core.errors import InvalidRequest

    if isinstance(epoch, bool) or not isinstance(epoch, int):
        raise InvalidRequest(f"epoch must be an integer, got {epoch!r:.40}")
    if not 0 <= epoch <= MAX_EPOCH:
        raise InvalidRequest(f"epoch {epoch} is out of range: use 0..{MAX_EPOCH}")
    return epoch


def parse_uint(text: str | None, what: str, limit: int) -> int:
    """A non-negative integer written in 1..19 ASCII digits and at most ``limit``; raises
    InvalidRequest naming ``what`` otherwise (unicode digits, signs, spaces included)."""
    from statestore.core.errors import InvalidRequest

    if text is None or not _UINT.fullmatch(text) or int(text) > limit:
        raise InvalidRequest(f"{what} {text!r:.40} must be an integer in 0..{limit}")
    return int(text)


@dataclass(frozen=True, order=True)
class StoreId:
    """One operator partition's state. Validated on construction."""

    query: str
    operator: int
    partition: int
    name: str = "default"

    def __post_init__(self) -> None:
        _check_name("query", self.query)
        _check_part("operator", self.operator)
        _check_part("partition", self.partition)
        _check_name("name", self.name)

    @cached_property  # in every storage key and URL: formatted once per StoreId
    def path(self) -> str:
        """``query/operator/partition/name``: safe in URLs and storage keys."""
        return f"{self.query}/{self.operator}/{self.partition}/{self.name}"

    def __str__(self) -> str:
        return self.path

    @classmethod
    def parse(cls, path: str) -> StoreId:
        """Parse ``QUERY/OPERATOR/PARTITION/NAME`` (NAME may be left out: ``default``)."""
        parts = path.split("/")
        if len(parts) == 3:
            parts.append("default")
        if len(parts) != 4:
            raise InvalidStoreId(
                f"store {path!r} is not QUERY/OPERATOR/PARTITION/NAME, e.g. q1/0/3/default"
            )
        query, operator, partition, name = parts
        if not _UINT.fullmatch(operator) or not _UINT.fullmatch(partition):
            raise InvalidStoreId(
                f"store {path!r}: operator and partition must be non-negative integers"
            )
        return cls(query, int(operator), int(partition), name)


def check_chunk_name(name: str) -> str:
    """Return ``name`` if it is a chunk's name (``d<seq>-<16 hex digits>``; ``s`` for a
    folded snapshot's, ``w`` for a whole one's), else raise InvalidStoreId."""
    if not _CHUNK_NAME.fullmatch(name):
        raise InvalidStoreId(f"chunk name {name!r:.40} is not [dsw]<seq>-<checksum>")
    return name


def chunk_key(store: StoreId, version: int, name: str) -> str:
    """The ring-wide key of one chunk: ``store/version/name``."""
    return f"{store.path}/{version}/{name}"


# a node parses the same few stores read after read (a lookup's blocks' chunk keys, a lookup
# channel's messages): the stores parsed last are kept (StoreId is immutable; a path that
# does not parse is not kept)
parsed_store = lru_cache(maxsize=1024)(StoreId.parse)


def parse_chunk_key(key: str) -> tuple[StoreId, int, str]:
    """Inverse of :func:`chunk_key`; raises InvalidStoreId for anything else."""
    parts = key.split("/")
    if len(parts) != 6 or not _UINT.fullmatch(parts[4]):
        raise InvalidStoreId(f"chunk key {key!r} is not STORE/VERSION/NAME")
    store = parsed_store("/".join(parts[:4]))
    check_name = parts[5]
    if not _CHUNK_NAME.fullmatch(check_name):
        raise InvalidStoreId(f"chunk name {check_name!r} is not [dsw]<seq>-<checksum>")
    return store, check_version(int(parts[4])), check_name
