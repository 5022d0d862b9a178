"""This build's version and the formats it speaks and keeps, each written once (pure).

- :data:`VERSION`: the package version (pyproject.toml reads it from here).
- :data:`WIRE_FORMAT`: what nodes of one ring must agree on to talk to each other: the
  internal request and answer signatures (core/identity.py), gossip, repair and relay bodies.
  Two builds with the same number may share a ring (docs/operations.md, "Versions and
  upgrades"). 1: the builds before formats were numbered; 2: requests signed over their
  destination and body digest, answers signed for the asker.
- :data:`DISK_FORMAT`: the layout of a data directory (node.json, ring-state.json, the LMDB
  keys and the encoded manifests). A data directory records the format it holds
  (``disk_format`` in node.json, from the first start); a node refuses to open one whose
  format is not in :data:`DISK_FORMATS_READ` (:func:`check_disk_format`). A data directory
  without the field was written before formats were recorded: format 1. 2: manifests and
  hints are stored sealed (a checksum of their bytes, node/replica.py); format 1's unsealed
  ones are still read, and a node that opens a format 1 dir records 2, so an older build
  refuses it. 3: stores' heads, floors, thinning lines and retention are sealed too (an
  older build would read a sealed floor as no number); the unsealed ones of formats 1 and 2
  are read as they are, and a node that opens such a dir records 3.
"""

from __future__ import annotations

from statestore.core.errors import UnknownDiskFormat

__all__ = [
    "CHUNK_FORMAT",
    "DISK_FORMAT",
    "DISK_FORMATS_READ",
    "VERSION",
    "WIRE_FORMAT",
    "check_disk_format",
]

VERSION = "0.3.0.dev0"
# The newest chunk layout this build reads and writes (core/chunk.py: 1 whole, 2 blocked,
# 3 blocked with a writer's whole snapshot named ``w``, core/manifest.Manifest.whole). Each
# node gossips it; writers use blocked chunks only once every member of the ring reads them
# (RingView.blocks), and ``w`` names once every member reads those (RingView.whole_names),
# so a ring being upgraded keeps working throughout.
CHUNK_FORMAT = 3
WIRE_FORMAT = 2
DISK_FORMAT = 3
DISK_FORMATS_READ = frozenset({1, 2, 3})  # the data directory formats this build opens


def check_disk_format(recorded: object, where: str, written_by: object = None) -> int:
    """The disk format a data directory records (``None``: not recorded, format 1), or
    :class:`UnknownDiskFormat` naming both builds' formats when this build cannot read it."""
    fmt = 1 if recorded is None else recorded
    if type(fmt) is int and fmt in DISK_FORMATS_READ:
        return fmt
    by = f" (last started by statestore {written_by})" if isinstance(written_by, str) else ""
    if type(fmt) is int and fmt > DISK_FORMAT:
        raise UnknownDiskFormat(
            f"data dir {where} holds disk format {fmt}{by}, newer than this build reads: "
            f"statestore {VERSION} reads disk formats "
            f"{', '.join(map(str, sorted(DISK_FORMATS_READ)))}. Run the newer statestore on "
            "it (a downgrade is not supported: docs/operations.md, Versions and upgrades), or "
            "give this node an empty --data-dir"
        )
    raise UnknownDiskFormat(
        f"data dir {where} records disk format {fmt!r}{by}, which statestore {VERSION} does "
        f"not know (it reads disk formats {', '.join(map(str, sorted(DISK_FORMATS_READ)))}): "
        "do not start a node on it; give it an empty --data-dir"
    )
