"""One exception tree for the node, the client and the CLI.

::

    StateStoreError                  every error this package raises
    ├── InvalidRequest               the caller sent something we refuse (HTTP 400/413)
    │   ├── InvalidStoreId           a malformed query / operator / partition / name
    │   ├── InvalidAddress           not HOST:PORT (also a ValueError)
    │   ├── PayloadTooLarge          a body or chunk over the configured limit
    │   ├── MalformedData            wire data that does not decode
    │   └── SlowRequest              a body that did not arrive in time (HTTP 408)
    ├── AccessDenied                 refused for who is asking, not for what was asked
    │   ├── Unauthenticated          no valid credential: token, node signature (HTTP 401)
    │   └── Forbidden                a valid token outside its queries or rights (HTTP 403)
    ├── NotFound                     (HTTP 404)
    │   ├── StoreNotFound            no version of that store exists
    │   └── VersionNotFound          that version is unknown or past retention
    ├── StaleEpoch                   a writer fenced by a newer epoch (HTTP 409)
    │   └── TentativeRolledBack      the writer's tentative commits were rolled back
    ├── VersionConflict              same version and epoch, different content (HTTP 409)
    ├── QueryDropping                a write while an admin's drop of the query runs (HTTP 409)
    ├── QuotaExceeded                a write that would take a query past its quota (HTTP 507)
    ├── CorruptChunk                 checksum mismatch or undecodable chunk
    │   └── DecompressionBomb        a zstd frame that would decompress past the limit
    ├── Unsupported                  a peer predates a route this build calls (its 404)
    ├── Unavailable                  availability, not semantics: retrying may help
    │   ├── NodeUnavailable          a node did not answer
    │   │   ├── TlsFailed            its TLS handshake or certificate did not verify
    │   │   └── UnprovenAnswer       its answer was not signed with the ring's secret
    │   ├── QuorumNotReached         fewer than W (or the read quorum) replicas answered
    │   ├── RateLimited              a client token over its rate (HTTP 429, Retry-After)
    │   ├── RequestTimeout           an operation ran past its deadline
    │   │   └── DelayBoundExceeded   a request's ``delay_bound=`` passed before it finished
    │   └── InsufficientStorage      a replica's disk is (nearly) full: read-only (HTTP 507)
    └── SetupError                   this machine is not set up to do it (never sent on the wire)
        ├── DataDirInUse             another node process holds the data dir
        ├── UnknownDiskFormat        the data dir holds a disk format this build cannot read
        └── SparkConnectorError      no javac, an unsupported pyspark, no seed answering

Semantic errors are final; ``Unavailable`` errors may go away when the ring heals. Every
message says what went wrong and what to do about it. Each class has an HTTP status and a
stable ``code`` so that the node can send it and the client can raise the same class again.
"""

from __future__ import annotations

__all__ = [
    "AccessDenied",
    "CorruptChunk",
    "DataDirInUse",
    "DecompressionBomb",
    "DelayBoundExceeded",
    "FloorWithinRetain",
    "Forbidden",
    "InsufficientStorage",
    "InvalidAddress",
    "InvalidRequest",
    "InvalidStoreId",
    "MalformedData",
    "NodeUnavailable",
    "NotFound",
    "PayloadTooLarge",
    "QueryDropping",
    "QuorumNotReached",
    "QuotaExceeded",
    "RateLimited",
    "RequestTimeout",
    "SetupError",
    "SlowRequest",
    "SparkConnectorError",
    "StaleEpoch",
    "StateStoreError",
    "StoreNotFound",
    "TentativeRolledBack",
    "TlsFailed",
    "Unauthenticated",
    "Unavailable",
    "UnknownDiskFormat",
    "UnprovenAnswer",
    "Unsupported",
    "VersionConflict",
    "VersionNotFound",
    "error_from_code",
]


class StateStoreError(Exception):
    """Base of every statestore error."""

    code = "error"
    status = 500


class InvalidRequest(StateStoreError):
    code = "invalid_request"
    status = 400


class FloorWithinRetain(InvalidRequest):
    """A retention floor a replica refuses: it would drop versions the store's writer keeps
    (its ``retain``, as that replica holds it)."""

    code = "floor_within_retain"


class InvalidStoreId(InvalidRequest):
    code = "invalid_store_id"


class InvalidAddress(InvalidRequest, ValueError):
    code = "invalid_address"


class PayloadTooLarge(InvalidRequest):
    code = "payload_too_large"
    status = 413


class MalformedData(InvalidRequest):
    code = "malformed_data"


class SlowRequest(InvalidRequest):
    code = "request_timeout"
    status = 408


class AccessDenied(StateStoreError):
    code = "access_denied"
    status = 403


class Unauthenticated(AccessDenied):
    code = "unauthenticated"
    status = 401


class Forbidden(AccessDenied):
    code = "forbidden"
    status = 403


class NotFound(StateStoreError):
    code = "not_found"
    status = 404


class StoreNotFound(NotFound):
    code = "store_not_found"


class VersionNotFound(NotFound):
    code = "version_not_found"
    # the version below the one asked for that a chain needs and no answer held (None: the
    # one asked for itself, or not said); set where a chain is resolved (core/manifest.py)
    gap: int | None = None


class StaleEpoch(StateStoreError):
    code = "stale_epoch"
    status = 409


class TentativeRolledBack(StaleEpoch):
    """A writer's tentative commits (acknowledged while it was cut off from a quorum) were
    rolled back after the heal: a writer with a higher epoch took over meanwhile. The
    message names the versions discarded and the version to replay from;
    ``ring.corrections(store)`` has them with the source positions (docs/client.md)."""

    code = "tentative_rolled_back"


class VersionConflict(StateStoreError):
    code = "version_conflict"
    status = 409


class QueryDropping(StateStoreError):
    """A write to a query while an admin's drop of it runs (between its purge and its seal)."""

    code = "query_dropping"
    status = 409


class QuotaExceeded(StateStoreError):
    """A write that would take a query's bytes on a node past the quota the operator set for
    it (``--quota-file``, core/quota.py). Final, not an Unavailable: retrying does not help
    until the query's old versions are collected, the query is dropped, or the quota raised.
    507 as WebDAV quotas (RFC 4331) answer; the code tells it from a full disk."""

    code = "quota_exceeded"
    status = 507


class CorruptChunk(StateStoreError):
    code = "corrupt_chunk"
    status = 422


class DecompressionBomb(CorruptChunk):
    code = "decompression_bomb"


class Unsupported(StateStoreError):
    """A peer that predates a route this build calls: it answered 404 for the route itself.
    Final for that peer, not an Unavailable: the caller falls back to the older way (the
    batched manifest copies of node/moves/copies.py to one copy at a time). Nodes raise it for
    each other; it is never sent on the wire."""

    code = "unsupported"
    status = 404


class Unavailable(StateStoreError):
    code = "unavailable"
    status = 503


class NodeUnavailable(Unavailable):
    code = "node_unavailable"


class TlsFailed(NodeUnavailable):
    """A node whose TLS could not be verified (wrong or missing CA, a certificate that does
    not name its address) or that does not speak TLS. To a node this peer is unreachable,
    like any other it cannot trust; a client raises it rather than "no node answered"."""

    code = "tls_failed"


class UnprovenAnswer(NodeUnavailable):
    """A peer's answer that a node asked to be proven (the cluster secret on) came without a
    valid answer signature: not a node of this ring, or one with another secret. To the node
    this peer did not answer: reads fail over to the other replicas, a quorum counts it out."""

    code = "unproven_answer"


class QuorumNotReached(Unavailable):
    code = "quorum_not_reached"


class RateLimited(Unavailable):
    """A client token over its request or byte rate (``--auth-file``); ``retry_after`` in
    seconds is also sent as a Retry-After header."""

    code = "rate_limited"
    status = 429

    def __init__(self, message: str = "", retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RequestTimeout(Unavailable):
    code = "timeout"
    status = 504


class DelayBoundExceeded(RequestTimeout):
    """A commit or restore given ``delay_bound=`` seconds did not finish within them
    (nothing is known about a commit's outcome: it may still land on some replicas)."""

    code = "delay_bound_exceeded"


class InsufficientStorage(Unavailable):
    code = "insufficient_storage"
    status = 507


class SetupError(StateStoreError):
    code = "setup_error"


class DataDirInUse(SetupError):
    code = "data_dir_in_use"


class UnknownDiskFormat(SetupError):
    code = "unknown_disk_format"


class SparkConnectorError(SetupError):
    code = "spark_connector_error"


def _tree(cls: type[StateStoreError]) -> list[type[StateStoreError]]:
    return [cls, *(c for sub in cls.__subclasses__() for c in _tree(sub))]


# The one list of error codes: every class of the tree, found by walking it.
_BY_CODE: dict[str, type[StateStoreError]] = {cls.code: cls for cls in _tree(StateStoreError)}


def error_from_code(code: str, message: str) -> StateStoreError:
    """Rebuild the error a node sent as ``{"error": {"code", "message"}}``."""
    return _BY_CODE.get(code, StateStoreError)(message)
