"""Tiny datasets for the converter tests, made in tmp_path."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from shardify.convert.options import ConvertOptions
from shardify.convert.synth import jpeg_bytes, natural_image


def image_bytes(fmt: str = "JPEG", *, mode: str = "RGB", size: tuple[int, int] = (40, 30), seed: int = 0) -> bytes:
    img = natural_image(*size, seed=seed).convert(mode)
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


@pytest.fixture
def make_image():
    return image_bytes


@pytest.fixture
def options():
    def make(**kw) -> ConvertOptions:
        kw.setdefault("workers", 1)
        kw.setdefault("progress", False)
        kw.setdefault("fsync", False)
        kw.setdefault("samples_per_shard", 3)
        return ConvertOptions(**kw)

    return make


@pytest.fixture
def imagefolder(tmp_path: Path) -> Path:
    """3 classes of small JPEGs and PNGs, one nested folder: 10 images."""
    root = tmp_path / "src"
    files = {
        "cat/c1.jpg": image_bytes(seed=1),
        "cat/c2.JPEG": image_bytes(seed=2),
        "cat/sub/c3.png": image_bytes("PNG", seed=3),
        "dog/d1.jpg": image_bytes(seed=4),
        "dog/d2.jpg": image_bytes(seed=5),
        "dog/d3.jpeg": image_bytes(seed=6),
        "emu/e1.jpg": image_bytes(seed=7),
        "emu/e2.webp": image_bytes("WEBP", seed=8),
        "emu/e3.bmp": image_bytes("BMP", seed=9),
        "emu/e4.jpg": jpeg_bytes(natural_image(64, 48, seed=10)),
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


@pytest.fixture
def ids_dataset(tmp_path: Path) -> dict[str, Path]:
    """ID-labelled files: .pt, .npy, .jpg, .json, .txt; string labels; two splits."""
    import numpy as np
    import torch

    data = tmp_path / "data"
    data.mkdir()
    for i in range(6):
        torch.save(torch.arange(i + 1), data / f"id{i}.pt")
    np.save(data / "id0.npy", np.ones((2, 2)))
    (data / "id1.jpg").write_bytes(image_bytes(seed=11))
    (data / "id2.json").write_text('{"extra": 1}')
    (data / "id3.txt").write_text("hello")
    partition = tmp_path / "partition.json"
    partition.write_text(json.dumps({"train": ["id0", "id1", "id2", "id3"], "validation": ["id4", "id5"]}))
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({f"id{i}": ["ant", "bee", "cow"][i % 3] for i in range(6)}))
    return {"src": data, "partition": partition, "labels": labels}


def _read_split(out: Path, split: str) -> dict[str, dict[str, bytes]]:
    """{key: {ext: bytes}} of every sample of a split, read with the standard library."""
    index = json.loads((out / f"{split}.json").read_text())
    samples: dict[str, dict[str, bytes]] = {}
    for shard in index["shardlist"]:
        with tarfile.open(out / shard["url"]) as tf:
            for m in tf.getmembers():
                key, ext = m.name.split(".", 1)
                samples.setdefault(key, {})[ext] = tf.extractfile(m).read()
    return samples


def _tree_bytes(out: Path) -> dict[str, bytes]:
    """Every file under ``out`` by relative path (to compare outputs byte for byte)."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.fixture
def read_split():
    return _read_split


@pytest.fixture
def tree_bytes():
    return _tree_bytes


@pytest.fixture
def spy_pools(monkeypatch):
    """``spy(module)``: a list of the start method of each pool of worker processes that
    ``module`` starts through ``LocalExecutor`` from then on (the pools still run)."""
    from shardify.convert.executor import LocalExecutor

    def spy(module) -> list[str]:  # noqa: ANN001
        started: list[str] = []

        class Counted(LocalExecutor):
            def map(self, fn, items, *, args=()):  # noqa: ANN001, ANN202
                if self.workers > 1:
                    started.append(self.method)
                return super().map(fn, items, args=args)

        monkeypatch.setattr(module, "LocalExecutor", Counted)
        return started

    return spy
