"""HTTP header names of the node API, in one place."""

from __future__ import annotations

__all__ = ["DROPS_HEADER", "EPOCH_HEADER", "FRAMES_CONTENT_TYPE"]

# The ring epoch of the answering node's view; clients refresh their view when it moves.
EPOCH_HEADER = "X-Statestore-Epoch"
# A streamed body of recovery frames (wire/frames.py).
FRAMES_CONTENT_TYPE = "application/x-statestore-frames"
# On a copy one node pushes to another: the sender's drop ids of the queries it carries,
# read before their data (node/tombstones.py, "Copies pushed across a drop").
DROPS_HEADER = "X-Statestore-Drops"
