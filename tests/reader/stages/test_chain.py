"""A worker's whole chain, built from its plan: restored at every midpoint, and skipped to each batch.

``chain.skip(k)`` is how a worker resumes at batch ``k``: each stage translates it for its
source, so a chain with a stage added still resumes exactly (no state layout is built by hand).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shardify.reader.plan.assign import WorkerPlan
from shardify.reader.plan.epoch import EpochPlan
from shardify.reader.plan.resume import PlanOptions
from shardify.reader.sample.bad import Bad
from shardify.reader.sample.collate import default_collate
from shardify.reader.stages.base import Mapped, Stage
from shardify.reader.stages.chain import ChainContext, build_chain

SHARE = WorkerPlan(ranges=((0, 0, 9), (1, 2, 12), (2, 0, 4)), batch_size=4)  # 23 samples, 6 batches
PLAN = EpochPlan(
    epoch=0,
    rank=0,
    world=1,
    worker=0,
    workers=1,
    history=(),
    share=SHARE,
    options=PlanOptions(seed=3, shuffle=True, batch_size=4, drop_last=False, block=2, buffer=6),
    rank_batches=6,
)


def _process(item: Any) -> Any:
    x = item["x"]
    return Bad(item["__shard__"], item["__key__"], "bad", lost=False) if x % 7 == 3 else x + 1000 * item["tag"]


def _tag(pair: tuple[int, Any]) -> tuple[int, Any]:
    p, item = pair
    item["tag"] = p % 2
    return pair


def _maker(reader: Any, bucketed: bool, extra: bool = False) -> Callable[[], Stage[Any]]:
    def make() -> Stage[Any]:
        context = ChainContext(
            reader=reader(),
            process=_process,
            collate=default_collate,
            on_bad=lambda bad: None,
            tag=_tag,
            bucket_length=(lambda x: x % 5) if bucketed else None,
            bucket_buffer=8 if bucketed else None,
            seed=3,
        )
        chain = build_chain(PLAN, context)
        return Mapped(chain, lambda b: b + 1) if extra else chain  # a stage added on top

    return make


@pytest.mark.parametrize("bucketed", [False, True])
@pytest.mark.parametrize("extra", [False, True], ids=["chain", "chain-and-a-stage"])
def test_the_chain_restores_and_skips_at_every_batch(
    bucketed: bool, extra: bool, check_midpoints: Any, fake_reader: Any
) -> None:
    full = check_midpoints(_maker(fake_reader, bucketed, extra), range(7))
    sizes = [len(b) for b in full]
    assert (sorted(sizes, reverse=True) if bucketed else sizes) == [4, 4, 4, 4, 4, 3]


def test_skipping_never_reads_the_samples_of_the_batches_skipped(fake_reader: Any) -> None:
    """Without bucketing, ``skip(k)`` marks the first ``k`` batches' samples consumed: a restored
    worker reads only the rest of its share."""
    readers: list[Any] = []

    def reader() -> Any:
        readers.append(fake_reader())
        return readers[-1]

    make = _maker(reader, bucketed=False)
    full = list(make())
    chain = make()
    chain.skip(4)
    assert [b.tolist() for b in chain] == [b.tolist() for b in full[4:]]
    read = sum(stop - start for _, start, stop in readers[-1].reads)
    assert read == 23 - 4 * 4
