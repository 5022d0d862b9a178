"""The JSON bodies of the node API, typed once (msgspec) and bounded on decode.

Every JSON body a node takes in, and every JSON acknowledgement a writer relies on, is decoded
here into a frozen struct: a wrong type, a missing field, a number out of range, a list past
its limit, bytes that are not UTF-8 or nesting past msgspec's depth guard is MalformedData
(HTTP 400) naming the body, never a 500. The bounds are the protocol's: versions and epochs
fit a Java ``long``, batches are as long as the node's batch limits allow. docs/api.md is the
written form of these types.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta

from statestore.core.errors import InvalidRequest, MalformedData
from statestore.core.ids import MAX_EPOCH, MAX_VERSION
from statestore.core.retention import MAX_RETAIN

__all__ = [
    "MAX_BATCH_KEYS",
    "MAX_BATCH_STORES",
    "MAX_COPIES",
    "MAX_COPIES_BYTES",
    "MAX_GOSSIP_MEMBERS",
    "MAX_HAVE_ITEMS",
    "MAX_LOOKUP_INDEX",
    "MAX_LOOKUP_INDEX_BYTES",
    "MAX_LOOKUP_KEYS",
    "MAX_LOOKUP_KEY_BYTES",
    "MAX_LOOKUP_KEY_HEX",
    "MAX_LOOKUP_PARTS",
    "MAX_LOOKUP_PATH",
    "ChainsRequest",
    "ChunkAck",
    "GcRequest",
    "GossipDigest",
    "GossipMember",
    "HandoverItemsRequest",
    "HaveRequest",
    "KeysRequest",
    "LookupPart",
    "LookupRequest",
    "ManifestAck",
    "ManifestCopiesAck",
    "ManifestsRequest",
    "PurgeRequest",
    "RemoveRequest",
    "RoomRequest",
    "StoresRequest",
    "TokensRequest",
    "decode_json",
    "decode_positions",
]

MAX_BATCH_KEYS = 10_000
MAX_BATCH_STORES = 1000
MAX_HAVE_ITEMS = 10_000  # a repair batch is 1,000: this bounds one request's work on the loop
MAX_GOSSIP_MEMBERS = 4096
MAX_POSITIONS_DEPTH = 32
# Ring epochs move by one per change of the live set and incarnations by one per restart;
# both stay far below 2**53 (what a JSON number holds exactly in every language).
MAX_RING_EPOCH = 2**53 - 1
MAX_INCARNATION = 2**31 - 1
MAX_HEARTBEAT = 2**53 - 1
MAX_VNODES = 4096  # a member's token count (core/view.MAX_VIEW_VNODES)
# manifests copied in one request between nodes (node/moves/copies.py): one writer job and one
# fsync on the target for all of them; a sender keeps a batch to MAX_COPIES_BYTES (a larger
# manifest goes alone, within the target's --max-body as a single copy is)
MAX_COPIES = 256
MAX_COPIES_BYTES = 8 << 20

T = TypeVar("T")
Str = Annotated[str, Meta(max_length=1000)]
Version = Annotated[int, Meta(ge=1, le=MAX_VERSION)]
Epoch = Annotated[int, Meta(ge=0, le=MAX_EPOCH)]


class GossipMember(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    id: Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+\Z")]
    address: Annotated[str, Meta(min_length=3, max_length=300)]
    incarnation: Annotated[int, Meta(ge=0, le=MAX_INCARNATION)]
    heartbeat: Annotated[int, Meta(ge=0, le=MAX_HEARTBEAT)]
    zone: Annotated[str, Meta(max_length=64)] = ""
    state: Annotated[str, Meta(pattern=r"^(joining|normal|leaving|left)\Z")] = "normal"
    # its token count (0: the ring's) and the count a rebalance moves it to (0: none)
    vnodes: Annotated[int, Meta(ge=0, le=MAX_VNODES)] = 0
    next_vnodes: Annotated[int, Meta(ge=0, le=MAX_VNODES)] = 0
    # a survivor wrote this dead member off (statestore removenode; core/membership.py)
    removal: Annotated[str, Meta(pattern=r"^(removing|removed)?\Z")] = ""
    removed_by: Annotated[str, Meta(max_length=64)] = ""
    # the newest chunk layout it reads (core/formats.CHUNK_FORMAT; 0.2 says nothing: 1)
    chunk_format: Annotated[int, Meta(ge=1, le=255)] = 1


class GossipDigest(msgspec.Struct, frozen=True):
    """``POST /v1/gossip`` body and answer."""

    members: Annotated[list[GossipMember], Meta(max_length=MAX_GOSSIP_MEMBERS)]
    epoch: Annotated[int, Meta(ge=0, le=MAX_RING_EPOCH)] = 0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out


class HaveRequest(msgspec.Struct, frozen=True):
    """``POST /v1/sync/have``: which of these chunks and manifests does the node hold."""

    chunks: Annotated[list[Str], Meta(max_length=MAX_HAVE_ITEMS)] = []
    # a version as an integer, or in ASCII digits as repair's item names carry it
    manifests: Annotated[list[tuple[Str, Version | Str, Str]], Meta(max_length=MAX_HAVE_ITEMS)] = []
    # (store, version, kind, epoch): held at that very epoch, replaced by a higher one or not
    # (core/manifest.py, "Lineage"); nodes that predate it ignore the field and answer none
    epochs: Annotated[list[tuple[Str, Version, Str, Epoch]], Meta(max_length=MAX_HAVE_ITEMS)] = []
    # the asker's content digest of each of ``epochs`` (core/repair.content_digest; 0: not
    # known): the answer's ``differ`` says where the node holds that epoch with other content
    digests: Annotated[
        list[Annotated[int, Meta(ge=0, le=2**63 - 1)]], Meta(max_length=MAX_HAVE_ITEMS)
    ] = []
    # the versions the asker's stores' writers asked to keep (retain=N), by store path: the
    # node takes one for a store the request names and it holds none of (a replica that
    # missed the writer's commits); nodes that predate it ignore the field
    retains: Annotated[
        dict[Str, Annotated[int, Meta(ge=1, le=MAX_RETAIN)]], Meta(max_length=MAX_HAVE_ITEMS)
    ] = {}


class KeysRequest(msgspec.Struct, frozen=True):
    """``POST /v1/chunks``."""

    keys: Annotated[list[Str], Meta(max_length=MAX_BATCH_KEYS)]


MAX_LOOKUP_KEYS = 1000  # keys in one POST .../lookup
# chunks one lookup may name: a key looks into one per version down to the newest snapshot
MAX_LOOKUP_PARTS = 256
# chunks one key of a lookup looks into (a longer chain down to its snapshot is read by parts)
MAX_LOOKUP_PATH = 64
# the keys of one lookup, together (its body stays under 1 MiB, aiohttp's mark for a body
# large enough to stall the event loop)
MAX_LOOKUP_KEY_BYTES = 256 * 1024
# one chunk's index a lookup reads (a 4 MiB chunk's is ~30-80 KiB), and its chunks' together
MAX_LOOKUP_INDEX = 4 * 1024 * 1024
MAX_LOOKUP_INDEX_BYTES = 16 * 1024 * 1024
MAX_LOOKUP_KEY_HEX = 2 * 64 * 1024  # a key of at most 64 KiB, in hex
U64 = Annotated[int, Meta(ge=0)]  # msgspec takes no bound past int64: checked where used
Group = Annotated[int, Meta(ge=0, le=65535)]


class LookupPart(msgspec.Struct, frozen=True, array_like=True):
    """One blocked chunk a lookup may read (core/chunk.py), as the reader's manifest names
    it: ``[version, name, lo, hi, size, index_len, index_checksum]``."""

    version: Version
    name: Annotated[str, Meta(pattern=r"^[dsw][0-9]{1,6}-[0-9a-f]{16}\Z")]  # core/ids
    lo: Group
    hi: Group
    size: Annotated[int, Meta(ge=2, le=2**40)]
    index_len: Annotated[int, Meta(ge=1, le=2**40)]
    index_checksum: U64


class LookupRequest(msgspec.Struct, frozen=True):
    """``POST .../lookup``: the values of ``keys`` (hex) in a pinned version of a store of
    ``groups`` key groups, read from ``parts``: the chunks along its chain down to the newest
    snapshot, newest version first, each version's chunks in group order."""

    groups: Annotated[int, Meta(ge=1, le=65536)]
    keys: Annotated[
        list[Annotated[str, Meta(max_length=MAX_LOOKUP_KEY_HEX)]],
        Meta(min_length=1, max_length=MAX_LOOKUP_KEYS),
    ]
    parts: Annotated[list[LookupPart], Meta(min_length=1, max_length=MAX_LOOKUP_PARTS)]


class StoresRequest(msgspec.Struct, frozen=True):
    """``POST /v1/heads``."""

    stores: Annotated[list[Str], Meta(max_length=MAX_BATCH_STORES)]


class ChainsRequest(msgspec.Struct, frozen=True):
    """``POST /v1/chains``."""

    stores: Annotated[list[tuple[Str, Version]], Meta(max_length=MAX_BATCH_STORES)]


class GcRequest(msgspec.Struct, frozen=True):
    """``POST .../gc``: a retention floor, a version (``true`` is not one), and/or a
    thinning line and its rung spacing (core/retention.Thinning), both or neither, with the
    line of the chunks (0: not raised) and the floor the line was drawn at."""

    floor: Version | None = None
    thin_below: Version | None = None
    thin_every: Version | None = None
    thin_chunks: Annotated[int, Meta(ge=0, le=MAX_VERSION)] = 0
    thin_floor: Annotated[int, Meta(ge=0, le=MAX_VERSION)] = 0


class PurgeRequest(msgspec.Struct, frozen=True):
    """``POST /v1/queries/{query}/purge`` (ring nodes): one phase of a drop."""

    id: Annotated[str, Meta(min_length=1, max_length=64)]
    at: Annotated[float, Meta(ge=0, le=1e11)]  # seconds since 1970 (up to the year 5138)
    phase: Literal["purge", "seal"]


class RoomRequest(msgspec.Struct, frozen=True):
    """``POST /v1/queries/{query}/room``: will a commit's writes to this node fit its query's
    quota? ``chunks``: the ``[key, bytes]`` of each chunk it would send here (those already
    held count nothing: a retried commit is not charged twice); ``bytes``: the rest (the
    manifest)."""

    chunks: Annotated[
        list[tuple[Str, Annotated[int, Meta(ge=0, le=1 << 40)]]], Meta(max_length=MAX_HAVE_ITEMS)
    ] = []
    bytes: Annotated[int, Meta(ge=0, le=1 << 40)] = 0


class HandoverItemsRequest(msgspec.Struct, frozen=True):
    """``POST /v1/handover/items``: a page (after the item ``after``, at most ``limit``) of
    what the answering node holds that the joining node ``node`` (in ``zone``) will own;
    ``limit`` 0 asks only which ring state the answering node sees for ``node``. ``vnodes``:
    the token count ``node`` will own (0: the ring's; a rebalance that grows it sends its
    next count)."""

    node: Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+\Z")]
    zone: Annotated[str, Meta(max_length=64)] = ""
    after: Str = ""
    limit: Annotated[int, Meta(ge=0, le=MAX_HAVE_ITEMS)] = 0
    vnodes: Annotated[int, Meta(ge=0, le=MAX_VNODES)] = 0


class RemoveRequest(msgspec.Struct, frozen=True):
    """``POST /v1/handover/remove`` and ``/v1/handover/remove/sweep``: the dead member
    ``node`` to remove for good (statestore removenode), or whose share to sweep;
    ``force``: remove it though other members are down (``--force``; a sweep ignores it)."""

    node: Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+\Z")]
    force: bool = False


class TokensRequest(msgspec.Struct, frozen=True):
    """``POST /v1/handover/tokens``: the token count the node is to own."""

    vnodes: Annotated[int, Meta(ge=1, le=MAX_VNODES)]


class ChunkAck(msgspec.Struct, frozen=True):
    """A replica's answer to ``PUT /v1/chunks/{key}``: the key it stored."""

    stored: Str


class ManifestsRequest(msgspec.Struct, frozen=True):
    """``POST /v1/sync/manifests/read``: the manifests to send, each at its epoch."""

    manifests: Annotated[
        list[tuple[Str, Version, Literal["delta", "snapshot"], Epoch]], Meta(max_length=MAX_COPIES)
    ]


class ManifestCopiesAck(msgspec.Struct, frozen=True):
    """The answer to ``POST /v1/sync/manifests``, one entry per manifest sent: true
    (stored), false (already held), null (refused: below the store's retention floor)."""

    stored: Annotated[list[bool | None], Meta(max_length=MAX_COPIES)]


class ManifestAck(msgspec.Struct, frozen=True):
    """A replica's answer to ``PUT /v1/manifests/...``: created (true) or already there."""

    stored: bool


# one decoder per body type, made on first use (a type's decoder is built once, not per body)
_DECODERS: dict[type, msgspec.json.Decoder[Any]] = {}


def decode_json(data: bytes, type_: type[T], what: str, shape: str = "") -> T:
    """``data`` as ``type_``; MalformedData naming ``what``, the first problem and the
    expected ``shape`` of the body."""
    decoder = _DECODERS.get(type_)
    if decoder is None:
        decoder = _DECODERS[type_] = msgspec.json.Decoder(type_)
    try:
        return decoder.decode(data)  # type: ignore[no-any-return]
    except msgspec.ValidationError as exc:
        if "length <=" in str(exc):
            raise InvalidRequest(
                f"{what}: a list is over its limit ({exc}); split it into several requests"
            ) from exc
        hint = f"the body must be {shape}" if shape else "see docs/api.md for the body"
        raise MalformedData(f"{what}: {exc}; {hint}") from exc
    except (msgspec.DecodeError, RecursionError, ValueError) as exc:
        raise MalformedData(f"{what}: the body is not JSON in UTF-8 ({exc})") from exc


def _depth(obj: Any, limit: int) -> bool:
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if d > limit:
            return False
        if isinstance(o, dict):
            stack.extend((v, d + 1) for v in o.values())
        elif isinstance(o, list):
            stack.extend((v, d + 1) for v in o)
    return True


def decode_positions(text: str | bytes, what: str) -> dict[str, Any]:
    """A positions object (a JSON object nested at most 32 deep); MalformedData otherwise."""
    data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    obj = decode_json(data, dict[str, Any], what, "a JSON object")
    if not _depth(obj, MAX_POSITIONS_DEPTH):
        raise MalformedData(f"{what} is nested more than {MAX_POSITIONS_DEPTH} levels deep")
    return obj
