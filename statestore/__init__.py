"""statestore: a DHT-backed, replicated, versioned state store for stream processing.

The node daemon and the pure core it shares with the client SDK (``client``). See README.md.
"""

from statestore.core.errors import (
    CorruptChunk,
    DecompressionBomb,
    InvalidRequest,
    InvalidStoreId,
    MalformedData,
    NodeUnavailable,
    NotFound,
    PayloadTooLarge,
    QuorumNotReached,
    RequestTimeout,
    StaleEpoch,
    StateStoreError,
    StoreNotFound,
    Unavailable,
    VersionConflict,
    VersionNotFound,
)
from statestore.core.formats import VERSION
from statestore.core.ids import StoreId
from statestore.core.manifest import Head

__version__ = VERSION  # written once: statestore/core/formats.py

__all__ = [
    "CorruptChunk",
    "DecompressionBomb",
    "Head",
    "InvalidRequest",
    "InvalidStoreId",
    "MalformedData",
    "NodeUnavailable",
    "NotFound",
    "PayloadTooLarge",
    "QuorumNotReached",
    "RequestTimeout",
    "StaleEpoch",
    "StateStoreError",
    "StoreId",
    "StoreNotFound",
    "Unavailable",
    "VersionConflict",
    "VersionNotFound",
    "__version__",
]
