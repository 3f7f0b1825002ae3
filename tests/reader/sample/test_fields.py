"""Output fields checked against the split when the dataset is built; defaults from what it holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shardify.errors import FieldError
from shardify.reader import ShardedDataset
from shardify.reader.sample.fields import output_fields


@pytest.mark.parametrize(
    "requested, held, expected",
    [
        pytest.param(None, ("cls", "jpg", "json"), ("image", "cls"), id="images-labels"),
        pytest.param(None, ("json", "png"), ("image",), id="images-no-labels"),
        pytest.param(None, (), ("image", "cls"), id="unknown-shards-without-index"),
        pytest.param(None, ("cls", "json", "pt"), ("pt", "cls"), id="tensor"),
        pytest.param(None, ("cls", "json", "npy", "pt", "txt"), ("pt", "cls"), id="tensor-preferred"),
        pytest.param(None, ("cls", "npy"), ("npy", "cls"), id="array"),
        pytest.param(None, ("json", "txt"), ("txt",), id="single-data-field"),
        pytest.param(("txt", "cls"), ("cls", "txt"), ("txt", "cls"), id="requested-held"),
        pytest.param(("jpg;png", "cls"), ("cls", "png"), ("jpg;png", "cls"), id="alternatives"),
        pytest.param(None, ("json", "seg.png"), ("seg.png",), id="image-is-an-exact-extension"),
        pytest.param(("npy",), (), ("npy",), id="unknown-not-checked"),
    ],
)
def test_output_fields(requested, held, expected) -> None:
    assert output_fields(requested, held, where="ds") == expected


@pytest.mark.parametrize(
    "requested, held, message",
    [
        pytest.param(
            ("image", "cls"),
            ("cls", "json", "pt"),
            r"ds: no field 'image' in this split \(its samples hold cls, json, pt\)",
            id="image-on-tensors",
        ),
        pytest.param(("jpg", "cls"), ("cls", "png"), "no field 'jpg'", id="jpg-on-png"),
        pytest.param(None, ("cls", "json", "txt", "wav"), "no images and no single data field", id="ambiguous"),
    ],
)
def test_output_fields_errors(requested, held, message) -> None:
    with pytest.raises(FieldError, match=message):
        output_fields(requested, held, where="ds")


def _tensor_dataset(tmp_path: Path) -> Path:
    from shardify.convert.options import ConvertOptions
    from shardify.convert.write.run import convert_ids

    data = tmp_path / "data"
    data.mkdir()
    for i in range(5):
        torch.save(torch.full((3,), float(i)), data / f"id{i}.pt")
    (tmp_path / "p.json").write_text('{"train": ["id0", "id1", "id2", "id3", "id4"]}')
    (tmp_path / "l.json").write_text('{"id0": 0, "id1": 1, "id2": 0, "id3": 1, "id4": 0}')
    convert_ids(
        data,
        tmp_path / "out",
        partition=tmp_path / "p.json",
        labels=tmp_path / "l.json",
        options=ConvertOptions(workers=1, progress=False, fsync=False),
    )
    return tmp_path / "out"


def test_dataset_without_images_reads_its_tensor_field_by_default(tmp_path: Path) -> None:
    out = _tensor_dataset(tmp_path)
    ds = ShardedDataset(out, batch_size=5)
    x, y = next(iter(ds))
    assert x.shape == (5, 3) and sorted(x[:, 0].tolist()) == [0, 1, 2, 3, 4]
    assert sorted(y.tolist()) == [0, 0, 0, 1, 1]
    with pytest.raises(FieldError, match=r"no field 'image' .*hold cls, json, pt"):
        ShardedDataset(out, batch_size=5, fields=("image", "cls"))


def test_bench_on_a_dataset_without_images_says_what_it_cannot_measure(tmp_path: Path) -> None:
    from shardify.cli.bench import format_bench, run_bench

    r = run_bench(_tensor_dataset(tmp_path), batch_size=2, num_workers=0, epochs=1)
    assert r["loader_ips"] > 0 and r["fields"] == ["pt", "cls"]
    assert "holds no images" in r["not_measured"] and "(a)" in r["not_measured"]
    text = format_bench(r)
    assert "not measured" in text and "samples/s" in text
