"""Rescaling a keyed Python operator from N to M partitions by key group (SEEP).

An operator that routes each key with :func:`partition_of` keeps in partition i exactly the
key groups :func:`groups_of` gives it. To go from N to M partitions at a batch boundary (every
old partition committed the same input), each new partition restores its key-group range from
all N old stores (``restore_many``, only the chunks holding those groups) and commits the
union as its own first version, a snapshot, under a new writer epoch; source positions carry
over (per source, the smallest of the old partitions'). The old stores are left as they are:
drop them once the new ones are committed.

::

    from client import RingClient, StoreId
    from client.rescale import partition_of, rescale

    old = [StoreId("q1", 0, p, "default") for p in range(4)]
    new = [StoreId("q1-v2", 0, p, "default") for p in range(7)]
    with RingClient(seeds) as ring:
        rescale(ring, old, new, epoch=2)
    # from now on route key k to partition_of(k, 7)
"""

from __future__ import annotations

from collections.abc import Sequence

from statestore.core.chunk import DEFAULT_KEY_GROUPS
from statestore.core.errors import InvalidRequest
from statestore.core.ids import StoreId
from statestore.core.keygroups import groups_of, merge_positions, partition_of

from ._core import CommitResult
from ._sync import RingClient

__all__ = ["groups_of", "partition_of", "rescale"]


def rescale(
    ring: RingClient,
    old: Sequence[StoreId | tuple[StoreId, int]],
    new: Sequence[StoreId],
    *,
    epoch: int,
    version: int = 1,
    groups: int = DEFAULT_KEY_GROUPS,
) -> list[CommitResult]:
    """Split the state of the ``old`` partitions (at their latest versions, or the versions
    given as ``(store, version)``) over the ``new`` ones by key group and commit each new
    partition's share as a snapshot at ``version`` with writer ``epoch``.

    Raises InvalidRequest when a new store is also an old one (it would be overwritten while
    it is read) or when there are more partitions than key groups; errors of the restores and
    commits as the client raises them (nothing is half-written: each new partition's commit is
    one snapshot, acknowledged at W or not at all).
    """
    old_ids = {o if isinstance(o, StoreId) else o[0] for o in old}
    if old_ids & set(new):
        raise InvalidRequest("rescale: the new stores must differ from the old ones")
    if not new or len(new) > groups:
        raise InvalidRequest(f"rescale: 1 to {groups} new partitions, got {len(new)}")
    results = []
    for i, sid in enumerate(new):
        parts = ring.restore_many(list(old), key_groups=groups_of(i, len(new), groups))
        state: dict[bytes, bytes] = {}
        for part in parts:
            state.update(part.data)  # each key lives in one old partition
        positions = merge_positions(p.positions for p in parts)
        results.append(
            ring.commit(
                sid,
                version=version,
                puts=state,
                deletes=[],
                positions=positions,
                epoch=epoch,
                snapshot=True,
            )
        )
    return results
