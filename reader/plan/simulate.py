"""What a rank yields in an epoch, computed from the plan alone (no I/O): the samples of each
batch in DataLoader order, as the dataset's workers make them. For the invariant tests over
grids, the bench's shuffle-quality figure, and anyone checking a plan before a long run."""

from __future__ import annotations

from collections.abc import Sequence

from shardify.reader.plan.assign import Range, plan_worker, resumed_role, sequence_starts
from shardify.reader.plan.blocks import BlockSequence
from shardify.reader.plan.resume import PlanOptions, share_order

__all__ = ["Entry", "rank_batches"]

Entry = tuple[int, int, bool]
"""``(shard, index, valid)``: a sample of a batch; ``valid`` is False for a padding repeat."""


def rank_batches(
    sequence: Sequence[Range] | BlockSequence,
    opts: PlanOptions,
    *,
    epoch: int,
    rank: int,
    world: int,
    workers: int,
    consumed: int = 0,
    segment: int = 0,
) -> list[list[Entry]]:
    """Rank ``rank``'s batches of ``sequence`` after the first ``consumed``, in the order it yields them.

    DataLoader worker ``w`` plays plan worker ``(w + consumed) % workers`` (see ``resumed_role``)
    and DataLoader takes one batch of each worker in turn, passing over those that are done.
    """
    queues: list[list[list[Entry]]] = []
    starts = sequence_starts(sequence)
    for w in range(workers):
        role, skip = resumed_role(w, workers=workers, consumed=consumed)
        plan = plan_worker(
            sequence,
            rank=rank,
            world=world,
            worker=role,
            workers=workers,
            batch_size=opts.batch_size,
            drop_last=opts.drop_last,
            starts=starts,
        )
        samples, repeats = plan.samples(), plan.repeats()
        _, out = share_order(plan, opts, epoch=epoch, rank=rank, worker=role, segment=segment)
        batches, at = [], 0
        for size in plan.batch_sizes():
            batches.append([(*samples[p], p not in repeats) for p in out[at : at + size]])
            at += size
        queues.append(batches[skip:])
    got: list[list[Entry]] = []
    step = 0
    while any(step < len(q) for q in queues):
        got.extend(q[step] for q in queues if step < len(q))
        step += 1
    return got
