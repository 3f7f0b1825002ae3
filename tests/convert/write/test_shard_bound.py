"""Small datasets make enough shards for every core: the bound depends on the data only."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardify.convert import options as options_mod
from shardify.convert.options import DEFAULT_SHARD_SIZE, MIN_SMALL_SHARD, ConvertOptions
from shardify.convert.synth import make_imagefolder
from shardify.convert.write.run import convert_imagefolder

MB = 1000**2


@pytest.mark.parametrize(
    "shard_size,min_shards,payload,want",
    [
        pytest.param(DEFAULT_SHARD_SIZE, 32, 265 * MB, MIN_SMALL_SHARD, id="265MB-folder-16MB-shards"),
        pytest.param(DEFAULT_SHARD_SIZE, 32, 2_000 * MB, 62_500_000, id="2GB-32-shards"),
        pytest.param(DEFAULT_SHARD_SIZE, 32, 150_000 * MB, DEFAULT_SHARD_SIZE, id="imagenet-unchanged"),
        pytest.param(DEFAULT_SHARD_SIZE, 1, 265 * MB, DEFAULT_SHARD_SIZE, id="disabled"),
        pytest.param(1 * MB, 32, 10 * MB, 1 * MB, id="explicit-small-size-kept"),
        pytest.param(None, 32, 10 * MB, None, id="count-bound-only"),
    ],
)
def test_shard_bound(shard_size, min_shards, payload, want) -> None:
    opts = ConvertOptions(shard_size=shard_size, min_shards=min_shards, samples_per_shard=None if shard_size else 5)
    assert opts.shard_bound(payload) == want


def test_small_dataset_is_split_into_min_shards_whatever_the_workers(tmp_path: Path, monkeypatch, tree_bytes) -> None:
    monkeypatch.setattr(options_mod, "MIN_SMALL_SHARD", 4096)  # the 16 MB floor, scaled to a test dataset
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=12, sizes=((48, 40),))
    outs = []
    for workers in (1, 2):
        opts = ConvertOptions(workers=workers, progress=False, fsync=False, min_shards=8)
        result = convert_imagefolder(src, tmp_path / f"w{workers}", options=opts)
        assert 8 <= result.splits["train"].shards <= 16, "about min_shards shards instead of one"
        outs.append(tree_bytes(tmp_path / f"w{workers}"))
    assert outs[0] == outs[1]


@pytest.mark.parametrize(
    "argv,want", [([], 10_000), (["--samples-per-shard", "0"], None), (["--samples-per-shard", "50"], 50)]
)
def test_samples_per_shard_default_bounds_the_header_scan(argv, want) -> None:
    from shardify.cli import build_parser
    from shardify.cli.convert import convert_options
    from shardify.convert.options import DEFAULT_SAMPLES_PER_SHARD

    args = build_parser().parse_args(["convert", "listing", "x.jsonl", "out", *argv])
    assert convert_options(args).samples_per_shard == want
    assert ConvertOptions().samples_per_shard == DEFAULT_SAMPLES_PER_SHARD == 10_000
