"""Weighted mixing and epoch size, from the plan alone, over grids: exact per-stream counts,
every sample of a stream once per cycle, equal batches on every rank."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardify.reader.plan.assign import batches_per_rank
from shardify.reader.plan.mix import epoch_sequence, stream_counts, stream_take
from shardify.reader.plan.resume import PlanOptions
from shardify.reader.plan.simulate import rank_batches


@pytest.mark.parametrize(
    "total, weights, want",
    [
        pytest.param(10, [3, 1, 0.5], [7, 2, 1], id="largest-remainder"),
        pytest.param(4, [1, 1, 1], [2, 1, 1], id="ties-to-the-first"),
        pytest.param(0, [2, 5], [0, 0], id="empty-epoch"),
        pytest.param(1_000_000, [3, 1, 0.5], [666667, 222222, 111111], id="three-weights"),
    ],
)
def test_stream_counts(total, weights, want):
    assert stream_counts(total, weights) == want


@pytest.mark.parametrize("weights", [[], [1, 0], [-1]])
def test_bad_weights_are_refused(weights):
    with pytest.raises(ValueError, match="weights"):
        stream_counts(5, weights)


@given(total=st.integers(0, 10_000), weights=st.lists(st.floats(0.01, 100), min_size=1, max_size=6))
def test_counts_add_up_and_follow_weights(total, weights):
    counts = stream_counts(total, weights)
    assert sum(counts) == total
    assert all(abs(c - total * w / sum(weights)) < 1 for c, w in zip(counts, weights))


def samples(ranges):
    return [(s, i) for s, a, b in ranges for i in range(a, b)]


def check_walk(sizes, count, *, seed, shuffle, epochs, first=0):
    """Epochs ``first..first+epochs`` of one stream: within an epoch each sample ``count // N`` or
    ``count // N + 1`` times (never twice in the extra part); over consecutive epochs from a cycle's
    start, each sample used once before any twice (use counts never differ by more than one)."""
    n = sum(sizes)
    every = [(s, i) for s, k in enumerate(sizes) for i in range(k)]
    used = Counter({x: 0 for x in every})
    subsets = set()
    for e in range(first, first + epochs):
        got = Counter(samples(stream_take(sizes, count=count, epoch=e, seed=seed, shuffle=shuffle)))
        assert sum(got.values()) == count
        assert set(got) <= set(every)
        assert set(got.values()) <= {count // n, count // n + 1}, (e, got.most_common(3))
        used.update(got)
        assert max(used.values()) - min(used.values()) <= 1, e
        subsets.add(tuple(sorted(got.items())))
    assert count % n == 0 or len(subsets) > 1  # a partial take is a new subset each epoch


@pytest.mark.parametrize("sizes", [[7, 2, 13], [5], [0, 4, 0, 3], [1, 1], [523]])
@pytest.mark.parametrize("count", [1, 3, 7, 10, 22, 50, 300])
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_sample_once_per_cycle_over_consecutive_epochs(sizes, count, shuffle):
    check_walk(sizes, count, seed=4, shuffle=shuffle, epochs=3 * sum(sizes) + 2)


def test_the_issue_example_523_samples_at_300_an_epoch():
    """A stream of 523 samples at 300 an epoch: the epoch across the end of a pass (epoch 1)
    used to hold samples twice (37, 0 and 77 of them for seeds 0, 1, 2). Every epoch holds 300
    distinct samples now, and epochs 0 and 1 between them use 523 distinct samples before any
    comes back."""
    sizes = [40] * 13 + [3]
    for seed in range(3):
        check_walk(sizes, 300, seed=seed, shuffle=True, epochs=30)
        two = samples(stream_take(sizes, count=300, epoch=0, seed=seed, shuffle=True))
        two += samples(stream_take(sizes, count=300, epoch=1, seed=seed, shuffle=True))
        assert len(set(two[:523])) == 523


@given(
    sizes=st.lists(st.integers(0, 9), min_size=1, max_size=6).filter(lambda s: sum(s) > 0),
    count=st.integers(1, 60),
    seed=st.integers(0, 2**32),
    shuffle=st.booleans(),
    cycle=st.integers(0, 50),
)
def test_walk_property_from_any_cycle_start(sizes, count, seed, shuffle, cycle):
    n, rest = sum(sizes), count % sum(sizes)
    per_cycle = n // math.gcd(n, rest) if rest else 1  # epochs until a pass and an epoch end together
    check_walk(sizes, count, seed=seed, shuffle=shuffle, epochs=min(2 * per_cycle + 1, 40), first=cycle * per_cycle)


def test_stream_zero_of_one_source_is_the_old_epoch_order():
    from shardify.reader.plan.assign import shard_sequence
    from shardify.reader.plan.shuffle import shard_order

    sizes = [4, 9, 1, 6]
    for e in range(4):
        assert tuple(stream_take(sizes, count=20, epoch=e, seed=3, shuffle=True)) == shard_sequence(
            sizes, shard_order(4, seed=3, epoch=e)
        )


def test_empty_stream_asked_for_samples_is_refused():
    with pytest.raises(ValueError, match="stream 1 has no samples"):
        epoch_sequence([[3], [0]], counts=[2, 1], seed=0, epoch=0, shuffle=True, block=2)


STREAMS = [
    pytest.param([[7, 2, 13], [5, 5]], [20, 4], id="subset-and-oversample"),
    pytest.param([[3, 3], [1], [10]], [4, 9, 2], id="three-fewer-shards-than-ranks"),
    pytest.param([[30]], [11], id="one-source-subset"),
    pytest.param([[4]], [13], id="one-source-oversampled"),
]


def stream_of(streams):
    first = list(itertools.accumulate(map(len, streams), initial=0))
    return lambda shard: next(i for i in range(len(streams)) if first[i] <= shard < first[i + 1])


@pytest.mark.parametrize("streams, counts", STREAMS)
@pytest.mark.parametrize("drop_last", [False, True])
def test_mixed_epochs_over_many_worlds(streams, counts, drop_last):
    which = stream_of(streams)
    for world, workers, batch_size in itertools.product(range(1, 7), range(1, 5), (1, 3, 4)):
        for seed, epoch in ((0, 0), (7, 3), (2, 1)):
            o = PlanOptions(seed=seed, shuffle=True, batch_size=batch_size, drop_last=drop_last, block=2, buffer=5)
            seq = epoch_sequence(streams, counts=counts, seed=seed, epoch=epoch, shuffle=True, block=2)
            nb = batches_per_rank(sum(counts), world=world, batch_size=batch_size, drop_last=drop_last)
            per_stream: Counter = Counter()
            per_sample: Counter = Counter()
            for rank in range(world):
                got = rank_batches(seq, o, epoch=epoch, rank=rank, world=world, workers=workers)
                assert len(got) == nb
                per_stream.update(which(s) for b in got for s, _, ok in b if ok)
                per_sample.update((s, i) for b in got for s, i, ok in b if ok)
            if not drop_last:
                assert [per_stream[i] for i in range(len(streams))] == list(counts)
                for i, (sizes, count) in enumerate(zip(streams, counts)):  # floor or ceil, never twice in a subset
                    n, first = sum(sizes), sum(map(len, streams[:i]))
                    reads = {per_sample[(first + s, j)] for s, k in enumerate(sizes) for j in range(k)}
                    assert reads <= {count // n, count // n + 1}, (i, reads)
            else:
                assert sum(per_stream.values()) > sum(counts) - world * batch_size


def test_batches_mix_the_streams():
    streams, counts = [[500] * 4, [500] * 4], [1000, 1000]
    seq = epoch_sequence(streams, counts=counts, seed=1, epoch=0, shuffle=True, block=4)
    o = PlanOptions(seed=1, shuffle=True, batch_size=64, drop_last=True, block=4, buffer=256)
    batches = rank_batches(seq, o, epoch=0, rank=0, world=1, workers=2)
    both = sum(1 for b in batches if {s < 4 for s, _, _ in b} == {True, False})
    assert both == len(batches)
    a = epoch_sequence(streams, counts=counts, seed=1, epoch=1, shuffle=True, block=4)
    assert a != seq and a == epoch_sequence(streams, counts=counts, seed=1, epoch=1, shuffle=True, block=4)
