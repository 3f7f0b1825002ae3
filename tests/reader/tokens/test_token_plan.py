"""The packed-token plan as a pure value: every unit once over ranks and resumes, equal batch counts."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from shardify.reader.tokens.plan import (
    Runs,
    TokenPlan,
    batch_positions,
    rank_batches,
    remaining_runs,
    stream_tokens,
    worker_share,
)


def _rank_positions(runs: list[tuple[int, int]], world: int, batch_size: int, first: int = 0) -> list[list[int]]:
    """Each rank's real positions, batch by batch from batch ``first``."""
    total = sum(b - a for a, b in runs)
    num = rank_batches(total, world=world, batch_size=batch_size)
    out = []
    for r in range(world):
        got = []
        for b in range(first, num):
            p = batch_positions(Runs(runs), rank=r, world=world, batch=b, batch_size=batch_size)
            got += p[p >= 0].tolist()
        out.append(got)
    return out


@pytest.mark.parametrize("units", [0, 1, 7, 50, 101])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_every_position_once_over_ranks(units: int, world: int, batch_size: int) -> None:
    runs = remaining_runs(units, (), batch_size=batch_size)
    got = [p for rank in _rank_positions(runs, world, batch_size) for p in rank]
    assert sorted(got) == list(range(units))


@pytest.mark.parametrize(
    ("units", "parts", "batch_size"),
    [
        (101, [(3, 2), (2, 5)], 4),
        (50, [(1, 7), (4, 1), (3, 0)], 3),
        (64, [(8, 2), (1, 30)], 1),
        (9, [(4, 1)], 2),
        (30, [(2, 100)], 2),  # past the end: nothing left
    ],
)
@pytest.mark.parametrize("world", [1, 2, 5])
def test_resumed_parts_and_what_they_left_hold_every_position_once(
    units: int, parts: list[tuple[int, int]], batch_size: int, world: int
) -> None:
    consumed: list[int] = []
    for i, (w, k) in enumerate(parts):  # part i reads k batches per rank of what parts before it left
        runs = remaining_runs(units, parts[:i], batch_size=batch_size)
        total = sum(b - a for a, b in runs)
        num = rank_batches(total, world=w, batch_size=batch_size)
        for r in range(w):
            for b in range(min(k, num)):
                p = batch_positions(Runs(runs), rank=r, world=w, batch=b, batch_size=batch_size)
                consumed += p[p >= 0].tolist()
    rest = remaining_runs(units, parts, batch_size=batch_size)
    after = [p for rank in _rank_positions(rest, world, batch_size) for p in rank]
    assert Counter(consumed + after) == Counter(range(units))


def test_every_rank_yields_the_same_number_of_batches_of_full_shape() -> None:
    runs = remaining_runs(10, (), batch_size=4)
    num = rank_batches(10, world=3, batch_size=4)  # 4 positions a rank: one batch each
    assert num == 1
    rows = [batch_positions(Runs(runs), rank=r, world=3, batch=0, batch_size=4) for r in range(3)]
    assert [len(x) for x in rows] == [4, 4, 4]
    assert [int((x < 0).sum()) for x in rows] == [0, 0, 2]  # padding rows, counted as -1


def test_workers_deal_the_rest_of_a_rank_round_robin_from_worker_0() -> None:
    assert list(worker_share(7, worker=0, workers=2)) == [0, 2, 4, 6]
    assert list(worker_share(7, worker=1, workers=2, skip=3)) == [4, 6]
    assert list(worker_share(7, worker=0, workers=2, skip=3)) == [3, 5]


def test_order_is_keyed_by_seed_and_epoch_and_a_bijection() -> None:
    plan = TokenPlan(totals=(1000, 500), counts=(1000, 500), seq_len=16, seed=3, epoch=0)
    units = plan.units
    assert units == 63 + 32
    s, q = plan.units_at(np.arange(units))
    pairs = set(zip(s.tolist(), q.tolist()))
    assert pairs == {(0, i) for i in range(63)} | {(1, i) for i in range(32)}
    again = TokenPlan(totals=(1000, 500), counts=(1000, 500), seq_len=16, seed=3, epoch=0).units_at(np.arange(units))
    assert (again[1] == q).all()
    other = TokenPlan(totals=(1000, 500), counts=(1000, 500), seq_len=16, seed=3, epoch=1).units_at(np.arange(units))
    assert not ((other[0] == s).all() and (other[1] == q).all())


def test_epoch_tokens_split_by_weight_and_walk_through_the_stream() -> None:
    assert stream_tokens([100, 40], weights=[3, 1], epoch_tokens=80) == [60, 20]
    assert stream_tokens([100, 40], weights=None, epoch_tokens=None) == [100, 40]
    plan = [TokenPlan(totals=(100,), counts=(60,), seq_len=8, seed=0, epoch=e) for e in range(3)]
    assert [p.take_start(0) for p in plan] == [0, 60, 20]  # 0..59, 60..119 = 60..99 + 0..19, 20..79
    with pytest.raises(ValueError, match="epoch_tokens"):
        stream_tokens([100, 40], weights=[3, 1], epoch_tokens=None)
    with pytest.raises(ValueError, match="no tokens"):
        stream_tokens([100, 0], weights=[1, 1], epoch_tokens=10)
