"""HTTP header names of the node API, in one place."""

from __future__ import annotations

__all__ = ["EPOCH_HEADER", "FRAMES_CONTENT_TYPE"]

# The ring epoch of the answering node's view; clients refresh their view when it moves.
EPOCH_HEADER = "X-Statestore-Epoch"
# A streamed body of recovery frames (wire/frames.py).
FRAMES_CONTENT_TYPE = "application/x-statestore-frames"
