"""Resume on any topology, from the plan alone, over grids: a state saved under (world A,
workers a) after k batches per rank, loaded under (world B, workers b), reads every sample
not yet consumed exactly once over all ranks, the same number of batches on every rank."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardify.reader.plan.assign import batches_per_rank, sequence_length
from shardify.reader.plan.mix import epoch_sequence
from shardify.reader.plan.resume import PlanOptions, Segment, consumed_mask, remaining, resumed_sequence
from shardify.reader.plan.simulate import rank_batches

SIZES = [
    pytest.param([[7, 2, 13]], id="uneven"),
    pytest.param([[3, 3]], id="fewer-shards-than-ranks-x-workers"),
    pytest.param([[0, 5, 0, 1]], id="empty-shards"),
    pytest.param([[4, 9], [6]], id="two-streams"),
]


def opts(*, seed=0, batch_size=2, drop_last=False, shuffle=True, block=3, buffer=4):
    return PlanOptions(
        seed=seed, shuffle=shuffle, batch_size=batch_size, drop_last=drop_last, block=block, buffer=buffer
    )


def part(seq, o, *, epoch, world, workers, upto=None, consumed=0, segment=0):
    """Every rank's batches of ``seq``: ``[consumed, upto)``; checks that all ranks have as many."""
    per_rank = [
        rank_batches(seq, o, epoch=epoch, rank=r, world=world, workers=workers, consumed=consumed, segment=segment)
        for r in range(world)
    ]
    assert len({len(b) for b in per_rank}) == 1, "ranks yield different numbers of batches"
    return [b[: None if upto is None else upto - consumed] for b in per_rank]


def valid(parts):
    return Counter((s, i) for ranks in parts for batches in ranks for b in batches for s, i, ok in b if ok)


def everything(seq):
    return Counter((s, i) for s, a, b in seq for i in range(a, b))


def check_resume(streams, o, *, epoch, a, b, k, counts=None):
    """k batches per rank under a = (world, workers), the rest under b: exactly once, equal batches."""
    seq = epoch_sequence(streams, counts=counts, seed=o.seed, epoch=epoch, shuffle=o.shuffle, block=o.block)
    head = part(seq, o, epoch=epoch, world=a[0], workers=a[1], upto=k)
    history = (Segment(a[0], a[1], k),)
    rest_seq = resumed_sequence(seq, history, o, epoch=epoch)
    rest = part(rest_seq, o, epoch=epoch, world=b[0], workers=b[1], segment=1)
    n = sequence_length(seq)
    assert sequence_length(rest_seq) == n - len({(s, i) for r in head for bb in r for s, i, ok in bb if ok})
    assert len(rest[0]) == batches_per_rank(
        sequence_length(rest_seq), world=b[0], batch_size=o.batch_size, drop_last=o.drop_last
    )
    seen = valid([head, rest])
    if o.drop_last:
        assert max(seen.values(), default=1) == 1 and set(seen) <= set(everything(seq))
    else:
        assert seen == everything(seq)
    return head, rest


TOPOLOGIES = [(w, k) for w in range(1, 7) for k in (1, 2, 3)]


@pytest.mark.parametrize("streams", SIZES)
@pytest.mark.parametrize("drop_last", [False, True])
def test_resume_from_every_topology_into_every_other(streams, drop_last):
    o = opts(drop_last=drop_last, seed=5)
    n = sum(map(sum, streams))
    for a, b in itertools.product(TOPOLOGIES, TOPOLOGIES):
        nb = batches_per_rank(n, world=a[0], batch_size=o.batch_size, drop_last=drop_last)
        for k in sorted({0, 1, nb // 2, nb}):
            if k <= nb:
                check_resume(streams, o, epoch=1, a=a, b=b, k=k)


@given(
    sizes=st.lists(st.integers(0, 30), min_size=1, max_size=8),
    a=st.sampled_from(TOPOLOGIES + [(1, 4), (5, 4)]),
    b=st.sampled_from(TOPOLOGIES + [(1, 4), (5, 4)]),
    batch_size=st.integers(1, 5),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 50),
    cut=st.floats(0, 1),
    drop_last=st.booleans(),
)
@settings(max_examples=200, deadline=None)
def test_resume_anywhere_property(sizes, a, b, batch_size, seed, epoch, cut, drop_last):
    o = opts(seed=seed, batch_size=batch_size, drop_last=drop_last, block=1 + seed % 5, buffer=1 + seed % 7)
    nb = batches_per_rank(sum(sizes), world=a[0], batch_size=batch_size, drop_last=drop_last)
    check_resume([sizes], o, epoch=epoch, a=a, b=b, k=int(cut * nb))


def test_resumed_twice_keeps_a_list_of_segments():
    o = opts(seed=2)
    streams, epoch = [[11, 4, 20, 9]], 3
    seq = epoch_sequence(streams, counts=None, seed=2, epoch=epoch, shuffle=True, block=3)
    first = part(seq, o, epoch=epoch, world=3, workers=2, upto=2)
    h1 = (Segment(3, 2, 2),)
    seq1 = resumed_sequence(seq, h1, o, epoch=epoch)
    second = part(seq1, o, epoch=epoch, world=2, workers=3, upto=3, segment=1)
    h2 = h1 + (Segment(2, 3, 3),)
    seq2 = resumed_sequence(seq, h2, o, epoch=epoch)
    third = part(seq2, o, epoch=epoch, world=5, workers=1, segment=2)
    assert valid([first, second, third]) == everything(seq)


@pytest.mark.parametrize("world, workers", [(1, 1), (2, 3), (4, 2)])
def test_same_topology_continues_the_uninterrupted_run(world, workers):
    o = opts(seed=9)
    seq = epoch_sequence([[7, 2, 13, 5]], counts=None, seed=9, epoch=4, shuffle=True, block=3)
    full = part(seq, o, epoch=4, world=world, workers=workers)
    for k in range(len(full[0]) + 1):
        assert part(seq, o, epoch=4, world=world, workers=workers, consumed=k) == [r[k:] for r in full]


def test_remaining_keeps_order_and_merges_runs():
    seq = ((0, 0, 4), (2, 3, 6))
    assert remaining(seq, bytearray([0, 1, 0, 0, 1, 0, 0])) == ((0, 0, 1), (0, 2, 4), (2, 4, 6))
    assert remaining(seq, bytearray(7)) == seq
    assert remaining(seq, bytearray([1] * 7)) == ()


def test_a_segment_past_the_epoch_is_refused():
    seq = epoch_sequence([[4, 4]], counts=None, seed=0, epoch=0, shuffle=True, block=2)
    with pytest.raises(ValueError, match="more batches"):
        consumed_mask(seq, Segment(2, 1, 3), opts(), epoch=0)


@given(
    streams=st.lists(
        st.lists(st.integers(0, 12), min_size=1, max_size=4).filter(lambda s: sum(s) > 0), min_size=1, max_size=3
    ),
    ratios=st.lists(st.floats(0.05, 2.5), min_size=3, max_size=3),
    a=st.sampled_from(TOPOLOGIES + [(5, 4)]),
    b=st.sampled_from(TOPOLOGIES + [(5, 4)]),
    batch_size=st.integers(1, 5),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 40),
    cut=st.floats(0, 1),
    drop_last=st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_a_mixed_epoch_never_holds_a_sample_twice_resumed_anywhere(
    streams, ratios, a, b, batch_size, seed, epoch, cut, drop_last
):
    """Streams subsampled or oversampled (any epoch, so the extra part may cross the end of a
    pass), resumed on another topology anywhere: every sample of stream i is read count // N or
    count // N + 1 times (never twice while the stream has unseen ones), exactly once over the
    two topologies."""
    counts = [max(1, round(r * sum(s))) for s, r in zip(streams, ratios)]
    o = opts(seed=seed, batch_size=batch_size, drop_last=drop_last, block=1 + seed % 5, buffer=1 + seed % 7)
    nb = batches_per_rank(sum(counts), world=a[0], batch_size=batch_size, drop_last=drop_last)
    seq = epoch_sequence(streams, counts=counts, seed=o.seed, epoch=epoch, shuffle=o.shuffle, block=o.block)
    k = int(cut * nb)
    head = part(seq, o, epoch=epoch, world=a[0], workers=a[1], upto=k)
    rest_seq = resumed_sequence(seq, (Segment(a[0], a[1], k),), o, epoch=epoch)
    rest = part(rest_seq, o, epoch=epoch, world=b[0], workers=b[1], segment=1)
    got, first = everything(seq), 0
    for sizes, count in zip(streams, counts):
        n = sum(sizes)
        per = [got[(first + s, i)] for s, k in enumerate(sizes) for i in range(k)]
        assert set(per) <= {count // n, count // n + 1} and sum(per) == count
        first += len(sizes)
    seen = valid([head, rest])  # a sample the epoch holds twice is read twice, not thrice, across the resume
    assert seen == got if not drop_last else all(seen[x] <= got[x] for x in seen)
