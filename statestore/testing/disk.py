"""A simulated disk under one node: the storage a node's ``Backend`` sees, with the faults a
real disk has (``statestore-sim --disk-faults``, docs/reliability.md).

:class:`Disk` keeps the bytes in a :class:`~statestore.node.backends.MemoryBackend` (the
platter) that outlives the node, and remembers for each write batch of the last
:data:`JOURNAL` simulated seconds what it replaced, so the schedule can make it:

- **lose** the batches acknowledged since a time (:meth:`Disk.lose`): a drive whose volatile
  cache acknowledged a flush it had not done loses the tail of what it was told at power
  loss. LMDB fsyncs every commit, so on an honest disk this never happens; the simulator
  makes the disk lie. A suffix of batches goes, each batch whole (a batch is one LMDB
  transaction: its pages land or not together).
- **tear** the last chunk or manifest written (:meth:`Disk.tear`): the value is left cut
  short, or with a garbage tail, as a sector write interrupted by power loss leaves it.
- **flip** bits in one stored chunk, manifest or store record (head, floor, thinning line,
  retention) at rest (:meth:`Disk.flip`): bit rot.
- **wipe** everything (:meth:`Disk.wipe`): a replaced or reformatted disk.

Only chunk (``c:``) and manifest (``m:``, ``o:``) values are torn, and those and the sealed
store records (``h:``, ``f:``, ``l:``, ``r:``, disk format 3) flipped: they are what the chunk
checksum and the seals check. Hints and verdicts are not (not modelled; docs/reliability.md).

Every fault is drawn from the caller's seeded generator, so a run replays exactly.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence

from statestore.node.backends import Backend, MemoryBackend

__all__ = ["JOURNAL", "Disk"]

JOURNAL = 5.0  # simulated seconds of write batches remembered (the most a fault loses)
_VALUES = (b"c:", b"m:", b"o:")  # chunk and manifest values: what tears
_ROTS = (*_VALUES, b"h:", b"f:", b"l:", b"r:")  # and the sealed store records: what rots


class Disk(Backend):
    """A node's storage with injectable faults; ``clock``: simulated time."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.platter = MemoryBackend()
        # (time, {key: the value it replaced, None: absent}) of each recent write batch
        self._journal: list[tuple[float, dict[bytes, bytes | None]]] = []
        self._last: bytes | None = None  # the last chunk or manifest key written

    # -- Backend ---------------------------------------------------------------------
    def get(self, key: bytes) -> bytes | None:
        return self.platter.get(key)

    def write(self, puts: Mapping[bytes, bytes], deletes: Sequence[bytes] = ()) -> None:
        now = self.clock()
        undo = {k: self.platter.get(k) for k in (*deletes, *puts)}
        self.platter.write(puts, deletes)
        self._journal.append((now, undo))
        while self._journal and self._journal[0][0] < now - JOURNAL:
            self._journal.pop(0)
        for k in puts:
            if k[:2] in _VALUES:
                self._last = k

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        return self.platter.scan(prefix)

    def scan_keys(self, prefix: bytes) -> list[bytes]:
        return self.platter.scan_keys(prefix)

    # -- faults ----------------------------------------------------------------------
    def lose(self, since: float) -> int:
        """Undo every batch written at or after ``since`` (newest first): they were
        acknowledged, never persisted. Returns how many batches were lost."""
        lost = 0
        while self._journal and self._journal[-1][0] >= since:
            _, undo = self._journal.pop()
            self.platter.write(
                {k: v for k, v in undo.items() if v is not None},
                [k for k, v in undo.items() if v is None],
            )
            lost += 1
        self._last = next(
            (
                k
                for _, undo in reversed(self._journal)
                for k in undo
                if k[:2] in _VALUES and self.platter.get(k) is not None
            ),
            None,
        )
        return lost

    def tear(self, rng: random.Random) -> bytes | None:
        """Leave the last chunk or manifest written (of those still held, after a loss:
        within the journal) cut short or with a garbage tail; returns its key (None:
        nothing written, or it is gone)."""
        key = self._last
        value = None if key is None else self.platter.get(key)
        if key is None or not value:
            return None
        keep = rng.randrange(0, len(value))  # at least one byte short of the whole value
        tail = rng.randbytes(rng.randint(1, 64)) if rng.random() < 0.5 else b""
        self.platter.write({key: value[:keep] + tail})
        return key

    def flip(self, rng: random.Random) -> bytes | None:
        """Flip one to three bits of one stored chunk, manifest or store record; returns its
        key (None: the disk holds none)."""
        keys = [k for prefix in _ROTS for k in self.platter.scan_keys(prefix)]
        if not keys:
            return None
        key = rng.choice(keys)
        value = bytearray(self.platter.get(key) or b"")
        if not value:
            return None
        for at in rng.sample(range(len(value) * 8), min(len(value) * 8, rng.randint(1, 3))):
            value[at // 8] ^= 1 << (at % 8)
        self.platter.write({key: bytes(value)})
        return key

    def wipe(self) -> None:
        """Everything gone, as on a new disk."""
        self.platter = MemoryBackend()
        self._journal.clear()
        self._last = None
