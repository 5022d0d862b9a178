"""Folding rows into state (pure): the one rule every restore path applies.

A chain is applied oldest first; within it a put replaces the key's value and a delete
removes the key. Rows may also arrive tagged with their chain position (a tree hop's folded
frames, docs/design.md, Recovery plans): then, per key, the row of the latest position wins, which
is the same rule applied out of order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping

__all__ = [
    "STATE_ROW_HELD",
    "TREE_ROW_HELD",
    "ChainFold",
    "Positioned",
    "Row",
    "apply",
    "fold_chain",
    "fold_held",
    "merge_positioned",
]

Row = tuple[bytes, bytes | None]  # (key, value); None is a delete
Positioned = tuple[bytes, int, bytes | None]  # (key, chain position, value)

# What a fold holds in Python a row, beyond the row's key and value bytes (CPython 3.11,
# tracemalloc): a dict of bytes keys and values ~118 bytes, a tree hop's (position, value)
# pairs ~175; with room for a delta's rows waiting in their lists and for what the answer
# builds from the state (a restore's key and value lists, a tree hop's sorted items).
STATE_ROW_HELD = 200
TREE_ROW_HELD = 300


def fold_held(chunks: Iterable[tuple[int, int]], per_row: int) -> int:
    """Bytes a fold of chunks given as (raw size, rows) holds at most: every row kept (a
    later row of a key replaces an earlier one, so this is an upper bound), ``per_row`` a
    row beyond its bytes (:data:`STATE_ROW_HELD` or :data:`TREE_ROW_HELD`)."""
    return sum(raw + rows * per_row for raw, rows in chunks)


def apply(state: MutableMapping[bytes, bytes], rows: Iterable[Row]) -> None:
    """Apply one chunk's rows in order: a put replaces, a delete removes."""
    latest = dict(rows)
    if None not in latest.values():  # puts only (the usual delta): one C-level update
        state.update(latest)  # type: ignore[arg-type]
        return
    for k, v in latest.items():
        if v is None:
            state.pop(k, None)
        else:
            state[k] = v


def merge_positioned(
    folded: MutableMapping[bytes, tuple[int, bytes | None]], rows: Iterable[Positioned]
) -> None:
    """Merge position-tagged rows into ``folded``: per key the latest position wins (a tie
    keeps the later arrival, which is the later row of the same chunk)."""
    for k, pos, v in rows:
        cur = folded.get(k)
        if cur is None or cur[0] <= pos:
            folded[k] = (pos, v)


class ChainFold:
    """Rows of one chain collected in any arrival order, applied in chain order.

    Chunks of the base (position 0, a snapshot or version 1) are applied as they arrive when
    they hold puts only; later positions wait until :meth:`result`, so that arrival order
    never changes the outcome.
    """

    def __init__(self) -> None:
        self.state: dict[bytes, bytes] = {}
        self.groups: dict[int, list[list[Row]]] = {}
        self.folded: list[list[Positioned]] = []

    def add_chunk(self, pos: int, rows: list[Row], puts_only: bool = False) -> None:
        if pos == 0 and puts_only and not self.folded:
            self.state.update(rows)  # type: ignore[arg-type]  # snapshots hold no deletes
        else:
            self.groups.setdefault(pos, []).append(rows)

    def add_folded(self, rows: list[Positioned]) -> None:
        self.folded.append(rows)

    def result(self) -> dict[bytes, bytes]:
        """The folded state. Call once, after every chunk was added."""
        if self.folded and not self.groups and not self.state:
            # everything came folded from one tree root: one row per key, already the latest
            return {k: v for rows in self.folded for k, _, v in rows if v is not None}
        for rows in self.folded:  # split folded rows back into positions, apply in order
            by_pos: dict[int, list[Row]] = {}
            for k, pos, v in rows:
                by_pos.setdefault(pos, []).append((k, v))
            for pos, r in by_pos.items():
                self.groups.setdefault(pos, []).append(r)
        for pos in sorted(self.groups):
            for chunk_rows in self.groups[pos]:
                apply(self.state, chunk_rows)
        return self.state


def fold_chain(chunks: Mapping[int, list[list[Row]]]) -> dict[bytes, bytes]:
    """The state after applying ``chunks`` (chain position to its chunks' rows) in order."""
    fold = ChainFold()
    for pos in sorted(chunks):
        for rows in chunks[pos]:
            fold.add_chunk(pos, rows)
    return fold.result()
