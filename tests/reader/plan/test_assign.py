"""Assignment invariants over many (world, workers, batch size, shard sizes, seed, epoch)."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardify.reader.plan.assign import (
    batches_per_rank,
    consumed_by_worker,
    plan_worker,
    resumed_role,
    samples_per_rank,
    shard_sequence,
    worker_batches,
)
from shardify.reader.plan.mix import epoch_sequence
from shardify.reader.plan.shuffle import shard_order


def sequence(sizes, *, seed, epoch, shuffle, block=3):
    return epoch_sequence([sizes], counts=None, seed=seed, epoch=epoch, shuffle=shuffle, block=block)


def plan(sizes, *, seed, epoch, shuffle, **kw):
    return plan_worker(sequence(sizes, seed=seed, epoch=epoch, shuffle=shuffle), **kw)


SIZES = [
    pytest.param([7, 2, 13], id="7-2-13"),
    pytest.param([1], id="one-sample"),
    pytest.param([0, 5, 0, 3], id="empty-shards"),
    pytest.param([4] * 9, id="equal"),
    pytest.param([100, 1, 1, 37], id="skewed"),
    pytest.param([3, 3], id="fewer-than-ranks"),
]


def rank_batches(sizes, *, seed, epoch, shuffle, rank, world, workers, batch_size, drop_last):
    """A rank's batches in the order DataLoader yields them: round-robin over its workers."""
    per_worker = []
    for w in range(workers):
        p = plan(
            sizes,
            seed=seed,
            epoch=epoch,
            shuffle=shuffle,
            rank=rank,
            world=world,
            worker=w,
            workers=workers,
            batch_size=batch_size,
            drop_last=drop_last,
        )
        samples = p.samples()
        cuts = itertools.accumulate(p.batch_sizes(), initial=0)
        bounds = list(cuts)
        per_worker.append([samples[a:b] for a, b in zip(bounds, bounds[1:])])
    out = []
    for b in range(max((len(p) for p in per_worker), default=0)):
        for w in range(workers):
            if b < len(per_worker[w]):
                out.append(per_worker[w][b])
    return out


def reference(sizes, *, seed, epoch, shuffle, rank, world, batch_size, drop_last):
    """The spec, spelled out on an explicit list of every sample."""
    virtual = [(s, i) for s, a, b in sequence(sizes, seed=seed, epoch=epoch, shuffle=shuffle) for i in range(a, b)]
    n = len(virtual)
    if n == 0:
        return []
    per = n // world if drop_last else -(-n // world)
    mine = [virtual[(rank * per + j) % n] for j in range(per)]
    batches = [mine[i : i + batch_size] for i in range(0, per, batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    return batches


def check(sizes, *, seed, epoch, shuffle, world, workers, batch_size, drop_last):
    kw = dict(seed=seed, epoch=epoch, shuffle=shuffle, world=world, batch_size=batch_size, drop_last=drop_last)
    n = sum(sizes)
    nb = batches_per_rank(n, world=world, batch_size=batch_size, drop_last=drop_last)
    seen: Counter = Counter()
    for rank in range(world):
        got = rank_batches(sizes, rank=rank, workers=workers, **kw)
        assert got == reference(sizes, rank=rank, **kw)
        assert len(got) == nb, f"{rank=} got {len(got)} batches, want {nb}"
        assert all(len(b) == batch_size for b in got[:-1])
        seen.update(x for b in got for x in b)
    every = {(s, i) for s, k in enumerate(sizes) for i in range(k)}
    assert set(seen) <= every
    if drop_last:
        assert max(seen.values(), default=1) == 1
        assert n - sum(seen.values()) < world * batch_size
    else:
        assert set(seen) == every
        assert sum(seen.values()) == samples_per_rank(n, world=world, drop_last=False) * world
        assert sum(c - 1 for c in seen.values()) < world  # the few padding repeats


@pytest.mark.parametrize("sizes", SIZES)
@pytest.mark.parametrize("drop_last", [False, True])
def test_exactly_once_equal_batches_over_many_worlds(sizes, drop_last):
    for world, workers, batch_size in itertools.product(range(1, 6), range(1, 5), (1, 2, 3, 5, 8)):
        for seed, epoch, shuffle in ((0, 0, False), (1, 0, True), (1, 3, True)):
            check(
                sizes,
                seed=seed,
                epoch=epoch,
                shuffle=shuffle,
                world=world,
                workers=workers,
                batch_size=batch_size,
                drop_last=drop_last,
            )


@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=12),
    world=st.integers(1, 6),
    workers=st.integers(1, 5),
    batch_size=st.integers(1, 10),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 100),
    drop_last=st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_exactly_once_property(sizes, world, workers, batch_size, seed, epoch, drop_last):
    check(
        sizes,
        seed=seed,
        epoch=epoch,
        shuffle=True,
        world=world,
        workers=workers,
        batch_size=batch_size,
        drop_last=drop_last,
    )


def test_deterministic_and_new_order_each_epoch():
    sizes = [5] * 20
    kw = dict(shuffle=True, rank=0, world=2, worker=0, workers=2, batch_size=4, drop_last=True)
    a = plan(sizes, seed=7, epoch=3, **kw)
    assert a == plan(sizes, seed=7, epoch=3, **kw)
    orders = {plan(sizes, seed=7, epoch=e, **kw).ranges for e in range(5)}
    assert len(orders) == 5
    assert plan(sizes, seed=8, epoch=3, **kw) != a


def test_worker_without_batches_gets_an_empty_plan():
    p = plan([3], seed=0, epoch=0, shuffle=False, rank=1, world=2, worker=3, workers=4, batch_size=1, drop_last=False)
    assert p.ranges == () and p.num_batches == 0 and p.batch_sizes() == []


def test_ranges_stay_compact():
    seq = epoch_sequence([[1000] * 1300], counts=None, seed=0, epoch=0, shuffle=True, block=64)
    p = plan_worker(seq, rank=0, world=1, worker=0, workers=1, batch_size=256, drop_last=True)
    assert p.num_samples == 1_300_000 // 256 * 256
    assert len(p.ranges) <= 1_300_000 // 64 + 1300  # one read per block of 64, at most one more per shard


def test_unshuffled_and_legacy_sequences_are_whole_shards_in_order():
    sizes = [4, 0, 3]
    assert sequence(sizes, seed=1, epoch=2, shuffle=False) == ((0, 0, 4), (2, 0, 3))
    legacy = epoch_sequence([sizes], counts=None, seed=1, epoch=2, shuffle=True, block=2, interleave=False)
    assert legacy == shard_sequence(sizes, shard_order(3, seed=1, epoch=2))


@pytest.mark.parametrize("world", [2, 3, 8])
def test_each_rank_sees_the_whole_of_class_sorted_shards(world):
    """With contiguous slices, rank r of a class-sorted single shard saw the same classes."""
    sizes = [3200]  # one shard, class c = index // 400 (8 classes)
    for epoch in range(3):
        seq = sequence(sizes, seed=0, epoch=epoch, shuffle=True, block=4)
        for rank in range(world):
            p = plan_worker(seq, rank=rank, world=world, worker=0, workers=1, batch_size=10, drop_last=True)
            assert {i // 400 for _, i in p.samples()} == set(range(8))


def test_consumed_by_worker_matches_round_robin():
    for workers in range(1, 5):
        for consumed in range(12):
            counts = Counter(b % workers for b in range(consumed))
            for w in range(workers):
                assert consumed_by_worker(consumed, worker=w, workers=workers) == counts[w]
                assert worker_batches(consumed, worker=w, workers=workers) == counts[w]


def test_resumed_roles_continue_the_round_robin_exactly():
    for workers in range(1, 6):
        for nb in range(0, 14):
            owner = {b: (b % workers, b // workers) for b in range(nb)}  # batch -> (worker, its k-th)
            for consumed in range(nb + 1):
                queues = []
                for w in range(workers):
                    role, skip = resumed_role(w, workers=workers, consumed=consumed)
                    mine = [(role, k) for k in range(worker_batches(nb, worker=role, workers=workers))]
                    queues.append(mine[skip:])
                got = []  # DataLoader: round-robin from worker 0, skipping exhausted workers
                while any(queues):
                    for q in queues:
                        if q:
                            got.append(q.pop(0))
                assert got == [owner[b] for b in range(consumed, nb)]


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(dict(rank=2, world=2), id="rank"),
        pytest.param(dict(worker=1, workers=1), id="worker"),
        pytest.param(dict(batch_size=0), id="batch"),
    ],
)
def test_bad_arguments_name_the_value(bad):
    kw = dict(seed=0, epoch=0, shuffle=False, rank=0, world=1, worker=0, workers=1, batch_size=2, drop_last=False)
    kw.update(bad)
    with pytest.raises(ValueError, match=next(iter(bad))):
        plan([3, 4], **kw)
