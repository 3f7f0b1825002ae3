"""Hugging Face ``datasets`` reads shardify's shards: ``load_dataset("webdataset", data_files=...)``.

For every input kind (imagefolder, ids, listing, ShardWriter, convert_items) and image format
(jpg, png, webp, bmp, ``--image-format``, ``--max-side``), every sample must come back as a
row with every field it holds. Where ``datasets`` cannot (it infers the columns from the
first 5 samples of the first shard), the test pins down what happens, as README says: a
ValueError when those samples differ in fields, fields first seen later dropped silently,
and the ways around it (one image format, ``--metadata always``, ``features=``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("datasets")

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("shardify_hf_cases", HERE / "hf_cases.py")
cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cases)

RAISES = {"imagefolder-mixed-keep", "ids-mixed-files", "listing-inline-metadata-auto", "convert-items-rewritten-keys"}
"""Splits whose first samples differ in fields: datasets refuses them."""
DROPS = {"shard-writer-field-added-later"}
"""A field first seen after the samples datasets infers from: dropped without a word."""


@pytest.fixture(autouse=True)
def _offline(monkeypatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def missing(rows: list[dict], stored: dict[str, dict[str, bytes]]) -> list[tuple[str, str]]:
    """``(key, field)`` of each stored field that a row lacks (None)."""
    return [(r["__key__"], f) for r in rows for f in stored[r["__key__"]] if r.get(f) is None]


@pytest.mark.parametrize("case", sorted(set(cases.CASES) - RAISES - DROPS))
def test_every_row_and_every_field_is_read(tmp_path, case):
    out, split = cases.CASES[case](tmp_path)
    stored = cases.stored(out, split)
    rows = cases.hf_read(out, split, tmp_path / "hf")
    assert sorted(r["__key__"] for r in rows) == sorted(stored)
    assert missing(rows, stored) == []
    for r in rows:
        for field, data in stored[r["__key__"]].items():
            value = r[field]
            if field.endswith(("jpg", "png", "webp", "bmp", "ppm")):
                assert value.size[0] > 0 and value.tobytes()  # an image, decoded
            elif field == "cls":
                assert value == int(data)
            elif field.endswith("txt"):
                assert value == data.decode()


@pytest.mark.parametrize("case", sorted(RAISES))
def test_first_samples_that_differ_in_fields_are_refused(tmp_path, case):
    out, split = cases.CASES[case](tmp_path)
    with pytest.raises(ValueError, match="don't share the same prefix or the same types"):
        cases.hf_read(out, split, tmp_path / "hf")


def test_a_field_first_seen_later_is_dropped_silently(tmp_path):
    out, split = cases.CASES["shard-writer-field-added-later"](tmp_path)
    stored = cases.stored(out, split)
    rows = cases.hf_read(out, split, tmp_path / "hf")
    assert len(rows) == 10 and "txt" not in rows[0]
    assert sorted(missing(rows, stored)) == sorted((k, "txt") for k, s in stored.items() if "txt" in s) != []


def test_features_naming_every_field_read_a_split_with_several_image_formats(tmp_path):
    from datasets import Features, Image, Value, load_dataset

    out, split = cases.CASES["imagefolder-mixed-keep"](tmp_path)
    stored = cases.stored(out, split)
    features = Features(
        {
            "__key__": Value("string"),
            "__url__": Value("string"),
            "cls": Value("int64"),
            "json": {"path": Value("string"), "label": Value("string")},
            "jpg": Image(),
            "png": Image(),
            "webp": Image(),
            "bmp": Image(),
        }
    )
    files = [str(p) for p in cases._shards(out, split)]
    rows = list(
        load_dataset(
            "webdataset", data_files={split: files}, split=split, features=features, cache_dir=str(tmp_path / "hf")
        )
    )
    assert sorted(r["__key__"] for r in rows) == sorted(stored)
    assert missing(rows, stored) == []
    assert {f for s in stored.values() for f in s} == {"cls", "json", "jpg", "png", "webp", "bmp"}


def test_a_chunked_split_is_not_read_sample_by_sample(tmp_path):
    """What docs/format.md says of the chunked layout: other readers see one sample per chunk;
    Hugging Face ``datasets`` cannot decode a chunk's label member (its offsets table) and raises."""
    import numpy as np

    from shardify.convert import ShardWriter

    out = tmp_path / "out"
    with ShardWriter(out, split="train", samples_per_shard=8, chunk=4) as w:
        for i in range(12):
            w.write({"npy": np.full((3, 4, 4), i, dtype=np.uint8), "cls": i % 3})
    assert sorted(cases.stored(out, "train")) == ["000000000", "000000004", "000000008"]  # one tar sample a chunk
    with pytest.raises(ValueError, match="invalid literal for int"):
        cases.hf_read(out, "train", tmp_path / "hf")
