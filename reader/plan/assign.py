"""Which samples each (rank, worker) reads in an epoch: a pure function of the epoch's sequence.

The epoch is one sequence of ``N`` samples, given as shard ranges in order (built by
:mod:`shardify.reader.plan.mix`: shards laid end to end, and when shuffling cut into blocks
of a few samples put in a seeded random order, so that any slice of it is a sample of the
whole epoch). Rank ``r`` takes the contiguous slice ``[r * per_rank, (r + 1) * per_rank)``
of it, where ``per_rank`` is ``N // world`` with ``drop_last`` (the few left over are
dropped) and ``ceil(N / world)`` without (the slice runs past the end and wraps to the
start, repeating a few samples, like DistributedSampler; positions ``>= N`` are those
repeats). The rank cuts its slice into batches of ``batch_size`` (``drop_last`` drops the
last partial batch, identically on every rank) and deals whole batches to its workers
round-robin: batch ``b`` goes to worker ``b % workers``. DataLoader fetches from its workers
round-robin too, so it yields the rank's batches in order, and every rank yields the same
number of batches. A worker with no batch yields nothing. Slices and batches cut through
shards freely: a worker reads a range ``[start, stop)`` of a shard by seeking over the
samples before it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardify.reader.plan.blocks import BlockSequence

__all__ = [
    "Range",
    "WorkerPlan",
    "shard_sequence",
    "sequence_length",
    "sequence_starts",
    "append_range",
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
    runs: tuple[tuple[int, int], ...] = ()
    """The share as runs ``[lo, hi)`` of positions in the epoch's sequence; ``>= total``: repeats."""
    total: int = 0
    """Samples in the epoch's sequence."""

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

    def sequence_positions(self) -> list[int]:
        """The position in the epoch's sequence of each sample of the share, in share order;
        a padding repeat has its position plus the sequence's length (``>= total``)."""
        return [v for lo, hi in self.runs for v in range(lo, hi)]

    def repeats(self) -> frozenset[int]:
        """Share positions that repeat a sample to even out the ranks (only without ``drop_last``)."""
        out: set[int] = set()
        at = 0
        for lo, hi in self.runs:
            out.update(range(at + max(lo, self.total) - lo, at + hi - lo))
            at += hi - lo
        return frozenset(out)


def shard_sequence(sizes: Sequence[int], order: Sequence[int]) -> tuple[Range, ...]:
    """The sequence of whole shards ``order`` (indices into ``sizes``) laid end to end."""
    return tuple((i, 0, sizes[i]) for i in order if sizes[i] > 0)


def sequence_starts(sequence: Sequence[Range] | BlockSequence) -> np.ndarray | None:
    """Where each range of ``sequence`` starts in it, plus its length at the end (int64);
    None for a :class:`BlockSequence` (plan version 4), which needs none.

    Checks every range once (``0 <= start <= stop``), vectorised: computed once per epoch's
    sequence and passed to :func:`plan_worker` for each worker, it is the only part of
    planning that grows with the number of ranges.
    """
    if isinstance(sequence, BlockSequence):
        return None
    return _range_starts(sequence)


def _range_starts(sequence: Sequence[Range]) -> np.ndarray:
    """:func:`sequence_starts` of a sequence of ranges (never None)."""
    flat = np.fromiter(itertools.chain.from_iterable(sequence), dtype=np.int64, count=3 * len(sequence))
    first, stop = flat[1::3], flat[2::3]
    lengths = stop - first
    bad = np.flatnonzero((first < 0) | (lengths < 0))
    if bad.size:
        raise ValueError(
            f"sequence ranges (shard, start, stop) should have 0 <= start <= stop, "
            f"found {tuple(sequence[int(bad[0])])} at index {int(bad[0])}"
        )
    out = np.zeros(len(sequence) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def sequence_length(sequence: Sequence[Range] | BlockSequence) -> int:
    """Samples in ``sequence``."""
    if isinstance(sequence, BlockSequence):
        return sequence.total
    return sum(b - a for _, a, b in sequence)


def append_range(out: list[Range], shard: int, start: int, stop: int) -> None:
    """Append ``(shard, start, stop)`` to ``out``, merged into the last range when it continues it."""
    if stop <= start:
        return
    if out and out[-1][0] == shard and out[-1][2] == start:
        out[-1] = (shard, out[-1][1], stop)
    else:
        out.append((shard, start, stop))


def plan_worker(
    sequence: Sequence[Range] | BlockSequence,
    *,
    rank: int,
    world: int,
    worker: int,
    workers: int,
    batch_size: int,
    drop_last: bool,
    starts: np.ndarray | Sequence[int] | None = None,
) -> WorkerPlan:
    """The share of worker ``worker`` of rank ``rank`` of the epoch ``sequence`` (see the module docstring).

    ``starts``: :func:`sequence_starts` of ``sequence`` (which also checks its ranges), computed
    once when the caller plans the same sequence for several workers; given, the plan costs
    a binary search per piece of the worker's share, whatever the length of the sequence.
    A :class:`BlockSequence` (plan version 4) needs no ``starts``: the share's positions are mapped
    through its keyed block order, O(share) whatever the epoch's length.
    """
    if not 0 <= rank < world:
        raise ValueError(f"{rank=} should be in [0, {world=})")
    if not 0 <= worker < workers:
        raise ValueError(f"{worker=} should be in [0, {workers=})")
    if isinstance(sequence, BlockSequence):
        return _plan_blocks(
            sequence, rank=rank, world=world, worker=worker, workers=workers, batch_size=batch_size, drop_last=drop_last
        )
    cum = _range_starts(sequence) if starts is None else np.asarray(starts, dtype=np.int64)
    if len(cum) != len(sequence) + 1:
        raise ValueError(f"starts has {len(cum)} entries, should be {len(sequence) + 1}: one per range plus the end")
    total = int(cum[-1])
    runs = _share_runs(
        total, rank=rank, world=world, worker=worker, workers=workers, batch_size=batch_size, drop_last=drop_last
    )
    out: list[Range] = []
    for lo, hi in runs:
        while lo < hi:  # split at wrap-arounds of the sequence, then at its range ends
            v = lo % total
            end = v + min(hi - lo, total - v)
            j = int(cum.searchsorted(v, side="right")) - 1
            last = int(cum.searchsorted(end, side="left"))  # ranges j..last-1 hold [v, end)
            at = cum[j : last + 1].tolist()
            for i, (shard, start, _) in enumerate(sequence[j:last]):
                first = start - at[i]
                append_range(out, shard, first + max(v, at[i]), first + min(end, at[i + 1]))
            lo += end - v
    return WorkerPlan(ranges=tuple(out), batch_size=batch_size, runs=tuple(runs), total=total)


def _share_runs(
    total: int, *, rank: int, world: int, worker: int, workers: int, batch_size: int, drop_last: bool
) -> list[tuple[int, int]]:
    """The share of a worker as runs ``[lo, hi)`` of sequence positions (``>= total``: repeats)."""
    per = samples_per_rank(total, world=world, drop_last=drop_last)
    nb = batches_per_rank(total, world=world, batch_size=batch_size, drop_last=drop_last)
    base = rank * per
    return [
        (lo, base + min(lo - base + batch_size, per))
        for lo in (base + b * batch_size for b in range(worker, nb, workers))
    ]


def _plan_blocks(
    sequence: BlockSequence, *, rank: int, world: int, worker: int, workers: int, batch_size: int, drop_last: bool
) -> WorkerPlan:
    """:func:`plan_worker` of a plan version 4 sequence: the share's positions (wrapped past the end
    for padding repeats) mapped to shard ranges with numpy."""
    total = sequence.total
    runs = _share_runs(
        total, rank=rank, world=world, worker=worker, workers=workers, batch_size=batch_size, drop_last=drop_last
    )
    positions = (
        np.concatenate([np.arange(lo, hi, dtype=np.int64) for lo, hi in runs]) % total
        if runs
        else np.zeros(0, dtype=np.int64)
    )
    return WorkerPlan(ranges=tuple(sequence.ranges_at(positions)), batch_size=batch_size, runs=tuple(runs), total=total)
