"""Datasets written by every input kind of shardify, and what Hugging Face ``datasets`` reads of them.

``CASES`` maps a name to ``make(tmp) -> (out, split)``; :func:`hf_read` loads the split's
shards with ``load_dataset("webdataset", data_files=...)`` and :func:`stored` reads them
with the standard library, so a test compares the two sample by sample, field by field.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from shardify.convert import ShardWriter, convert_items
from shardify.convert.options import ConvertOptions
from shardify.convert.write.run import convert_ids, convert_imagefolder, convert_listing

__all__ = ["CASES", "hf_read", "stored"]


def _image(fmt: str, seed: int, size: tuple[int, int] = (20, 14)) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(buf, format=fmt)
    return buf.getvalue()


def _options(**kw) -> ConvertOptions:
    return ConvertOptions(**{"workers": 1, "progress": False, "fsync": False, "samples_per_shard": 4, **kw})


def _folder(tmp: Path, formats: tuple[str, ...], n: int = 12) -> Path:
    """An ImageFolder tree of ``n`` images in 2 classes, cycling through ``formats``, all named ``.jpg``
    when ``formats`` mixes them (ImageNet's trap), else with their own extension."""
    src = tmp / "src"
    for i in range(n):
        fmt = formats[i % len(formats)]
        ext = "jpg" if len(formats) > 1 else {"JPEG": "jpg", "PNG": "png", "WEBP": "webp", "BMP": "bmp"}[fmt]
        path = src / "ab"[i % 2] / f"{i:02d}.{ext}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_image(fmt, i))
    return src


def imagefolder(formats: tuple[str, ...], **options) -> Callable[[Path], tuple[Path, str]]:
    def make(tmp: Path) -> tuple[Path, str]:
        convert_imagefolder(_folder(tmp, formats), tmp / "out", options=_options(**options))
        return tmp / "out", "train"

    return make


def ids(files: str, *, pt_to_npy: bool = False) -> Callable[[Path], tuple[Path, str]]:
    """ID-labelled files: ``"same"``, every ID a ``.pt`` and a ``.jpg``; ``"mixed"``, extra files for some IDs."""

    def make(tmp: Path) -> tuple[Path, str]:
        data = tmp / "data"
        data.mkdir()
        names = [f"id{i}" for i in range(10)]
        for i, name in enumerate(names):
            torch.save(torch.arange(i + 1, dtype=torch.float32), data / f"{name}.pt")
            (data / f"{name}.jpg").write_bytes(_image("JPEG", i))
            if files == "mixed" and i % 4 == 3:
                (data / f"{name}.txt").write_text(f"note {i}")
        (tmp / "p.json").write_text(json.dumps({"train": names}))
        (tmp / "l.json").write_text(json.dumps({n: i % 3 for i, n in enumerate(names)}))
        convert_ids(
            data, tmp / "out", partition=tmp / "p.json", labels=tmp / "l.json", options=_options(), pt_to_npy=pt_to_npy
        )
        return tmp / "out", "train"

    return make


def listing(tmp: Path) -> tuple[Path, str]:
    """A JSONL listing: an image path, a label name, a text and a JSON column per row."""
    rows = []
    for i in range(10):
        (tmp / f"{i}.png").write_bytes(_image("PNG", i))
        rows.append({"path": f"{i}.png", "label": "xy"[i % 2], "text": f"caption {i}", "meta": {"n": i}})
    (tmp / "list.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    convert_listing(tmp / "list.jsonl", tmp / "out", options=_options())
    return tmp / "out", "train"


def inline_listing(metadata: str) -> Callable[[Path], tuple[Path, str]]:
    """A listing of inline rows (``id``, int ``label``, ``text``), some IDs not key-safe: under
    ``metadata="auto"`` only their samples get a ``.json`` (the ID as given)."""

    def make(tmp: Path) -> tuple[Path, str]:
        rows = [
            {"id": f"row {i}" if i % 4 == 3 else f"row-{i}", "label": i % 2, "text": f"line {i}"} for i in range(12)
        ]
        (tmp / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        convert_listing(tmp / "rows.jsonl", tmp / "out", options=_options(metadata=metadata))
        return tmp / "out", "train"

    return make


def shard_writer(tmp: Path) -> tuple[Path, str]:
    """Arrays and labels, and an image from an array, from ``ShardWriter``."""
    rng = np.random.default_rng(0)
    with ShardWriter(tmp / "out", split="train", samples_per_shard=4, classes=["a", "b", "c"]) as w:
        for i in range(10):
            w.write(
                {
                    "npy": rng.integers(0, 255, (3, 4, 4), dtype=np.uint8),
                    "cls": i % 3,
                    "png": rng.integers(0, 255, (8, 6, 3), dtype=np.uint8),
                }
            )
    return tmp / "out", "train"


def shard_writer_later_field(tmp: Path) -> tuple[Path, str]:
    """Samples 0-5 hold ``npy`` and ``cls``; samples 6-9 a ``txt`` too (in later shards)."""
    with ShardWriter(tmp / "out", split="train", samples_per_shard=4) as w:
        for i in range(10):
            w.write({"npy": np.full(3, i, dtype=np.int16), "cls": i % 3, **({"txt": f"late {i}"} if i >= 6 else {})})
    return tmp / "out", "train"


def _item(i: int) -> dict:
    return {
        "__key__": f"doc-{i}" if i % 3 else f"doc {i}",  # a space: the key is rewritten, kept in key.txt
        "tokens.npy": np.arange(i + 2, dtype=np.uint16),
        "txt": f"text {i}",
        "meta.json": {"i": i},
    }


def items(tmp: Path) -> tuple[Path, str]:
    """Token arrays, texts and JSON from ``convert_items``; some keys need rewriting."""
    convert_items(
        range(10), _item, tmp / "out", split="train", workers=1, samples_per_shard=4, progress=False, fsync=False
    )
    return tmp / "out", "train"


def items_plain_keys(tmp: Path) -> tuple[Path, str]:
    convert_items(
        range(10),
        lambda i: {**_item(i), "__key__": f"doc-{i}"},
        tmp / "out",
        split="train",
        workers=1,
        samples_per_shard=4,
        progress=False,
        fsync=False,
    )
    return tmp / "out", "train"


CASES: dict[str, Callable[[Path], tuple[Path, str]]] = {
    "imagefolder-jpg": imagefolder(("JPEG",)),
    "imagefolder-png": imagefolder(("PNG",)),
    "imagefolder-webp": imagefolder(("WEBP",)),
    "imagefolder-bmp": imagefolder(("BMP",)),
    "imagefolder-metadata-always": imagefolder(("JPEG",), metadata="always"),
    "imagefolder-no-shuffle": imagefolder(("JPEG",), shuffle=False),
    "imagefolder-max-side": imagefolder(("PNG",), max_side=10),
    "imagefolder-raw-pixels": imagefolder(("JPEG", "PNG"), raw_pixels=8),
    "imagefolder-mixed-image-format-jpg": imagefolder(("JPEG", "PNG", "WEBP", "BMP"), image_format="jpg"),
    "imagefolder-mixed-image-format-png": imagefolder(("JPEG", "PNG", "WEBP", "BMP"), image_format="png"),
    "imagefolder-mixed-keep": imagefolder(("JPEG", "PNG", "WEBP", "BMP")),
    "ids-same-files": ids("same"),
    "ids-same-files-pt-to-npy": ids("same", pt_to_npy=True),
    "ids-mixed-files": ids("mixed"),
    "listing": listing,
    "listing-inline-metadata-always": inline_listing("always"),
    "listing-inline-metadata-auto": inline_listing("auto"),
    "shard-writer": shard_writer,
    "shard-writer-field-added-later": shard_writer_later_field,
    "convert-items": items_plain_keys,
    "convert-items-rewritten-keys": items,
}


def _shards(out: Path, split: str) -> list[Path]:
    index = json.loads((out / f"{split}.json").read_text())
    return [out / s["url"] for s in index["shardlist"]]


def stored(out: Path, split: str) -> dict[str, dict[str, bytes]]:
    """``{key: {field: bytes}}`` of every sample, read with ``tarfile``."""
    samples: dict[str, dict[str, bytes]] = {}
    for shard in _shards(out, split):
        with tarfile.open(shard) as tf:
            for m in tf.getmembers():
                key, field = m.name.split(".", 1)
                samples.setdefault(key, {})[field] = tf.extractfile(m).read()
    return samples


def hf_read(out: Path, split: str, cache: Path) -> list[dict]:
    """Every row ``load_dataset("webdataset")`` gives for the split's shards."""
    from datasets import load_dataset

    files = [str(p) for p in _shards(out, split)]
    return list(load_dataset("webdataset", data_files={split: files}, split=split, cache_dir=str(cache)))
