"""Issue 10 (5): each rank's batches are a good sample of class-sorted shards at any world size.

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
