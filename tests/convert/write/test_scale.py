"""Conversion at a billion inputs: the driver's samples and keys spilled to disk, the order of
a big split computed in parts, the listing read in parts; each gives what the small path
gives, byte for byte."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import shardify.records
from shardify.convert.inputs import listing_pool
from shardify.convert.inputs.listing import scan_listing
from shardify.convert.options import ConvertOptions
from shardify.convert.write import plan as plan_mod
from shardify.convert.write.plan import plan_split, shuffle_order, split_permutation
from shardify.convert.write.run import convert_listing
from shardify.permute import KeyedPermutation


def _listing(tmp_path: Path, rows: int = 60) -> Path:
    """Int labels, inline text and JSON, a file, IDs that clash into hashed keys, skipped rows."""
    (tmp_path / "f.bin").write_bytes(b"x" * 700)
    lines = [
        {"id": f"r{i:04d}", "label": i % 5, "text": "w" * (i % 7), **({"extra": {"i": i}} if i % 4 == 0 else {})}
        for i in range(rows)
    ]
    lines += [
        {"id": "dup/k", "label": 1},
        {"id": "dup__k", "label": 2},
        {"id": "odd id!", "label": 3},
        {"path": "f.bin", "label": 0},
        {"id": "bad", "label": -1},
        {"path": "missing.bin", "label": 1},
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def _plan_facts(plan) -> tuple:  # noqa: ANN001
    return (
        plan.fingerprint,
        plan.shard_sizes,
        plan.shard_bytes,
        list(plan.order),
        list(plan.keys),
        [(list(s.specs), list(s.keys)) for s in plan.shards],
    )


@pytest.mark.parametrize(
    "shape",
    [
        dict(samples_per_shard=7, shard_size=None),
        dict(samples_per_shard=None, shard_size=8192, min_shards=1, shuffle=False),
    ],
)
def test_plan_of_samples_and_keys_spilled_to_disk_is_the_plan_in_memory(tmp_path, monkeypatch, shape) -> None:
    listing = _listing(tmp_path)
    options = ConvertOptions(progress=False, workers=1, **shape)
    scan = scan_listing(listing)["train"]
    want = _plan_facts(plan_split(scan, options))
    assert not scan.samples._records.spilled
    monkeypatch.setattr(shardify.records, "SPILL_BYTES", 100)
    monkeypatch.setattr(plan_mod, "POOL_MIN_SAMPLES", 0)
    monkeypatch.setattr(plan_mod, "_CHUNK", 4)
    for workers in (1, 2):
        spilled = scan_listing(listing)["train"]
        plan = plan_split(spilled, replace(options, workers=workers))
        assert spilled.samples._records.spilled and plan.keys._records.spilled
        assert spilled.samples.resident_bytes <= 100 + 200  # the budget, plus the record that crossed it
        assert list(spilled.samples) == list(scan.samples)
        assert _plan_facts(plan) == want
        keys = list(plan.keys)  # the shards, end to end, are the samples in the plan's order
        assert [k for s in plan.shards for k in s.keys] == [keys[i] for i in plan.order]
        assert [tuple(x) for s in plan.shards for x in s.specs] == [tuple(scan.samples[i]) for i in plan.order]


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 15, 16, 17, 255, 1000, 4097])
def test_keyed_permutation_is_a_permutation_and_any_part_is_computed_alone(n: int) -> None:
    for seed in (0, 1, 12345):
        perm = split_permutation(n, seed=seed, split="train")
        whole = list(perm)
        assert sorted(whole) == list(range(n))
        parts = [perm[lo : lo + 7] for lo in range(0, n, 7)]
        assert (np.concatenate(parts).tolist() if parts else []) == whole
        assert [perm[i] for i in range(n)] == whole
        if n > 1:
            assert perm[-1] == whole[-1]
    if n >= 16:  # the seed and the split choose the order
        orders = {tuple(split_permutation(n, seed=s, split=sp)) for s in (0, 1) for sp in ("train", "val")}
        assert len(orders) == 4


def test_keyed_permutation_mixes_the_order() -> None:
    """Not a rotation or a near-identity: positions and samples are uncorrelated, and
    neighbours in the order come from all over the split."""
    n = 100_000
    order = split_permutation(n, seed=0, split="train")[0:n]
    assert abs(np.corrcoef(np.arange(n), order)[0, 1]) < 0.02
    assert np.median(np.abs(np.diff(order))) > n / 5


def test_a_big_split_is_ordered_by_the_keyed_permutation_and_a_small_one_as_before(tmp_path, monkeypatch) -> None:
    scan = scan_listing(_listing(tmp_path))["train"]
    n = len(scan.samples)
    options = ConvertOptions(progress=False, workers=1, samples_per_shard=9, seed=3)
    small = plan_split(scan, options)
    assert list(small.order) == list(shuffle_order(n, seed=3, split="train"))
    monkeypatch.setattr(plan_mod, "PERMUTE_MIN_SAMPLES", n)
    big = plan_split(scan, options)
    assert isinstance(big.order, KeyedPermutation)
    assert list(big.order) == list(split_permutation(n, seed=3, split="train"))
    assert big.fingerprint != small.fingerprint
    monkeypatch.setattr(plan_mod, "POOL_MIN_SAMPLES", 0)
    monkeypatch.setattr(plan_mod, "_CHUNK", 5)
    assert _plan_facts(plan_split(scan, replace(options, workers=2))) == _plan_facts(big)


def test_conversion_with_everything_in_parts_writes_the_same_bytes(
    tmp_path, monkeypatch, options, tree_bytes, spy_pools
) -> None:
    """Spilled tables, the listing read in parts, the plan in worker processes, the keyed
    permutation: the bytes of the one-process conversion with the same order rule, for
    any number of workers; and a rerun reuses every shard."""
    listing = _listing(tmp_path, rows=200)
    monkeypatch.setattr(plan_mod, "PERMUTE_MIN_SAMPLES", 10)
    convert_listing(listing, tmp_path / "one", options=options(workers=1, samples_per_shard=16))
    monkeypatch.setattr(shardify.records, "SPILL_BYTES", 256)
    monkeypatch.setattr(listing_pool, "POOL_MIN_BYTES", 0)
    monkeypatch.setattr(listing_pool, "PART_BYTES", 500)
    monkeypatch.setattr(plan_mod, "POOL_MIN_SAMPLES", 0)
    monkeypatch.setattr(plan_mod, "_CHUNK", 7)
    scans, plans = spy_pools(listing_pool), spy_pools(plan_mod)
    for workers in (2, 3):
        convert_listing(listing, tmp_path / f"w{workers}", options=options(workers=workers, samples_per_shard=16))
        assert tree_bytes(tmp_path / f"w{workers}") == tree_bytes(tmp_path / "one")
    assert (len(scans), len(plans)) == (2, 4)
    from shardify.convert.write import finish  # a run stopped after its shards, before its report: resumed

    def crash(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(finish, "write_report", crash)
        with pytest.raises(KeyboardInterrupt):
            convert_listing(listing, tmp_path / "resumed", options=options(workers=2, samples_per_shard=16))
    result = convert_listing(listing, tmp_path / "resumed", options=options(workers=2, samples_per_shard=16))
    assert result.splits["train"].reused_shards == result.splits["train"].shards > 10
    assert tree_bytes(tmp_path / "resumed") == tree_bytes(tmp_path / "one")
