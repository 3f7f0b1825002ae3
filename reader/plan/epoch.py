"""The epoch plan as values: what every epoch is a function of, and one worker's plan of one epoch.

:class:`EpochInputs` holds what decides every epoch's sequence and batches besides the epoch
and the topology: the seed, the plan options (shuffle, batch size, ``drop_last``, block and
buffer sizes), each stream's shard sizes and its samples per epoch. A dataset builds it once.
:meth:`EpochInputs.worker` is then a pure function of ``(epoch, rank, world, worker, workers)``
(and of the parts of the epoch read before on other topologies) giving
an :class:`EpochPlan`: the worker's share (:func:`~shardify.reader.plan.assign.plan_worker`),
its batch count, whether the epoch's last batch is among them, and its read and output orders
(:func:`~shardify.reader.plan.resume.share_order`).

An epoch's sequence is planned once per process and ``(inputs, epoch, history)`` (the last
two are kept): every worker plan of that epoch, a resume check and the next iteration reuse it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardify.reader.plan.assign import WorkerPlan, batches_per_rank, plan_worker, sequence_length, sequence_starts
from shardify.reader.plan.blocks import BlockSequence
from shardify.reader.plan.mix import planned_sequence
from shardify.reader.plan.resume import PlanOptions, Segment, resumed_sequence, share_order

__all__ = ["EpochInputs", "EpochPlan"]

Sequence_ = tuple[Any, ...] | BlockSequence  # an epoch's sequence: (shard, start, stop) ranges, or shuffled blocks


@dataclass(frozen=True)
class EpochInputs:
    """What every epoch's plan is a function of, besides the epoch and the topology."""

    seed: int
    shuffle: bool
    batch_size: int
    drop_last: bool
    block: int
    """Shuffle block: samples read with one seek."""
    buffer: int
    """Shuffle buffer: encoded samples a worker holds."""
    stream_sizes: tuple[tuple[int, ...], ...]
    """Each stream's shard sizes, in the dataset's shard order."""
    counts: tuple[int, ...] | None = None
    """Samples each stream gives an epoch; None: every sample of every stream once."""
    blocks: bool = True
    """Shards may be read in blocks across ranks (False when some shard cannot seek: gzip)."""

    def plan_options(self) -> PlanOptions:
        """The options of the plan (what fixes it besides the sequence and the topology)."""
        return PlanOptions(
            seed=self.seed,
            shuffle=self.shuffle,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            block=self.block,
            buffer=self.buffer,
        )

    @property
    def samples_per_epoch(self) -> int:
        """Samples of a whole epoch over all ranks."""
        if self.counts is not None:
            return sum(self.counts)
        return sum(sum(sizes) for sizes in self.stream_sizes)

    def sequence(self, epoch: int, history: Sequence[Segment] = ()) -> tuple[Sequence_, np.ndarray | None]:
        """``(sequence, sequence_starts)`` of the part of ``epoch`` left after ``history``."""
        return _sequence(self, epoch, tuple(history))

    def rank_batches(self, epoch: int, *, world: int, history: Sequence[Segment] = ()) -> int:
        """Batches each of ``world`` ranks yields in the part of ``epoch`` left after ``history``."""
        if history:
            seq, starts = self.sequence(epoch, history)
            left = int(starts[-1]) if starts is not None else sequence_length(seq)
        else:
            left = self.samples_per_epoch
        return batches_per_rank(left, world=world, batch_size=self.batch_size, drop_last=self.drop_last)

    def worker(
        self,
        epoch: int,
        *,
        rank: int,
        world: int,
        worker: int,
        workers: int,
        history: Sequence[Segment] = (),
    ) -> EpochPlan:
        """The plan of ``worker`` of ``workers`` of rank ``rank`` of ``world`` in ``epoch``."""
        history = tuple(history)
        seq, starts = self.sequence(epoch, history)
        share = plan_worker(
            seq,
            rank=rank,
            world=world,
            worker=worker,
            workers=workers,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            starts=starts,
        )
        return EpochPlan(
            epoch=epoch,
            rank=rank,
            world=world,
            worker=worker,
            workers=workers,
            history=history,
            share=share,
            options=self.plan_options(),
            rank_batches=self.rank_batches(epoch, world=world, history=history),
        )


@dataclass(frozen=True)
class EpochPlan:
    """One worker's plan of one epoch (or of the part left after ``history``)."""

    epoch: int
    rank: int
    world: int
    worker: int
    workers: int
    history: tuple[Segment, ...]
    share: WorkerPlan
    options: PlanOptions
    rank_batches: int
    """Batches of the rank in this epoch (all its workers together)."""

    @property
    def num_batches(self) -> int:
        """Batches of this worker's share."""
        return self.share.num_batches

    @property
    def holds_last(self) -> bool:
        """Whether the rank's last batch of the epoch is this worker's (batch ``b`` is worker ``b % workers``'s)."""
        return self.rank_batches > 0 and self.worker == (self.rank_batches - 1) % self.workers

    def orders(self) -> tuple[list[int], list[int]]:
        """``(read order, output order)`` of the share's positions (computed on each call)."""
        return share_order(
            self.share, self.options, epoch=self.epoch, rank=self.rank, worker=self.worker, segment=len(self.history)
        )


@functools.lru_cache(maxsize=2)
def _sequence(inputs: EpochInputs, epoch: int, history: tuple[Segment, ...]) -> tuple[Sequence_, np.ndarray | None]:
    seq: Sequence_ = planned_sequence(
        inputs.stream_sizes,
        counts=inputs.counts,
        seed=inputs.seed,
        epoch=epoch,
        shuffle=inputs.shuffle,
        block=inputs.block,
        blocks=inputs.blocks,
    )
    if history:
        seq = resumed_sequence(seq, history, inputs.plan_options(), epoch=epoch)
    return seq, sequence_starts(seq)
