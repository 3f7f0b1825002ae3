"""The epoch plan as a value: a pure function of (seed, epoch, rank, world, worker, workers, sizes)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

import shardify.reader.plan.epoch as epoch_module
from shardify.reader import ShardedDataset
from shardify.reader.plan.assign import plan_worker
from shardify.reader.plan.epoch import EpochInputs
from shardify.reader.plan.resume import Segment, share_order


def _inputs(**kw: object) -> EpochInputs:
    base = dict(
        seed=7, shuffle=True, batch_size=4, drop_last=False, block=3, buffer=16, stream_sizes=((10, 7, 12), (5, 9))
    )
    return EpochInputs(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize("drop_last", [False, True])
def test_shares_cover_the_epoch_once_and_one_worker_holds_the_ranks_last_batch(drop_last: bool) -> None:
    inputs = _inputs(drop_last=drop_last)
    for epoch, world, workers in itertools.product((0, 3), (1, 2, 3), (1, 2, 4)):
        seen: list[tuple[int, int]] = []
        for rank in range(world):
            plans = [inputs.worker(epoch, rank=rank, world=world, worker=w, workers=workers) for w in range(workers)]
            assert sum(p.holds_last for p in plans) == (1 if plans[0].rank_batches else 0)
            if plans[0].rank_batches:  # round robin: the last worker of those with the most batches
                most = max(p.num_batches for p in plans)
                assert [p.holds_last for p in plans].index(True) == max(
                    w for w, p in enumerate(plans) if p.num_batches == most
                )
            assert sum(p.num_batches for p in plans) == plans[0].rank_batches
            assert plans[0].rank_batches == inputs.rank_batches(epoch, world=world)
            for p in plans:
                repeats = p.share.repeats()
                seen += [s for i, s in enumerate(p.share.samples()) if i not in repeats]
        assert len(seen) == len(set(seen))  # no sample twice (padding repeats aside)
        if not drop_last:
            assert len(seen) == inputs.samples_per_epoch  # and every one once


def test_a_plan_is_what_the_plan_functions_give_and_a_value() -> None:
    inputs = _inputs()
    seq, starts = inputs.sequence(2)
    a = inputs.worker(2, rank=1, world=2, worker=1, workers=2)
    share = plan_worker(seq, rank=1, world=2, worker=1, workers=2, batch_size=4, drop_last=False, starts=starts)
    assert a.share == share
    assert a.orders() == share_order(share, inputs.plan_options(), epoch=2, rank=1, worker=1)
    assert a == inputs.worker(2, rank=1, world=2, worker=1, workers=2)  # equal inputs, equal plans
    assert hash(inputs) == hash(_inputs()) and inputs == _inputs()
    with pytest.raises(dataclasses.FrozenInstanceError):
        inputs.seed = 1  # type: ignore[misc]
    assert inputs.worker(3, rank=1, world=2, worker=1, workers=2).share != share  # another epoch, another share


def test_the_rest_after_history_is_planned_from_the_same_inputs() -> None:
    inputs = _inputs()
    history = (Segment(world=2, workers=2, batches=3),)
    left = inputs.rank_batches(1, world=1, history=history)
    plan = inputs.worker(1, rank=0, world=1, worker=0, workers=1, history=history)
    assert plan.num_batches == left and plan.history == history
    assert left < inputs.rank_batches(1, world=1)


def test_a_resumed_iteration_plans_its_share_once(counting_dataset, monkeypatch):
    """A process resumed from a dataset state plans its share once: the check of the loaded
    place and the iteration share one EpochPlan."""
    root = counting_dataset([7, 2, 13])
    kw = dict(batch_size=2, fields=("cls",), shuffle=True, seed=1)
    ds = ShardedDataset(root, **kw)
    full = [b.tolist() for b in ds]
    it = iter(ds)
    head = [next(it).tolist() for _ in range(3)]
    state = ds.state_dict()
    other = ShardedDataset(root, **kw)
    other.load_state_dict(state)
    calls: list[int] = []
    real = epoch_module.plan_worker
    monkeypatch.setattr(epoch_module, "plan_worker", lambda *a, **k: calls.append(1) or real(*a, **k))
    rest = [b.tolist() for b in other]
    assert head + rest == full and len(calls) == 1
