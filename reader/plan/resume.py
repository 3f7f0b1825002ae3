"""Resume an epoch on another topology: which samples are consumed, and what is left.

The plan is a pure function, so the samples a job consumed in the first ``batches`` batches
of every rank under ``(world, workers)`` (a :class:`Segment`) can be recomputed exactly from
the epoch's sequence: for each (rank, worker), the first ``batches`` of its batches in its
shuffled order. What is left of the sequence (its order kept) is then planned like a whole
epoch over the new ``(world, workers)``: every remaining sample once over all ranks, the same
number of batches on every rank. An epoch resumed several times keeps its segments in order;
segment ``i`` plans the sequence left after segments ``0..i-1``, its workers shuffling with
the seed of segment ``i`` (:func:`share_order`). A state thus stays a few integers per segment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardify.reader.plan.assign import (
    Range,
    WorkerPlan,
    append_range,
    batches_per_rank,
    consumed_by_worker,
    plan_worker,
    sequence_length,
    sequence_starts,
)
from shardify.reader.plan.blocks import BlockSequence
from shardify.reader.plan.shuffle import array_order, numpy_rng, ramp_start

__all__ = [
    "PLAN_VERSION",
    "PlanOptions",
    "Segment",
    "share_order",
    "consumed_mask",
    "remaining",
    "resumed_sequence",
]

PLAN_VERSION = 4
"""The version of the epoch plan, recorded in every state (its ``plan_version`` field): blocks of
every shard in a keyed order that each worker evaluates on its own share
(:mod:`shardify.reader.plan.blocks`; the shards of a pass in
:func:`~shardify.reader.plan.mix.shard_permutation` order), and a shuffle buffer that ramps up
(:mod:`shardify.reader.plan.shuffle`). A state naming another version is refused."""


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """What fixes the plan besides the sequence and the topology."""

    seed: int
    shuffle: bool
    batch_size: int
    drop_last: bool
    block: int
    buffer: int


@dataclass(frozen=True, slots=True)
class Segment:
    """The first ``batches`` batches of every rank of an epoch, read under ``(world, workers)``."""

    world: int
    workers: int
    batches: int

    def __post_init__(self) -> None:
        if self.world < 1 or self.workers < 1 or self.batches < 0:
            raise ValueError(f"segment {self.world=}, {self.workers=}, {self.batches=}: want >= 1, >= 1, >= 0")


def share_order(
    plan: WorkerPlan, opts: PlanOptions, *, epoch: int, rank: int, worker: int, segment: int = 0
) -> tuple[list[int], list[int]]:
    """``(read order, output order)`` of a worker's share (see :func:`array_order`; without
    shuffle both are the natural order)."""
    if not opts.shuffle:
        natural = list(range(plan.num_samples))
        return natural, natural
    parts: tuple[object, ...] = ("stream", opts.seed, epoch, rank, worker) + (("segment", segment) if segment else ())
    return array_order(
        plan.num_samples,
        rng=numpy_rng(*parts),
        block=opts.block,
        buffer_size=opts.buffer,
        initial=ramp_start(opts.buffer),
    )


def consumed_mask(
    sequence: Sequence[Range], segment: Segment, opts: PlanOptions, *, epoch: int, index: int = 0
) -> bytearray:
    """One byte per position of ``sequence``: 1 where ``segment`` (the ``index``-th) consumed it.

    Padding repeats (only without ``drop_last``) do not count: their sample stays to be read.
    """
    total = sequence_length(sequence)
    have = batches_per_rank(total, world=segment.world, batch_size=opts.batch_size, drop_last=opts.drop_last)
    if segment.batches > have:
        raise ValueError(f"{segment} consumed more batches than the {have} each rank has")
    mask = bytearray(total)
    starts = sequence_starts(sequence)
    for rank in range(segment.world):
        for worker in range(segment.workers):
            k = consumed_by_worker(segment.batches, worker=worker, workers=segment.workers)
            if not k:
                continue
            plan = plan_worker(
                sequence,
                rank=rank,
                world=segment.world,
                worker=worker,
                workers=segment.workers,
                batch_size=opts.batch_size,
                drop_last=opts.drop_last,
                starts=starts,
            )
            _, out = share_order(plan, opts, epoch=epoch, rank=rank, worker=worker, segment=index)
            where = plan.sequence_positions()
            for p in out[: k * opts.batch_size]:
                if where[p] < total:  # a padding repeat read early leaves its sample to be read
                    mask[where[p]] = 1
    return mask


def remaining(sequence: Sequence[Range], mask: bytearray) -> tuple[Range, ...]:
    """``sequence`` without the positions marked in ``mask``, in the same order."""
    out: list[Range] = []
    at = 0
    for shard, a, b in sequence:
        end = at + b - a
        i = at
        while i < end:
            j = mask.find(0, i, end)
            if j < 0:
                break
            k = mask.find(1, j, end)
            k = end if k < 0 else k
            append_range(out, shard, a + j - at, a + k - at)
            i = k
        at = end
    return tuple(out)


def resumed_sequence(
    sequence: Sequence[Range] | BlockSequence, history: Sequence[Segment], opts: PlanOptions, *, epoch: int
) -> tuple[Range, ...]:
    """What is left of the epoch's ``sequence`` after the segments of ``history``, in order (a
    :class:`BlockSequence` is listed whole first: O(epoch), once per resume on another topology)."""
    seq = tuple(sequence)
    for i, segment in enumerate(history):
        seq = remaining(seq, consumed_mask(seq, segment, opts, epoch=epoch, index=i))
    return seq
