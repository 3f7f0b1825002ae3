"""Conversion on a real local Ray instance, and output to an fsspec URL: the same bytes as locally."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardify.convert.run import convert_imagefolder
from shardify.convert.synth import make_imagefolder

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def source(tmp_path: Path, make_image) -> Path:
    root = make_imagefolder(tmp_path / "src", classes=3, per_class=5, sizes=((64, 48),))
    (root / "n00000001" / "broken.jpg").write_bytes(make_image()[:300])
    return root


def test_ray_output_is_byte_identical_to_local(local_ray, source: Path, tmp_path: Path, options, tree_bytes) -> None:
    local = convert_imagefolder(source, tmp_path / "local", options=options(samples_per_shard=4))
    on_ray = convert_imagefolder(source, tmp_path / "ray", options=options(samples_per_shard=4, engine="ray"))
    assert tree_bytes(tmp_path / "ray") == tree_bytes(tmp_path / "local")
    assert [p.path for p in on_ray.splits["train"].skipped] == ["n00000001/broken.jpg"]
    assert on_ray.splits["train"].samples == local.splits["train"].samples == 15


def test_ray_strict_error_names_the_remote_file(local_ray, source: Path, tmp_path: Path, options) -> None:
    from shardify.errors import InputError

    with pytest.raises(InputError, match=r"^n00000001/broken\.jpg \(key 'n00000001__broken'\): cannot decode jpg"):
        convert_imagefolder(source, tmp_path / "out", options=options(samples_per_shard=4, engine="ray", strict=True))
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_fsspec_url_output_matches_local(source: Path, tmp_path: Path, options, tree_bytes) -> None:
    pytest.importorskip("fsspec")
    convert_imagefolder(source, tmp_path / "local", options=options(samples_per_shard=4, workers=2))
    convert_imagefolder(source, f"file://{tmp_path / 'url'}", options=options(samples_per_shard=4, workers=2))
    assert tree_bytes(tmp_path / "url") == tree_bytes(tmp_path / "local")
    manifest = json.loads((tmp_path / "url" / "manifest.json").read_text())
    assert manifest["splits"]["train"]["samples"] == 15


def test_ray_to_fsspec_url_resumes_after_failure(local_ray, source: Path, tmp_path: Path, options, tree_bytes) -> None:
    convert_imagefolder(source, tmp_path / "ref", options=options(samples_per_shard=4))
    url = f"file://{tmp_path / 'url'}"
    with pytest.MonkeyPatch.context() as mp:
        from shardify.convert import run

        def crash(*a, **k):
            raise KeyboardInterrupt

        mp.setattr(run, "_write_report", crash)
        with pytest.raises(KeyboardInterrupt):
            convert_imagefolder(source, url, options=options(samples_per_shard=4, engine="ray"))
    assert not (tmp_path / "url" / "manifest.json").exists()
    result = convert_imagefolder(source, url, options=options(samples_per_shard=4, engine="ray"))
    assert result.splits["train"].reused_shards == 4
    assert tree_bytes(tmp_path / "url") == tree_bytes(tmp_path / "ref")
