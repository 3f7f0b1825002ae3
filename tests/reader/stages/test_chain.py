"""A worker's whole chain: restored at every midpoint, and at a batch by ``state_at_batch``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shardify.reader.plan.assign import WorkerPlan
from shardify.reader.plan.resume import PlanOptions, share_order
from shardify.reader.sample.bad import Bad
from shardify.reader.sample.collate import default_collate
from shardify.reader.stages.base import Stage
from shardify.reader.stages.chain import state_at_batch, worker_stages

PLAN = WorkerPlan(ranges=((0, 0, 9), (1, 2, 12), (2, 0, 4)), batch_size=4)  # 23 samples, 6 batches


def _process(item: Any) -> Any:
    x = item["x"]
    return Bad(item["__shard__"], item["__key__"], "bad", lost=False) if x % 7 == 3 else x + 1000 * item["tag"]


def _tag(pair: tuple[int, Any]) -> tuple[int, Any]:
    p, item = pair
    item["tag"] = p % 2
    return pair


def _maker(reader: Any, bucketed: bool) -> Callable[[], Stage[Any]]:
    opts = PlanOptions(seed=3, shuffle=True, batch_size=4, drop_last=False, block=2, buffer=6)
    read, out = share_order(PLAN, opts, epoch=0, rank=0, worker=0)

    def make() -> Stage[Any]:
        return worker_stages(
            reader(),
            PLAN,
            read=read,
            out=out,
            process=_process,
            collate=default_collate,
            on_bad=lambda bad: None,
            tag=_tag,
            bucket_length=(lambda x: x % 5) if bucketed else None,
            bucket_buffer=8 if bucketed else None,
            seed=3,
        )

    return make


@pytest.mark.parametrize("bucketed", [False, True])
def test_the_chain_restores_at_every_midpoint_and_at_each_batch(
    bucketed: bool, check_midpoints: Any, fake_reader: Any
) -> None:
    make = _maker(fake_reader, bucketed)
    full = check_midpoints(make, range(7))
    sizes = [len(b) for b in full]
    assert (sorted(sizes, reverse=True) if bucketed else sizes) == [4, 4, 4, 4, 4, 3]
    for k in range(7):
        stage = make()
        stage.load_state_dict(state_at_batch(k, batch_size=4, samples=23, bucketed=bucketed))
        assert [b.tolist() for b in stage] == [b.tolist() for b in full[k:]]
