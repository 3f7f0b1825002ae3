"""What ``shardify bench`` sets the loader against: the same decode and augment work in bare
processes with no loader, and webdataset's pipeline doing it (PIL decode, the same crop and flip,
uint8 batches) in the same DataLoader setup. Both run on the ``(key, image bytes)`` of a dataset."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from shardify.reader.io.sources import Source
from shardify.reader.plan.shuffle import sample_rng
from shardify.reader.sample.transforms import RandomResizedCrop, run_image_transform

__all__ = ["PlainCropFlip", "decode_all", "independent_rate", "webdataset_rate"]


class PlainCropFlip:
    """What a webdataset user writes: RandomResizedCrop + flip on the decoded PIL image, to uint8 CHW."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._crop = RandomResizedCrop(size)  # only its torchvision-equivalent parameter draw

    def __call__(self, img: Any) -> torch.Tensor:
        from PIL import Image

        y, x, ch, cw = self._crop.crop_params(img.width, img.height, random)  # type: ignore[arg-type]
        img = img.resize((self.size, self.size), Image.Resampling.BILINEAR, box=(x, y, x + cw, y + ch))
        if random.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1).contiguous()


def decode_all(encoded: list[tuple[str, bytes]], transform: Any) -> tuple[float, float]:
    """Decode and augment every image as a loader worker would (per-key RNG); (start, seconds)."""
    t0 = time.perf_counter()
    for key, data in encoded:
        run_image_transform(transform, data, rng=sample_rng(0, 1, key))
    return t0, time.perf_counter() - t0


def _decode_share(encoded: list[tuple[str, bytes]], transform: Any, start: Any, out: Any) -> None:
    torch.set_num_threads(1)
    start.wait()
    t0, seconds = decode_all(encoded, transform)
    out.put((len(encoded), t0, t0 + seconds))


def independent_rate(encoded: list[tuple[str, bytes]], transform: Any, processes: int) -> float | None:
    """Images/s of :func:`decode_all` run in ``processes`` forked processes at once, each on its
    share: what the machine gives for that many cores of bare decoding, with no loader at all
    (None without fork)."""
    import multiprocessing

    try:
        ctx = multiprocessing.get_context("fork")
    except ValueError:
        return None
    start, out = ctx.Barrier(processes), ctx.Queue()
    procs = [
        ctx.Process(target=_decode_share, args=(encoded[i::processes], transform, start, out)) for i in range(processes)
    ]
    for p in procs:
        p.start()
    try:
        done: list[tuple[int, float, float]] = [out.get(timeout=600) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return sum(n for n, _, _ in done) / (max(t1 for _, _, t1 in done) - min(t0 for _, t0, _ in done))


def _stack_batch(samples: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    images = torch.stack([s[0] for s in samples])
    return images, torch.tensor([int(s[1]) for s in samples], dtype=torch.int64)


def webdataset_rate(
    source: Source,
    *,
    batch_size: int,
    num_workers: int,
    image_size: int,
    shuffle_buffer: int,
    epochs: int,
    done: Callable[[str], None],
) -> float:
    """Images/s of webdataset's pipeline over ``source``'s shards, its best epoch after the first;
    ``done`` is called after each epoch (the bench's progress)."""
    import webdataset as wds  # deferred: an optional dependency, only for this comparison
    from torch.utils.data import DataLoader

    crop = PlainCropFlip(image_size)
    pipeline = (
        wds.WebDataset([s.url for s in source.shards], shardshuffle=len(source.shards), seed=0, empty_check=False)
        .shuffle(shuffle_buffer)
        .decode("pil")
        .to_tuple("jpg;jpeg;png;webp", "cls")
        .map_tuple(crop, int)
        .batched(batch_size, collation_fn=_stack_batch, partial=True)
    )
    loader = DataLoader(pipeline, batch_size=None, num_workers=num_workers, persistent_workers=num_workers > 0)
    rates = []
    for epoch in range(epochs):
        t0, n = time.perf_counter(), 0
        for batch in loader:
            n += len(batch[0])
        rates.append(n / (time.perf_counter() - t0))
        done(f"(c) webdataset epoch {epoch}")
    return max(rates[1:] or rates)
