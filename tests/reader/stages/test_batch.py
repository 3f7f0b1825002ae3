"""The batching stages: Cut, Bucketed and Fill, each saved and restored at every midpoint."""

from __future__ import annotations

import random
from typing import Any

import pytest

from shardify.errors import SampleError
from shardify.reader.sample.bad import Bad
from shardify.reader.stages.base import Mapped
from shardify.reader.stages.batch import Bucketed, Cut, Fill
from shardify.reader.stages.read import Read

RANGES = ((0, 0, 10), (1, 0, 7))
N = 17


def _values(reader: Any, bad: frozenset[int] = frozenset()) -> Read | Mapped:
    def value(pair: tuple[int, Any]) -> Any:
        p, item = pair
        return Bad("shard", str(p), "broken", lost=False) if p in bad else item["x"]

    return Mapped(Read(reader(), RANGES, list(range(N))), value)


def test_cut_gives_the_plans_sizes_and_restores(check_midpoints: Any, fake_reader: Any) -> None:
    full = check_midpoints(lambda: Cut(_values(fake_reader), [5, 5, 5, 2]))
    assert [len(g) for g in full] == [5, 5, 5, 2]
    assert full[3] == [105, 106]


def test_cut_says_when_its_source_ends_early(fake_reader: Any) -> None:
    with pytest.raises(RuntimeError, match="within batch 3"):
        list(Cut(_values(fake_reader), [5, 5, 5, 5]))


def test_bucketed_groups_by_length_and_restores_by_replaying(check_midpoints: Any, fake_reader: Any) -> None:
    def make() -> Bucketed:
        return Bucketed(
            lambda: _values(fake_reader, frozenset({3})),
            batch_size=4,
            length=lambda x: x % 7,
            buffer_size=8,
            make_rng=lambda: random.Random(5),
        )

    full = check_midpoints(make)
    assert len(full) == 5 and sorted(map(len, full)) == [1, 4, 4, 4, 4]
    assert sum(isinstance(x, Bad) for g in full for x in g) == 1


@pytest.mark.parametrize("bad", [frozenset(), frozenset({0, 7}), frozenset(range(5, 12)), frozenset(range(0, 10))])
def test_fill_replaces_bad_samples_by_repeats_and_restores(
    bad: frozenset[int], check_midpoints: Any, fake_reader: Any
) -> None:
    seen: list[Bad] = []
    full = check_midpoints(lambda: Fill(Cut(_values(fake_reader, bad), [5, 5, 5, 2]), on_bad=seen.append))
    assert [len(g) for g in full] == [5, 5, 5, 2]
    assert not any(isinstance(x, Bad) for g in full for x in g)
    good = [100 * (p >= 10) + (p % 10 if p < 10 else p - 10) for p in range(N) if p not in bad]
    assert {x for g in full for x in g} == set(good)


def test_fill_pads_a_trailing_all_bad_batch_with_the_last_good_sample(fake_reader: Any) -> None:
    full = list(Fill(Cut(_values(fake_reader, frozenset(range(15, 17))), [5, 5, 5, 2]), on_bad=lambda b: None))
    assert full[3] == [104, 104]


def test_fill_raises_when_no_good_sample_is_left(fake_reader: Any) -> None:
    with pytest.raises(SampleError, match="every sample of this worker's 4 remaining batches"):
        list(Fill(Cut(_values(fake_reader, frozenset(range(N))), [5, 5, 5, 2]), on_bad=lambda b: None))
