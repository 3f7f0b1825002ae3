"""The vectorised plan equals a straightforward reference, field for field, over a grid.

``plan_worker`` (numpy starts, a binary search per piece) and ``stream_take`` (a pass of
shards laid out with numpy) must give exactly what the plain loops below give: the same
ranges (merged the same way), the same runs of sequence positions, the same totals. Any
difference would move samples between workers, or break resuming a saved state.
"""

from __future__ import annotations

import bisect
import itertools
import math

import numpy as np
import pytest

from shardify.reader.plan.assign import (
    WorkerPlan,
    append_range,
    batches_per_rank,
    plan_worker,
    samples_per_rank,
    sequence_starts,
)
from shardify.reader.plan.mix import epoch_sequence, stream_take
from shardify.reader.plan.shuffle import derive_seed, shard_order


def reference_plan(sequence, *, rank, world, worker, workers, batch_size, drop_last) -> WorkerPlan:
    """plan_worker written as one loop over the sequence's prefix sums and bisect."""
    cum = list(itertools.accumulate((b - a for _, a, b in sequence), initial=0))
    total = cum[-1]
    per = samples_per_rank(total, world=world, drop_last=drop_last)
    nb = batches_per_rank(total, world=world, batch_size=batch_size, drop_last=drop_last)
    out, runs = [], []
    for b in range(worker, nb, workers):
        lo = rank * per + b * batch_size
        hi = rank * per + min((b + 1) * batch_size, per)
        runs.append((lo, hi))
        while lo < hi:
            v = lo % total
            j = bisect.bisect_right(cum, v) - 1
            take = min(hi - lo, cum[j + 1] - v)
            shard, start, _ = sequence[j]
            append_range(out, shard, start + v - cum[j], start + v - cum[j] + take)
            lo += take
    return WorkerPlan(ranges=tuple(out), batch_size=batch_size, runs=tuple(runs), total=total)


def reference_whole(sizes, order, offset, lo, hi, out) -> None:
    start = 0
    for j in order:
        stop = start + sizes[j]
        if stop > lo and start < hi:
            append_range(out, offset + j, max(lo, start) - start, min(stop, hi) - start)
        start = stop


def reference_take(sizes, *, count, epoch, seed, shuffle, stream=0, offset=0):
    n = sum(sizes)
    out = []
    if not count:
        return out
    passes, rest = divmod(count, n)
    for j in range(passes):
        pass_seed = (
            (seed if stream == 0 else derive_seed("cycle", seed, stream))
            if j == 0
            else derive_seed("pass", seed, stream, j)
        )
        reference_whole(sizes, shard_order(len(sizes), seed=pass_seed, epoch=epoch, shuffle=shuffle), offset, 0, n, out)
    if rest:  # positions [e r, (e + 1) r) of one pass read round and round; a new pass each lcm(n, r)
        lo = epoch * rest
        cycle = lo // math.lcm(n, rest)
        order = shard_order(len(sizes), seed=derive_seed("rest", seed, stream), epoch=cycle, shuffle=shuffle)
        laid = [(offset + j, i) for j in order for i in range(sizes[j])]
        for p in range(lo, lo + rest):
            shard, i = laid[p % n]
            append_range(out, shard, i, i + 1)
    return out


SIZES = [
    pytest.param([7, 2, 13], id="7-2-13"),
    pytest.param([1], id="one-sample"),
    pytest.param([0, 5, 0, 3, 0], id="empty-shards"),
    pytest.param([4] * 9, id="equal"),
    pytest.param([100, 1, 1, 37], id="skewed"),
]

SEQUENCES = {
    "shards-in-order": lambda sizes: epoch_sequence([sizes], counts=None, seed=0, epoch=0, shuffle=False, block=3),
    "shards-shuffled": lambda sizes: epoch_sequence(
        [sizes], counts=None, seed=5, epoch=2, shuffle=True, block=3, interleave=False
    ),
    "blocks-of-3": lambda sizes: epoch_sequence([sizes], counts=None, seed=5, epoch=2, shuffle=True, block=3),
    "two-streams-oversampled": lambda sizes: epoch_sequence(
        [sizes, [3, 0, 2]], counts=[2 * sum(sizes) + 1, 4], seed=1, epoch=3, shuffle=True, block=2
    ),
    # ranges that continue each other and empty ones: merging and skipping must match
    "hand-made": lambda sizes: ((0, 0, 2), (0, 2, 5), (1, 3, 3), (2, 1, 4), (0, 5, 6), (3, 0, 0)),
}


@pytest.mark.parametrize("sizes", SIZES)
@pytest.mark.parametrize("kind", list(SEQUENCES))
@pytest.mark.parametrize("drop_last", [False, True])
def test_plan_worker_equals_the_reference(sizes, kind, drop_last):
    seq = SEQUENCES[kind](sizes)
    starts = sequence_starts(seq)
    for world, workers, batch_size in itertools.product((1, 2, 3, 7), (1, 2, 3), (1, 2, 5, 64)):
        for rank, worker in itertools.product(range(world), range(workers)):
            kw = dict(
                rank=rank, world=world, worker=worker, workers=workers, batch_size=batch_size, drop_last=drop_last
            )
            want = reference_plan(seq, **kw)
            assert plan_worker(seq, **kw) == want, kw
            assert plan_worker(seq, starts=starts, **kw) == want, kw


@pytest.mark.parametrize("sizes", SIZES)
@pytest.mark.parametrize("shuffle", [False, True])
def test_stream_take_equals_the_reference(sizes, shuffle):
    n = sum(sizes)
    for count, epoch, stream, offset in itertools.product(
        (0, 1, n - 1, n, n + 2, 3 * n + 5), (0, 1, 4), (0, 2), (0, 10)
    ):
        if count < 0 or (count and not n):
            continue
        kw = dict(count=count, epoch=epoch, seed=7, shuffle=shuffle, stream=stream, offset=offset)
        assert stream_take(sizes, **kw) == reference_take(sizes, **kw), kw


def test_starts_are_prefix_sums_and_bad_ranges_are_named():
    seq = ((0, 0, 2), (4, 3, 3), (1, 1, 6))
    assert sequence_starts(seq).tolist() == [0, 2, 2, 7]
    assert sequence_starts(()).tolist() == [0]
    with pytest.raises(ValueError, match=r"\(2, 5, 4\) at index 1"):
        sequence_starts(((0, 0, 2), (2, 5, 4)))
    with pytest.raises(ValueError, match=r"\(2, -1, 4\)"):
        plan_worker(((2, -1, 4),), rank=0, world=1, worker=0, workers=1, batch_size=1, drop_last=False)


def test_starts_of_another_sequence_are_refused():
    seq = ((0, 0, 2), (1, 0, 3))
    with pytest.raises(ValueError, match="starts has 2 entries, should be 3"):
        plan_worker(seq, rank=0, world=1, worker=0, workers=1, batch_size=1, drop_last=False, starts=np.array([0, 2]))


def reference_interleave(takes, *, block, seed, epoch):
    """Blocks of ``block`` positions of ``takes`` laid end to end, in the seeded order, one by one."""
    flat = [(s, i) for s, a, b in takes for i in range(a, b)]
    n = len(flat)
    if not n:
        return ()
    perm = np.random.RandomState(derive_seed("blocks", seed, epoch) % 2**32).permutation(-(-n // block))
    out = []
    for p in perm.tolist():
        first = p * block
        for s, i in flat[first : first + block]:
            if out and out[-1][0] == s and out[-1][2] == i and len(out[-1]) == 4 and out[-1][3] == p:
                out[-1] = (s, out[-1][1], i + 1, p)
            else:
                out.append((s, i, i + 1, p))
    return tuple((s, a, b) for s, a, b, _ in out)


@pytest.mark.parametrize("sizes", SIZES)
@pytest.mark.parametrize("block", [1, 2, 3, 8])
def test_interleaved_sequence_equals_the_reference(sizes, block):
    for streams, counts in (([sizes], None), ([sizes, [3, 0, 2]], [2 * sum(sizes) + 1, 4])):
        for seed, epoch in ((0, 0), (5, 3)):
            kw = dict(counts=counts, seed=seed, epoch=epoch, shuffle=True)
            takes = epoch_sequence(streams, block=block, interleave=False, **kw)
            got = epoch_sequence(streams, block=block, **kw)
            assert got == reference_interleave(takes, block=block, seed=seed, epoch=epoch), (streams, kw)


@pytest.mark.parametrize("few_across", [0, 10**9], ids=["one-by-one", "expand-all"])
def test_both_ways_of_cutting_blocks_equal_the_reference(monkeypatch, few_across):
    import shardify.reader.plan.mix as mix

    monkeypatch.setattr(mix, "_FEW_ACROSS", few_across)
    for sizes, block in itertools.product(([7, 2, 13], [4] * 9, [100, 1, 1, 37], [5]), (1, 2, 3, 8)):
        takes = epoch_sequence([sizes], counts=None, seed=3, epoch=1, shuffle=True, block=block, interleave=False)
        got = epoch_sequence([sizes], counts=None, seed=3, epoch=1, shuffle=True, block=block)
        assert got == reference_interleave(takes, block=block, seed=3, epoch=1), (sizes, block)
