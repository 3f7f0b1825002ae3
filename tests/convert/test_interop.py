"""Other readers see every image: ``image_format`` gives all samples the same image field."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardify.convert.write.run import convert_imagefolder
from shardify.tario import iter_members, iter_samples


def _mixed_folder(root: Path) -> dict[str, bytes]:
    """ImageNet's trap: PNGs (one with alpha, one 16-bit) named ``.JPEG`` among JPEGs."""
    files = {}
    for c in ("a", "b"):
        for i in range(6):
            mode = ("RGBA" if c == "a" else "I;16") if i == 2 else "RGB"
            if mode == "I;16":
                img = Image.fromarray(np.arange(16 * 24, dtype=np.uint16).reshape(16, 24) * 150)
            else:
                img = Image.new(mode, (24 + i, 16), (i * 40, 90, 200, 128)[: len(mode)])
            buf = io.BytesIO()
            img.save(buf, format="PNG" if i % 3 == 2 else "JPEG")
            path = root / c / f"{i}.JPEG"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(buf.getvalue())
            files[f"{c}/{i}.JPEG"] = buf.getvalue()
    return files


def _samples(out: Path) -> list[dict[str, object]]:
    found = []
    for shard in sorted(out.glob("train-*.tar")):
        with open(shard, "rb") as f:
            found += list(iter_samples(iter_members(f, shard=shard.name), shard=shard.name))
    return found


@pytest.mark.parametrize("image_format, field", [("keep", None), ("jpg", "jpg"), ("png", "png")])
def test_image_format_gives_every_sample_one_field(tmp_path: Path, options, image_format: str, field) -> None:
    originals = _mixed_folder(tmp_path / "src")
    out = tmp_path / "out"
    convert_imagefolder(tmp_path / "src", out, options=options(image_format=image_format))
    index = json.loads((out / "train.json").read_text())["shardify"]
    samples = _samples(out)
    assert len(samples) == 12
    image_fields = {k for s in samples for k in s if k in ("jpg", "png")}
    assert image_fields == ({"jpg", "png"} if field is None else {field})
    assert set(index["fields"]) == {"cls", "json"} | image_fields
    for s in samples:
        original = originals[json.loads(s["json"])["path"]]  # type: ignore[arg-type]
        stored = s["jpg"] if "jpg" in s else s["png"]
        if original[:2] == b"\xff\xd8" and field != "png" or original[:4] == b"\x89PNG" and field != "jpg":
            assert stored == original  # an image already in the format is kept byte for byte
        elif field == "png":  # lossless: the same pixels
            assert np.array_equal(
                np.asarray(Image.open(io.BytesIO(stored)).convert("RGB")),
                np.asarray(Image.open(io.BytesIO(original)).convert("RGB")),
            )
        else:
            with Image.open(io.BytesIO(stored)) as img:
                assert img.format == "JPEG" and img.mode in ("RGB", "L")


def test_webdataset_to_tuple_jpg_reads_every_sample_after_image_format_jpg(tmp_path: Path, options) -> None:
    import webdataset as wds

    _mixed_folder(tmp_path / "src")
    for fmt, expect in (("jpg", 12), ("keep", None)):
        out = tmp_path / f"out-{fmt}"
        convert_imagefolder(tmp_path / "src", out, options=options(image_format=fmt))
        urls = [str(p) for p in sorted(out.glob("train-*.tar"))]
        pipeline = wds.WebDataset(urls, shardshuffle=False, empty_check=False).to_tuple("jpg", "cls")
        if expect is None:
            with pytest.raises(ValueError):  # the mixed split: webdataset's to_tuple("jpg") fails
                list(pipeline)
            assert (
                len(list(wds.WebDataset(urls, shardshuffle=False, empty_check=False).to_tuple("jpg;png", "cls"))) == 12
            )
        else:
            assert len(list(pipeline)) == expect


def test_hugging_face_datasets_reads_every_image(tmp_path: Path, options, monkeypatch) -> None:
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from datasets import load_dataset

    _mixed_folder(tmp_path / "src")
    seen = {}
    for fmt in ("keep", "jpg"):
        out = tmp_path / f"out-{fmt}"
        convert_imagefolder(tmp_path / "src", out, options=options(image_format=fmt))
        files = [str(p) for p in sorted(out.glob("train-*.tar"))]
        ds = load_dataset(
            "webdataset", data_files={"train": files}, split="train", cache_dir=str(tmp_path / f"hf-{fmt}")
        )
        assert len(ds) == 12
        seen[fmt] = sum(1 for row in ds if row.get("jpg") is not None)
        if fmt == "jpg":
            assert {row["jpg"].size for row in ds} >= {(24, 16), (26, 16)}
    assert seen == {"keep": 8, "jpg": 12}  # mixed: datasets silently drops the PNGs; one field: all there
