"""The plan of a batch's ranges and requests (reader/io/rangeplan.py): every wanted sample read
once, in one run; runs join neighbours only within the gap and the size; requests group a
shard's runs only where its host takes many ranges, within the Range header's limit."""

from __future__ import annotations

import itertools
import random

import pytest

from shardify.multirange import MAX_RANGE_HEADER_BYTES, header_bytes
from shardify.reader.io.rangeplan import request_groups, sample_runs


def _ends(sizes: list[int]) -> list[int]:
    return [0, *itertools.accumulate(sizes)]


def _check_runs(runs: list, wanted: list, ends_of, gap_of, max_bytes: int) -> None:
    assert sorted((s, p) for s, ps in runs for p in ps) == sorted(set(wanted)), "each wanted sample once"
    assert runs == sorted(runs), "shard, then position order"
    for shard, ps in runs:
        ends = ends_of(shard)
        assert ps == sorted(set(ps))
        for a, b in itertools.pairwise(ps):
            assert ends[b] - ends[a + 1] <= gap_of(shard), "only neighbours within the gap joined"
        if len(ps) > 1:
            assert ends[ps[-1] + 1] - ends[ps[0]] <= max_bytes
    for (s1, ps1), (s2, ps2) in itertools.pairwise(runs):
        if s1 == s2:  # two runs of one shard were not joinable
            ends = ends_of(s1)
            apart = ends[ps2[0]] - ends[ps1[-1] + 1]
            assert apart > gap_of(s1) or ends[ps2[0] + 1] - ends[ps1[0]] > max_bytes


@pytest.mark.parametrize("seed", range(40))
def test_runs_hold_each_wanted_sample_once_and_join_only_what_may_be_joined(seed: int) -> None:
    rng = random.Random(seed)
    tables = {s: _ends([rng.randint(1, 3000) for _ in range(rng.randint(1, 60))]) for s in range(rng.randint(1, 4))}
    gaps = {s: rng.choice([0, 100, 2000, 10**9]) for s in tables}
    max_bytes = rng.choice([1, 3000, 20_000, 10**9])
    wanted = [(s, rng.randrange(len(tables[s]) - 1)) for s in tables for _ in range(rng.randint(0, 40))]
    runs = sample_runs(wanted, tables.__getitem__, gaps.__getitem__, max_bytes)
    _check_runs(runs, wanted, tables.__getitem__, gaps.__getitem__, max_bytes)


def test_runs_of_the_edges() -> None:
    ends = _ends([10, 10, 10, 10])
    assert sample_runs([], lambda s: ends, lambda s: 0, 100) == []
    assert sample_runs([(0, 1), (0, 1)], lambda s: ends, lambda s: 0, 100) == [(0, [1])]
    assert sample_runs([(0, 0), (0, 1)], lambda s: ends, lambda s: 0, 100) == [(0, [0, 1])], "touching: gap 0"
    assert sample_runs([(0, 0), (0, 2)], lambda s: ends, lambda s: 9, 100) == [(0, [0]), (0, [2])]
    assert sample_runs([(0, 0), (0, 2)], lambda s: ends, lambda s: 10, 100) == [(0, [0, 2])]
    assert sample_runs([(0, 0), (0, 1)], lambda s: ends, lambda s: 0, 19) == [(0, [0]), (0, [1])], "size"
    assert sample_runs([(1, 0), (0, 0)], lambda s: ends, lambda s: 10**9, 100) == [(0, [0]), (1, [0])]


@pytest.mark.parametrize("seed", range(40))
def test_requests_group_a_shards_runs_only_where_its_host_takes_many_ranges(seed: int) -> None:
    rng = random.Random(seed)
    shards = rng.randint(1, 4)
    tables = {s: _ends([rng.randint(1, 5000) for _ in range(rng.randint(1, 3000))]) for s in range(shards)}
    multi = {s: rng.random() < 0.7 for s in range(shards)}
    wanted = [(s, rng.randrange(len(tables[s]) - 1)) for s in tables for _ in range(rng.randint(0, 600))]
    runs = sample_runs(wanted, tables.__getitem__, lambda s: 0, 10**9)
    groups = request_groups(runs, tables.__getitem__, multi.__getitem__)
    assert [r for g in groups for r in g] == runs, "every run once, in order"
    for g in groups:
        shard = g[0][0]
        assert all(r[0] == shard for r in g), "a request reads one shard"
        ends = tables[shard]
        assert header_bytes([(ends[r[1][0]], ends[r[1][-1] + 1]) for r in g]) <= MAX_RANGE_HEADER_BYTES
        if not multi[shard]:
            assert len(g) == 1, "one request a run where the host refuses many ranges"
    for shard in range(shards):  # where many ranges are taken: as few requests as the header allows
        mine = [g for g in groups if g[0][0] == shard]
        if multi[shard] and len(mine) > 1:
            ends = tables[shard]
            for g, after in itertools.pairwise(mine):
                more = [(ends[r[1][0]], ends[r[1][-1] + 1]) for r in [*g, after[0]]]
                assert header_bytes(more) > MAX_RANGE_HEADER_BYTES, "a group ends only when full"
