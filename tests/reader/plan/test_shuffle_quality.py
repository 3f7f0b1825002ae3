"""Each rank's batches are a good sample of class-sorted shards at any world size.

The figure is the one ``shardify bench`` prints (``shardify.cli.bench.class_mixing``): mean distinct
classes per batch over every rank's batches, relative to a full random permutation's.
"""

from __future__ import annotations

import pytest

from shardify.cli.bench import class_mixing, permutation_classes


@pytest.mark.parametrize("world", [1, 2, 8])
def test_classes_per_batch_reach_nine_tenths_of_a_permutation(world):
    assert class_mixing(world=world) >= 0.9


def test_whole_shards_per_rank_fall_short_at_eight_ranks():
    """The layout before cross-rank shuffle: rank r saw only its eighth of the classes."""
    assert class_mixing(world=8, interleave=False) < 0.2


def test_permutation_figure():
    assert permutation_classes(classes=2, per_class=1, batch_size=2) == 2
    assert permutation_classes(classes=10, per_class=100, batch_size=1) == pytest.approx(1)
    assert 0 < permutation_classes(classes=100, per_class=1000, batch_size=256) < 100


# -- the shuffle buffer's ramp: a first batch early, the epoch as well mixed --------------------------


def _class_sorted_batches(*, world: int, epoch: int, workers: int = 4, batch_size: int = 256):
    """Rank 0's batches of 100 class-sorted shards of 1,000 samples (class = global index // 1000)."""
    from shardify.reader.plan.mix import block_sequence
    from shardify.reader.plan.resume import PlanOptions
    from shardify.reader.plan.simulate import rank_batches

    o = PlanOptions(seed=0, shuffle=True, batch_size=batch_size, drop_last=False, block=4, buffer=1024)
    seq = block_sequence([[1000] * 100], counts=None, seed=0, epoch=epoch, block=4)
    batches = rank_batches(seq, o, epoch=epoch, rank=0, world=world, workers=workers)
    return [[(s * 1000 + i) // 1000 for s, i, _ in b] for b in batches if len(b) == batch_size]


@pytest.mark.parametrize("world", [pytest.param(1, id="25000-per-worker"), pytest.param(8, id="3125-per-worker")])
def test_the_ramp_costs_little_mixing_over_the_epoch(world):
    """Class-sorted shards, blocks of 4 (the hard case: a block is 4 samples of one class).
    Only each worker's first batches, while its buffer grows, mix less."""
    full = permutation_classes(classes=100, per_class=1000, batch_size=256)
    for epoch in range(2):
        ramped = [len(set(b)) / full for b in _class_sorted_batches(world=world, epoch=epoch)]
        assert sum(ramped) / len(ramped) >= 0.9
        later = ramped[4 * 4 :]  # after each of the 4 workers' first 4 batches (its ramp: 3.75 batches)
        assert sum(later) / len(later) >= 0.9


def test_a_workers_first_batch_is_drawn_from_all_over_its_share():
    """The ramp starts emitting after 64 reads, but the reads are blocks of 4 from all over
    the worker's share: its first batch holds many classes, not the share's first samples."""
    from shardify.reader.plan.shuffle import array_order, numpy_rng, ramp_start

    full = permutation_classes(classes=100, per_class=1000, batch_size=256)
    for epoch in range(2):
        first = _class_sorted_batches(world=1, epoch=epoch)[:4]  # one per worker
        assert min(len(set(b)) for b in first) / full >= 0.6  # whole-shard reads would give 1 or 2 classes
    n, batch = 25_000, 64
    for seed in range(5):
        _, out = array_order(n, rng=numpy_rng(seed), block=4, buffer_size=1024, initial=ramp_start(1024))
        assert sum(p < n // 10 for p in out[:batch]) <= batch // 4  # ~1/10 of it from the share's first tenth
        assert max(out[:batch]) - min(out[:batch]) > n // 2
