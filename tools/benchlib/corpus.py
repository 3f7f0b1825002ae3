"""The corpora the tools read, one definition each, deterministic, made once and cached.

- :func:`photos`: photo-like JPEGs of ImageNet's sizes (``shardify.convert.synth``: about
  500x375, ~110 KB), in an ImageNet-style folder, made on every core; the same files as
  ``make_imagefolder(seed=0)`` with as many classes and images per class.
- :func:`photo_dataset`: those photos converted by shardify's image-folder converter;
  :func:`step_dataset`: the one the GPU tools read.
- :func:`camera_dataset`: camera-sized photo-like JPEGs with a camera roll's mix of encodings
  (4:2:0 and 4:4:4, some progressive, grayscale and CMYK), converted; :func:`folder_dataset`: a
  folder of real photos (ImageNet layout) converted.
- :func:`jpegs`: photo-like JPEGs of one size, in memory; :func:`noise_dataset`: small JPEGs
  of random pixels.
- :func:`id_tensors`: ``<ID>.pt`` tensors with a partition and a labels file.
- :func:`arrays` / :func:`arrays_dataset`: ``3x32x32`` uint8 arrays with an int label.
- :func:`tiny_dataset`: samples of a label and 20 bytes of text, nothing to decode.
- :func:`listing` / :func:`listing_tree` / :func:`listing_dataset`: a JSONL listing of IDs,
  labels and short captions (ImageNet's shape at any row count), its image folder of tiny
  JPEGs, and the listing converted.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import get_context
from multiprocessing.pool import Pool
from pathlib import Path
from typing import Any

import numpy as np

from shardify.convert.synth import IMAGENET_SIZES, jpeg_bytes, natural_image

__all__ = [
    "made",
    "photos",
    "photo_dataset",
    "step_dataset",
    "camera_dataset",
    "folder_dataset",
    "jpegs",
    "noise_dataset",
    "id_tensors",
    "arrays",
    "arrays_dataset",
    "tiny_dataset",
    "listing",
    "listing_tree",
    "listing_dataset",
    "warm",
]


@contextmanager
def fork_pool() -> Iterator[Pool]:
    """A fork pool of one worker a core whose workers start with the default SIGTERM: a handler
    the parent holds (``ray.init`` leaves one that calls ``sys.exit``) would otherwise be
    inherited, a worker could then wait on the pool's queue lock at ``Pool.terminate`` and hang it
    for ever, and a SIGTERM between the fork and the worker's first step would raise SystemExit in
    a copy of the parent (under pytest: a second run of the suite). The parent holds the default
    while it forks, so no child ever runs the parent's handler."""
    inherited = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with get_context("fork").Pool(os.cpu_count() or 1) as pool:
            yield pool
    finally:
        signal.signal(signal.SIGTERM, inherited)


def made(dataset: Path) -> bool:
    """Whether ``dataset`` was made before and this code reads it: a dataset a tool made with
    an older format (its manifest refused) is removed, to be made again."""
    from shardify.errors import ManifestError
    from shardify.manifest import Manifest

    if not (dataset / "manifest.json").exists():
        return False
    try:
        manifest = Manifest.load(dataset)
        for split in manifest.splits:
            manifest.load_split(dataset, split)
    except ManifestError:
        shutil.rmtree(dataset)
        return False
    return True


def _photo_class(job: tuple[Path, int, int, int, tuple[tuple[int, int], ...]]) -> None:
    root, c, per_class, quality, sizes = job
    name = f"n{c:08d}"
    (root / name).mkdir(parents=True, exist_ok=True)
    for i in range(per_class):
        path = root / name / f"{name}_{i}.JPEG"
        if not path.exists():
            s = c * 10_007 + i  # the seeds of convert.synth.make_imagefolder(seed=0)
            w, h = sizes[s % len(sizes)]
            path.write_bytes(jpeg_bytes(natural_image(w, h, seed=s), quality=quality))


def photos(
    folder: Path,
    images: int,
    *,
    classes: int = 20,
    quality: int = 90,
    sizes: tuple[tuple[int, int], ...] = IMAGENET_SIZES,
) -> Path:
    """``folder`` filled with ``ceil(images / classes)`` photo-like JPEGs per class (made once)."""
    done = folder.with_name(folder.name + ".done")  # beside it: the folder holds only the classes
    if not done.exists():
        per_class = -(-images // classes)
        t0 = time.perf_counter()
        with fork_pool() as pool:
            pool.map(_photo_class, [(folder, c, per_class, quality, sizes) for c in range(classes)])
        done.touch()
        print(f"made {per_class * classes} JPEGs in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return folder


def photo_dataset(
    data: Path,
    images: int,
    *,
    classes: int = 20,
    quality: int = 90,
    copies: int = 1,
    name: str = "photos",
    **options: Any,
) -> tuple[Path, Path]:
    """``(image folder, converted dataset)`` of :func:`photos` under ``data`` (made once);
    ``options`` go to ``ConvertOptions`` (progress and fsync are off). ``copies`` > 1 stores each
    image that many times under other names (hard links): an epoch long enough for every worker
    to make many batches, at the cost of making ``images`` JPEGs."""
    from shardify.convert.options import ConvertOptions
    from shardify.convert.write.run import convert_imagefolder

    base = f"{name}-{images}-c{classes}" + ("" if quality == 90 else f"-q{quality}")
    folder = photos(data / base, images, classes=classes, quality=quality)
    if copies > 1:
        linked = data / f"{base}x{copies}"
        for path in sorted(p for p in folder.rglob("*.JPEG")):
            (linked / path.parent.name).mkdir(parents=True, exist_ok=True)
            for k in range(copies):
                link = linked / path.parent.name / (path.name if k == 0 else f"{path.stem}-copy{k}{path.suffix}")
                if not link.exists():
                    os.link(path, link)
        folder, base = linked, f"{base}x{copies}"
    tag = "-".join(f"{k}{v}" for k, v in sorted(options.items()))
    dataset = data / f"{base}{'-' + tag if tag else ''}-shards"
    if not made(dataset):
        convert_imagefolder(folder, dataset, options=ConvertOptions(progress=False, fsync=False, **options))
    return folder, dataset


def step_dataset(out: Path, images: int, *, copies: int = 1) -> Path:
    """The GPU tools' dataset: :func:`photo_dataset` of ``images`` photos in 10 classes, 100 a
    shard, each stored ``copies`` times (made once under ``out``)."""
    return photo_dataset(out, images, classes=10, copies=copies, samples_per_shard=100, shard_size=None)[1]


CAMERA_SIZES = ((1600, 1200), (1200, 1600), (2048, 1536), (1024, 768), (1280, 960), (1920, 1080))
"""(width, height) of :func:`camera_dataset`'s photos, in turn."""


def _camera_photo(job: tuple[Path, int]) -> None:
    """Photo ``i``: every 50th grayscale, every 100th (offset 25) CMYK, every 20th (offset 7)
    progressive, every other one without chroma subsampling (4:4:4), quality 85 to 95."""
    folder, i = job
    path = folder / f"n{i % 10:08d}" / f"cam_{i}.JPEG"
    if path.exists():
        return
    w, h = CAMERA_SIZES[i % len(CAMERA_SIZES)]
    img = natural_image(w, h, seed=50_000 + i)
    if i % 50 == 0:
        img = img.convert("L")
    elif i % 100 == 25:
        img = img.convert("CMYK")
    path.parent.mkdir(parents=True, exist_ok=True)
    sub = 0 if i % 2 else 2
    img.save(path, format="JPEG", quality=85 + i % 11, progressive=i % 20 == 7, subsampling=sub)


def camera_dataset(data: Path, images: int) -> Path:
    """``images`` camera photos (:func:`_camera_photo`) in 10 classes under ``data``, converted
    with 100 samples a shard (made once): what a device decoder meets beside ImageNet's sizes."""
    folder = data / f"camera-{images}"
    done = folder.with_name(folder.name + ".done")
    if not done.exists():
        with fork_pool() as pool:
            pool.map(_camera_photo, [(folder, i) for i in range(images)])
        done.touch()
    return folder_dataset(folder, data / f"camera-{images}-shards")


def folder_dataset(folder: Path, dataset: Path) -> Path:
    """The image folder ``folder`` (one sub-folder per class) converted to ``dataset``, 100 samples
    a shard (made once)."""
    from shardify.convert.options import ConvertOptions
    from shardify.convert.write.run import convert_imagefolder

    if not made(dataset):
        options = ConvertOptions(progress=False, fsync=False, samples_per_shard=100, shard_size=None)
        convert_imagefolder(folder, dataset, options=options)
    return dataset


def jpegs(count: int, *, width: int, height: int, quality: int = 90) -> list[bytes]:
    """``count`` photo-like JPEGs of ``width`` x ``height``, in memory (seeds 0 to count - 1)."""
    return [jpeg_bytes(natural_image(width, height, seed=i), quality=quality) for i in range(count)]


def noise_dataset(root: Path, samples: int, *, shards: int) -> Path:
    """``samples`` JPEGs of 64x64 random pixels with a label ``i % 10``, in ``shards`` shards (once):
    small, hard to compress images, for figures where the decode should cost little."""
    from shardify.convert import ShardWriter

    if not made(root):
        rng = np.random.default_rng(0)
        with ShardWriter(root, split="train", samples_per_shard=-(-samples // shards), fsync=False) as w:
            for i in range(samples):
                w.write({"jpg": rng.integers(0, 255, (64, 64, 3), dtype=np.uint8), "cls": i % 10})
    return root


def id_tensors(work: Path, *, samples: int, classes: int = 10, seed: int = 0) -> dict[str, Path]:
    """``work/data/<ID>.pt`` tensors (3x32x32 float32), ``partition.json`` ({"train": ids}) and
    ``labels.json``: the ID-labelled recipe's input."""
    import torch  # deferred: only this corpus needs torch

    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    ids = [f"img{i:06d}" for i in range(samples)]
    labels = torch.randint(0, classes, (samples,), generator=g).tolist()
    for ident in ids:
        torch.save(torch.randn(3, 32, 32, generator=g), data / f"{ident}.pt")
    (work / "partition.json").write_text(json.dumps({"train": ids}))
    (work / "labels.json").write_text(json.dumps(dict(zip(ids, labels))))
    return {"src": data, "partition": work / "partition.json", "labels": work / "labels.json"}


def arrays(n: int, *, classes: int = 1000, seed: int = 0) -> tuple[list[np.ndarray], list[int]]:
    """``n`` random ``3x32x32`` uint8 arrays and their labels ``i % classes`` (every class alike)."""
    block = np.random.default_rng(seed).integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
    return list(block), [i % classes for i in range(n)]


def arrays_dataset(root: Path, n: int, *, classes: int = 1000, **writer: Any) -> Path:
    """:func:`arrays` written as ``{"npy", "cls"}`` samples by ``ShardWriter(root, **writer)`` (once)."""
    from shardify.convert import ShardWriter

    if not made(root):
        images, labels = arrays(n, classes=classes)
        with ShardWriter(root, fsync=False, **writer) as w:
            for a, y in zip(images, labels):
                w.write({"npy": a, "cls": y})
    return root


def tiny_dataset(root: Path, n: int) -> Path:
    """``n`` samples ``{"cls": i % 10, "txt": 20 bytes}`` in shards of 2,000 (written once)."""
    from shardify.convert import ShardWriter

    if not made(root):
        with ShardWriter(root, samples_per_shard=2000, fsync=False) as w:
            for i in range(n):
                w.write({"cls": i % 10, "txt": "x" * 20})
    return root


_WORDS = ("a photo of", "the", "small", "large", "red", "dog", "cat", "on a", "table", "in the", "garden", "bird")


def listing(path: Path, rows: int) -> Path:
    """A JSONL listing: ``{"id": "img00000001", "label": 417, "text": "a photo of the ..."}`` (once)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            for i in range(rows):
                words = " ".join(_WORDS[(i * 7 + k * 3) % len(_WORDS)] for k in range(4 + i % 5))
                f.write(json.dumps({"id": f"img{i:08d}", "label": (i * 7919) % 1000, "text": words}) + "\n")
        os.replace(tmp, path)
    return path


def listing_tree(root: Path, files: int, classes: int = 1000) -> Path:
    """An image folder of ``files`` tiny files (``classes`` classes), each the same valid 8x8 JPEG."""
    import io

    from PIL import Image

    done = root.with_name(root.name + ".done")
    if not done.exists():
        buf = io.BytesIO()
        Image.new("RGB", (8, 8), (120, 60, 30)).save(buf, format="JPEG")
        jpeg = buf.getvalue()
        for c in range(classes):
            folder = root / f"n{c:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(c, files, classes):
                (folder / f"n{c:08d}_{i}.JPEG").write_bytes(jpeg)
        done.touch()
    return root


def listing_dataset(data: Path, rows: int) -> Path:
    """:func:`listing` of ``rows`` rows converted with ``shardify convert listing`` (both cached in ``data``)."""
    src = listing(data / f"listing-{rows}.jsonl", rows)
    ds = data / f"ds-{rows}"
    if not (ds / "manifest.json").exists():
        t0 = time.perf_counter()
        convert = [sys.executable, "-m", "shardify.convert", "convert", "listing", str(src), str(ds)]
        subprocess.run([*convert, "--quiet", "--no-fsync"], check=True)
        print(f"converted {src} into {ds} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return ds


def warm(*roots: Path) -> None:
    """Read every file under ``roots`` once, so that runs compare reading, not the disk."""
    for root in roots:
        for dirpath, _, names in os.walk(root):
            for name in names:
                with open(os.path.join(dirpath, name), "rb") as f:
                    while f.read(1 << 24):
                        pass
