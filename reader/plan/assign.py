"""Which samples of which shards each (rank, worker) reads in an epoch: a pure function.

For an epoch the shards are put in a seeded order and their samples laid end to end as one
virtual sequence of ``N`` samples. Rank ``r`` takes the contiguous slice
``[r * per_rank, (r + 1) * per_rank)`` of it, where ``per_rank`` is ``N // world`` with
``drop_last`` (the few left over are dropped) and ``ceil(N / world)`` without (the slice runs
past the end and wraps to the start, repeating a few samples, like DistributedSampler).
The rank cuts its slice into batches of ``batch_size`` (``drop_last`` drops the last partial
batch, identically on every rank) and deals whole batches to its workers round-robin: batch
``b`` goes to worker ``b % workers``. DataLoader fetches from its workers round-robin too, so
it yields the rank's batches in order, and every rank yields the same number of batches. A
worker with no batch yields nothing. Slices and batches cut through shards freely: a worker
reads a range ``[start, stop)`` of a shard by seeking over the samples before it.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from shardify.reader.plan.shuffle import shard_order

__all__ = [
    "Range",
    "WorkerPlan",
    "samples_per_rank",
    "batches_per_rank",
    "worker_batches",
    "consumed_by_worker",
    "resumed_role",
    "plan_worker",
]

Range = tuple[int, int, int]
"""``(shard, start, stop)``: samples ``start..stop-1`` of shard ``shard`` (its index in the source)."""


def _check(total: int, world: int, batch_size: int) -> None:
    if total < 0:
        raise ValueError(f"{total=} should be >= 0")
    if world < 1:
        raise ValueError(f"{world=} should be >= 1")
    if batch_size < 1:
        raise ValueError(f"{batch_size=} should be >= 1")


def samples_per_rank(total: int, *, world: int, drop_last: bool) -> int:
    """Samples in each rank's slice: ``total // world`` with ``drop_last``, else rounded up."""
    _check(total, world, 1)
    if total == 0:
        return 0
    return total // world if drop_last else -(-total // world)


def batches_per_rank(total: int, *, world: int, batch_size: int, drop_last: bool) -> int:
    """Batches every rank yields per epoch (``len()`` of the dataset)."""
    _check(total, world, batch_size)
    per = samples_per_rank(total, world=world, drop_last=drop_last)
    return per // batch_size if drop_last else -(-per // batch_size)


def worker_batches(num_batches: int, *, worker: int, workers: int) -> int:
    """How many of a rank's ``num_batches`` batches worker ``worker`` of ``workers`` gets."""
    return max(0, -(-(num_batches - worker) // workers))


def consumed_by_worker(consumed: int, *, worker: int, workers: int) -> int:
    """Of the first ``consumed`` batches of a rank, how many came from worker ``worker``."""
    return worker_batches(consumed, worker=worker, workers=workers)


def resumed_role(worker: int, *, workers: int, consumed: int) -> tuple[int, int]:
    """``(plan worker, batches to skip)`` for DataLoader worker ``worker`` resuming after ``consumed``.

    DataLoader's round-robin starts at worker 0, and the next batch due belongs to plan
    worker ``consumed % workers``: so worker ``w`` plays plan worker ``(w + consumed) % workers``
    and skips the batches of it that the trainer already had.
    """
    role = (worker + consumed) % workers
    return role, consumed_by_worker(consumed, worker=role, workers=workers)


@dataclass(frozen=True)
class WorkerPlan:
    """A worker's share of an epoch: shard ranges in order, cut into batches of ``batch_size``.

    All batches are full except possibly the last one (only when ``drop_last`` is off).
    """

    ranges: tuple[Range, ...]
    batch_size: int

    @property
    def num_samples(self) -> int:
        return sum(stop - start for _, start, stop in self.ranges)

    @property
    def num_batches(self) -> int:
        return -(-self.num_samples // self.batch_size)

    def batch_sizes(self) -> list[int]:
        """Size of each batch, in order."""
        n, b = self.num_samples, self.batch_size
        sizes = [b] * (n // b)
        if n % b:
            sizes.append(n % b)
        return sizes

    def samples(self) -> list[tuple[int, int]]:
        """Every ``(shard, index)`` of the share, in order (for tests and small datasets)."""
        return [(s, i) for s, a, b in self.ranges for i in range(a, b)]


def _append(out: list[Range], shard: int, start: int, stop: int) -> None:
    if stop <= start:
        return
    if out and out[-1][0] == shard and out[-1][2] == start:
        out[-1] = (shard, out[-1][1], stop)
    else:
        out.append((shard, start, stop))


def plan_worker(
    shard_sizes: Sequence[int],
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    rank: int,
    world: int,
    worker: int,
    workers: int,
    batch_size: int,
    drop_last: bool,
) -> WorkerPlan:
    """The share of worker ``worker`` of rank ``rank`` in ``epoch`` (see the module docstring)."""
    if not 0 <= rank < world:
        raise ValueError(f"{rank=} should be in [0, {world=})")
    if not 0 <= worker < workers:
        raise ValueError(f"{worker=} should be in [0, {workers=})")
    if any(s < 0 for s in shard_sizes):
        raise ValueError(f"shard sizes should be >= 0, found {min(shard_sizes)}")
    total = sum(shard_sizes)
    per = samples_per_rank(total, world=world, drop_last=drop_last)
    nb = batches_per_rank(total, world=world, batch_size=batch_size, drop_last=drop_last)
    order = shard_order(len(shard_sizes), seed=seed, epoch=epoch, shuffle=shuffle)
    cum = [0]
    for i in order:
        cum.append(cum[-1] + shard_sizes[i])
    out: list[Range] = []
    for b in range(worker, nb, workers):
        lo = rank * per + b * batch_size
        hi = rank * per + min((b + 1) * batch_size, per)
        while lo < hi:  # split at wrap-arounds of the virtual sequence, then at shard ends
            v = lo % total
            j = bisect.bisect_right(cum, v) - 1
            take = min(hi - lo, cum[j + 1] - v)
            _append(out, order[j], v - cum[j], v - cum[j] + take)
            lo += take
    return WorkerPlan(ranges=tuple(out), batch_size=batch_size)
