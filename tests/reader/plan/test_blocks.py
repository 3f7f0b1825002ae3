"""The plan's keyed block order each worker evaluates on its own share, over many
(seed, epoch, rank, world, worker, workers, sizes): a bijection, exactly once, equal batches,
the same plan as the listed sequence, and a resume on another topology."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from shardify.convert.write.plan import split_permutation
from shardify.permute import KeyedPermutation
from shardify.reader.plan.assign import batches_per_rank, plan_worker, samples_per_rank, sequence_starts
from shardify.reader.plan.blocks import BlockSequence
from shardify.reader.plan.mix import block_sequence, epoch_sequence
from shardify.reader.plan.resume import PlanOptions, Segment, consumed_mask, resumed_sequence
from shardify.reader.plan.shuffle import array_order, numpy_rng, reorder

SIZES = [[7, 2, 13], [1], [0, 5, 0, 3], [4] * 9, [100, 1, 1, 37], [3, 3], [64] * 5]


def all_samples(sizes):
    return [(s, i) for s, n in enumerate(sizes) for i in range(n)]


def listed(seq):
    return [(s, i) for s, a, b in seq for i in range(a, b)]


def test_keyed_permutation_is_a_bijection_for_every_small_n():
    for n in range(0, 300):
        for label in ("a", "b:1"):
            got = KeyedPermutation(n, label=label).at(np.arange(n))
            assert sorted(got.tolist()) == list(range(n)), (n, label)
    with pytest.raises(IndexError):
        KeyedPermutation(5, label="a").at(np.array([5]))


def test_the_converters_order_is_the_labelled_permutation():
    assert (
        split_permutation(1000, seed=3, split="train").positions(0, 1000).tolist()
        == KeyedPermutation(1000, label="3:train").positions(0, 1000).tolist()
    )


@pytest.mark.parametrize("sizes", SIZES)
def test_every_sample_once_and_whole_blocks_stay_whole(sizes):
    for seed, epoch, block in itertools.product((0, 7), (0, 1, 5), (1, 2, 3, 4, 16)):
        seq = block_sequence([sizes], counts=None, seed=seed, epoch=epoch, block=block)
        assert seq.total == sum(sizes)
        assert sorted(listed(seq)) == all_samples(sizes), (seed, epoch, block)
        src = seq.source_positions(np.arange(seq.total))
        assert sorted(src.tolist()) == list(range(seq.total))
        whole = seq.total // block * block  # each whole block is `block` consecutive positions of the takes
        if whole:
            runs = src[:whole].reshape(-1, block)
            assert (np.diff(runs, axis=1) == 1).all() and (runs[:, 0] % block == 0).all()
        assert src[whole:].tolist() == list(range(whole, seq.total))  # the partial block stays last


def test_deterministic_per_seed_and_epoch():
    sizes = [50, 30, 70, 10]

    def one(seed, epoch):
        return listed(block_sequence([sizes], counts=None, seed=seed, epoch=epoch, block=4))

    assert one(1, 2) == one(1, 2)
    assert one(1, 2) != one(1, 3) and one(1, 2) != one(2, 2)


@pytest.mark.parametrize("sizes", SIZES)
def test_plans_cover_the_epoch_exactly_once_with_equal_batches(sizes):
    for seed, epoch, world, workers, batch, drop_last, block in itertools.product(
        (0, 3), (0, 2), (1, 2, 5), (1, 3), (1, 7), (False, True), (2, 4)
    ):
        seq = block_sequence([sizes], counts=None, seed=seed, epoch=epoch, block=block)
        total = seq.total
        got: Counter = Counter()
        nb = batches_per_rank(total, world=world, batch_size=batch, drop_last=drop_last)
        for rank in range(world):
            plans = [
                plan_worker(
                    seq, rank=rank, world=world, worker=w, workers=workers, batch_size=batch, drop_last=drop_last
                )
                for w in range(workers)
            ]
            assert sum(p.num_batches for p in plans) == nb  # every rank yields the same batches
            for p in plans:
                assert all(n == batch for n in p.batch_sizes()[:-1])
                repeats = p.repeats()
                got.update(x for k, x in enumerate(p.samples()) if k not in repeats)
        per = samples_per_rank(total, world=world, drop_last=drop_last)
        if drop_last:
            assert max(got.values(), default=1) == 1 and sum(got.values()) == world * (per // batch * batch)
        else:
            assert sorted(got.elements()) == all_samples(sizes), (seed, epoch, world, workers, batch)


@pytest.mark.parametrize("sizes", SIZES)
def test_a_share_equals_the_same_share_of_the_listed_sequence(sizes):
    for seed, world, workers, batch, drop_last in itertools.product((1, 4), (1, 2, 3), (1, 2), (1, 5), (False, True)):
        seq = block_sequence([sizes], counts=None, seed=seed, epoch=1, block=3)
        flat = tuple(seq)
        assert sequence_starts(seq) is None
        for rank, w in itertools.product(range(world), range(workers)):
            kw = dict(rank=rank, world=world, worker=w, workers=workers, batch_size=batch, drop_last=drop_last)
            assert plan_worker(seq, **kw) == plan_worker(flat, **kw)


def test_weighted_streams_take_their_counts():
    streams, counts = [[5, 3], [4, 0, 2]], [19, 4]
    for epoch in range(4):
        seq = block_sequence(streams, counts=counts, seed=2, epoch=epoch, block=2)
        got = Counter(listed(seq))
        first = Counter(x for x in got.elements() if x[0] < 2)
        assert sum(first.values()) == 19 and set(first.values()) <= {2, 3}  # 19 of 8: twice or three times
        second = Counter(x for x in got.elements() if x[0] >= 2)
        assert sum(second.values()) == 4 and set(second.values()) == {1}


def test_resume_on_another_topology_reads_the_rest_once():
    sizes = [30, 17, 9, 44]
    opts = PlanOptions(seed=5, shuffle=True, batch_size=4, drop_last=False, block=3, buffer=8)
    seq = block_sequence([sizes], counts=None, seed=5, epoch=3, block=3)
    first = Segment(world=2, workers=2, batches=5)
    mask = consumed_mask(seq, first, opts, epoch=3)
    assert mask == consumed_mask(tuple(seq), first, opts, epoch=3)
    done = [x for x, m in zip(listed(seq), mask) if m]
    rest = resumed_sequence(seq, [first], opts, epoch=3)
    assert sorted(done + listed(rest)) == all_samples(sizes) and len(done) == 2 * 5 * 4


def test_a_bad_take_is_refused():
    with pytest.raises(ValueError):
        BlockSequence(np.array([0]), np.array([0, 1]), np.array([3]), block=2, seed=0, epoch=0)
    with pytest.raises(ValueError):
        block_sequence([[3]], counts=None, seed=0, epoch=0, block=0)


def test_the_takes_are_the_legacy_epochs_samples():
    """Same samples as the whole epoch's interleaved permutation, in another order."""
    sizes = [11, 6, 0, 23]
    new = listed(block_sequence([sizes], counts=None, seed=4, epoch=1, block=4))
    old = listed(epoch_sequence([sizes], counts=None, seed=4, epoch=1, shuffle=True, block=4))
    assert sorted(new) == sorted(old) and new != old


def test_array_order_is_two_permutations_within_the_buffers_bound():
    """The buffer's bounds: output ``k`` among the first ``k + buffer`` items read, the first
    output among the first ``initial``; reorder never holds more than the buffer."""
    for n, block, buffer, initial in itertools.product((0, 1, 5, 37, 300), (1, 3, 4), (1, 2, 16, 64), (None, 1, 4)):
        read, out = array_order(n, rng=numpy_rng("t", n, block), block=block, buffer_size=buffer, initial=initial)
        assert sorted(read) == sorted(out) == list(range(n)), (n, block, buffer, initial)
        j = 0
        while j < n:  # read in whole runs of `block` (the last one shorter), each from its start
            f = read[j]
            run = list(range(f, min(f + block, n)))
            assert f % block == 0 and read[j : j + len(run)] == run
            j += len(run)
        where = {p: k for k, p in enumerate(read)}  # the read step of each position
        for k, p in enumerate(out):
            assert where[p] < k + buffer, (n, block, buffer, initial, k)
        assert not out or where[out[0]] < min(initial or buffer, buffer)
        held = 0
        source = iter([(p, p) for p in read])

        def counting_source(items):
            nonlocal held
            for item in items:
                held += 1
                yield item

        got = []
        for x in reorder(counting_source(source), out):
            got.append(x)
            assert held - len(got) <= buffer  # items read but not yet emitted
        assert got == out


def test_array_order_is_seeded_and_shuffles():
    a = array_order(500, rng=numpy_rng("s", 1), block=4, buffer_size=64, initial=4)
    assert a == array_order(500, rng=numpy_rng("s", 1), block=4, buffer_size=64, initial=4)
    assert a != array_order(500, rng=numpy_rng("s", 2), block=4, buffer_size=64, initial=4)
    assert a[1] != sorted(a[1]) and a[0] != a[1]


def test_the_block_order_is_keyed_by_seed_and_epoch():
    """The same takes give another block order in another epoch or with another seed."""
    takes = (np.array([0, 1]), np.array([0, 0]), np.array([400, 200]))

    def order(seed, epoch):
        return BlockSequence(*takes, block=4, seed=seed, epoch=epoch).source_positions(np.arange(600)).tolist()

    assert order(1, 2) == order(1, 2)
    assert order(1, 2) != order(1, 3) and order(1, 2) != order(2, 2)
