"""``run_bench``: how fast a dataset reads, next to a single process and webdataset.

Measures, on the dataset given: (a) one process decoding and augmenting the images (our
fast path, the better of two passes; and the plain PIL path), and ``num_workers`` such
processes at once, each on its share, with no loader: what the machine's cores give
together (shared caches, memory bandwidth and clock boost make it less than
``num_workers`` times (a)); (b) our loader with ``num_workers`` workers, its best epoch
after the first, from the loader's own ``stats()`` (also where its time went: the loop's wait,
the stage seconds in the workers, the bottleneck); (c) webdataset's pipeline doing the same
work (PIL decode, the same crop and flip, uint8 batches) in the same DataLoader setup; (d) time
to the first batch of a fresh loader; (e) memory (PSS) of the main process and its workers after
each epoch; (f) shuffle quality, the mean distance in the original order between consecutive
samples, against a full random permutation's (~N/3), here and for an ImageNet-size dataset
(computed from the plan alone); (g) shuffle quality across ranks: distinct classes per batch
on class-sorted shards relative to a full random permutation, at world 1, 2 and 8 ((f) and
(g): :mod:`~shardify.cli.bench.shuffle`, from the plan alone). The CLI's ``shardify bench``
and ``tools/bench_read.py`` call it; :func:`~shardify.cli.bench.table.format_bench` prints it.
(a) also times the same work with ``fast_decode=True`` (libjpeg-turbo's fast IDCT and
upsampling) against the exact path, in alternating passes of one run, and reports how far its
pixels are from the exact path's. A split without images gets (b), (d), (e) and (f) on its
default fields, and the result says which figures it cannot measure (``not_measured``).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from shardify.cli.bench.decode import fast_decode_figures
from shardify.cli.bench.shuffle import shuffle_figures
from shardify.cli.common import split_source
from shardify.progress import progress_bar
from shardify.reader import SamplingOptions
from shardify.reader.dataset import ShardedDataset
from shardify.reader.delivery.loader import make_loader
from shardify.reader.io.sources import Source
from shardify.reader.io.stream import Lost, ShardReader
from shardify.reader.plan.shuffle import sample_rng
from shardify.reader.sample import transforms as T
from shardify.reader.sample.decode import decode_image
from shardify.reader.sample.fields import output_fields
from shardify.reader.sample.transforms import RandomResizedCrop, run_image_transform

__all__ = ["run_bench", "process_memory", "child_pids"]


def process_memory(pid: int | None = None) -> int:
    """Bytes of memory of ``pid`` (default: this process) and its children: PSS, else RSS."""
    root = os.getpid() if pid is None else pid
    pids = [root] + child_pids(root)
    return sum(_memory_of(p) for p in pids)


def child_pids(pid: int | None = None) -> list[int]:
    """Pids of the child processes of ``pid`` (default: this process), sorted, from /proc."""
    pid = os.getpid() if pid is None else pid
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if int(fields[1]) == pid:
                out.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return sorted(out)


def _memory_of(pid: int) -> int:
    for name, label in (("smaps_rollup", b"Pss:"), ("status", b"VmRSS:")):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                for line in f:
                    if line.startswith(label):
                        return int(line.split()[1]) * 1024
        except OSError:
            continue
    return 0


def _encoded_images(source: Source, limit: int | None) -> list[tuple[str, bytes]]:
    """``(key, image bytes)`` of the first ``limit`` samples (all when None)."""
    reader = ShardReader(
        [s.url for s in source.shards], source.sizes, skip_damaged=True, chunks=[s.chunk for s in source.shards]
    )
    out: list[tuple[str, bytes]] = []
    try:
        for i, s in enumerate(source.shards):
            for item in reader.read(i, 0, s.nsamples):
                if isinstance(item, Lost):
                    continue
                data = next((v for k, v in item.items() if k in ("jpg", "jpeg", "png", "webp")), None)
                if isinstance(data, bytes):
                    out.append((str(item["__key__"]), data))
                if limit is not None and len(out) >= limit:
                    return out
    finally:
        reader.close()
    return out


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


def _stack_batch(samples: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    images = torch.stack([s[0] for s in samples])
    return images, torch.tensor([int(s[1]) for s in samples], dtype=torch.int64)


class _Steps:
    """The bench's progress: one step per stage or epoch on shardify's bar (stderr, when a terminal)."""

    def __init__(self, total: int, *, enabled: bool) -> None:
        self.bar = progress_bar(total=total, desc="bench", unit=" steps", unit_scale=False, enabled=enabled)

    def done(self, what: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(what, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _rate(
    loader: Any,
    epochs: int,
    set_epoch: Callable[[int], None] | None = None,
    memory: list[int] | None = None,
    steps: _Steps | None = None,
    what: str = "",
) -> tuple[list[float], float]:
    """(images/s of each epoch, seconds to the first batch of the first epoch)."""
    rates, first = [], 0.0
    for epoch in range(epochs):
        if set_epoch is not None:
            set_epoch(epoch)
        t0 = time.perf_counter()
        n = 0
        for i, batch in enumerate(loader):
            if epoch == 0 and i == 0:
                first = time.perf_counter() - t0
            n += len(batch[0] if isinstance(batch, (tuple, list)) else batch)
        rates.append(n / (time.perf_counter() - t0))
        if memory is not None:
            memory.append(process_memory())
        if steps is not None:
            steps.done(f"{what} epoch {epoch}")
    return rates, first


def run_bench(
    dataset: str | os.PathLike[str],
    *,
    split: str | None = None,
    batch_size: int = 64,
    num_workers: int = 2,
    image_size: int = 224,
    epochs: int = 5,
    single_limit: int | None = None,
    compare_webdataset: bool = True,
    shuffle_buffer: int = 1024,
    shuffle_block: int = 4,
    fast_decode: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """Benchmark reading ``dataset``; see the module docstring. Returns the figures as a dict.
    ``progress``: a bar of the stages and epochs on stderr (only when it is a terminal)."""
    source = split_source(dataset, split)
    wds_epochs = min(epochs, 3) if compare_webdataset else 0
    steps = _Steps(1 + 3 + (num_workers > 1) + epochs + wds_epochs + 1, enabled=progress)
    try:
        return _run(
            source,
            str(dataset),
            batch_size=batch_size,
            num_workers=num_workers,
            image_size=image_size,
            epochs=epochs,
            single_limit=single_limit,
            wds_epochs=wds_epochs,
            shuffle_buffer=shuffle_buffer,
            shuffle_block=shuffle_block,
            fast_decode=fast_decode,
            steps=steps,
        )
    finally:
        steps.close()


def _run(
    source: Source,
    dataset: str,
    *,
    batch_size: int,
    num_workers: int,
    image_size: int,
    epochs: int,
    single_limit: int | None,
    wds_epochs: int,
    shuffle_buffer: int,
    shuffle_block: int,
    fast_decode: bool,
    steps: _Steps,
) -> dict[str, Any]:
    transform = T.Compose([T.RandomResizedCrop(image_size, fast_decode=fast_decode), T.RandomHorizontalFlip()])
    result: dict[str, Any] = {
        "dataset": dataset,
        "split": source.split,
        "samples": source.num_samples,
        "shards": len(source.shards),
        "batch_size": batch_size,
        "num_workers": num_workers,
        "image_size": image_size,
        "fast_decode": fast_decode,
    }
    encoded = _encoded_images(source, single_limit)
    if not encoded:
        if steps.bar is not None:
            steps.bar.total = 1 + epochs + 1
        steps.done("read")
        return _run_without_images(
            result, source, epochs=epochs, shuffle_buffer=shuffle_buffer, shuffle_block=shuffle_block, steps=steps
        )
    steps.done("read")

    # (a) the same work as one loader worker does: per-key RNG, one torch thread.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _decode_all(encoded[:8], transform)  # warm up
        # The better of two passes, as the loader's figure is its best epoch.
        result["single_process_ips"] = max(len(encoded) / _decode_all(encoded, transform)[1] for _ in range(2))
        steps.done("(a) single process")
        plain = PlainCropFlip(image_size)
        t0 = time.perf_counter()
        for _, data in encoded:
            plain(decode_image(data))
        result["single_process_plain_ips"] = len(encoded) / (time.perf_counter() - t0)
        steps.done("(a) plain PIL")
        result["fast_decode_vs_exact"] = fast_decode_figures(encoded, image_size)  # see cli/bench/decode.py
        steps.done("(a) fast IDCT")
    finally:
        torch.set_num_threads(threads)
    if num_workers > 1:
        result["independent_processes_ips"] = _independent_rate(encoded, transform, num_workers)
        steps.done("(a) bare processes")
    del encoded

    base = process_memory()
    ds = ShardedDataset(
        source,
        batch_size=batch_size,
        shuffle=True,
        seed=0,
        transform=transform,
        sampling=SamplingOptions(shuffle_buffer=shuffle_buffer, shuffle_block=shuffle_block),
    )
    _loader_figures(result, ds, num_workers=num_workers, epochs=epochs, base=base, steps=steps)
    del ds

    if wds_epochs:
        result["webdataset_ips"] = _webdataset_rate(
            source, batch_size, num_workers, image_size, shuffle_buffer, wds_epochs, steps
        )
    shuffle_figures(result, source, shuffle_buffer, shuffle_block)
    steps.done("(f), (g) shuffle")
    single = result["single_process_ips"]
    result["loader_vs_2x_single"] = result["loader_ips"] / (max(1, num_workers) * single)
    if result.get("independent_processes_ips"):
        result["independent_vs_2x_single"] = result["independent_processes_ips"] / (num_workers * single)
    if "webdataset_ips" in result:
        result["loader_vs_webdataset"] = result["loader_ips"] / result["webdataset_ips"]
    return result


def _loader_figures(
    result: dict[str, Any], ds: ShardedDataset, *, num_workers: int, epochs: int, base: int, steps: _Steps
) -> None:
    """(b), (d), (e): the loader's rate per epoch (best after the first), first batch, memory."""
    loader = make_loader(ds, num_workers=num_workers)
    memory: list[int] = []
    stats = []
    for epoch in range(epochs):  # the figures are the loader's own stats(), as a training loop sees them
        ds.set_epoch(epoch)
        for _ in loader:
            pass
        stats.append(loader.stats())
        memory.append(process_memory())
        steps.done(f"(b) loader epoch {epoch}")
    loader.close()
    rates = [s.samples_per_s for s in stats]
    best = max(range(1, len(rates)) or range(len(rates)), key=rates.__getitem__)
    result["first_batch_s"] = stats[0].first_batch_s
    result["loader_ips_per_epoch"] = rates
    result["loader_ips"] = rates[best]
    result["loader_stats"] = stats[best].as_dict()  # where its time went: waits, stages, bottleneck
    result["memory_mb_per_epoch"] = [(m - base) / 2**20 for m in memory]


def _run_without_images(
    result: dict[str, Any], source: Source, *, epochs: int, shuffle_buffer: int, shuffle_block: int, steps: _Steps
) -> dict[str, Any]:
    """(b), (d), (e), (f) for a split without images, reading its default fields undecoded-by-us."""
    base = process_memory()
    fields = output_fields(None, source.fields, where=f"{source.name} split {source.split!r}")
    ds = ShardedDataset(
        source,
        batch_size=result["batch_size"],
        shuffle=True,
        seed=0,
        fields=fields,
        sampling=SamplingOptions(shuffle_buffer=shuffle_buffer, shuffle_block=shuffle_block),
    )
    result["fields"] = list(fields)
    result["not_measured"] = (
        f"this split holds no images (its fields: {', '.join(source.fields) or 'unknown'}), so (a) image "
        "decoding and augmentation and (c) the webdataset comparison are not measured; (b) counts samples/s "
        f"reading and decoding fields {', '.join(fields)}, with no transform"
    )
    _loader_figures(result, ds, num_workers=result["num_workers"], epochs=epochs, base=base, steps=steps)
    del ds
    shuffle_figures(result, source, shuffle_buffer, shuffle_block)
    steps.done("(f) shuffle")
    return result


def _decode_all(encoded: list[tuple[str, bytes]], transform: Any) -> tuple[float, float]:
    """Decode and augment every image as a loader worker would (per-key RNG); (start, seconds)."""
    t0 = time.perf_counter()
    for key, data in encoded:
        run_image_transform(transform, data, rng=sample_rng(0, 1, key))
    return t0, time.perf_counter() - t0


def _decode_share(encoded: list[tuple[str, bytes]], transform: Any, start: Any, out: Any) -> None:
    torch.set_num_threads(1)
    start.wait()
    t0, seconds = _decode_all(encoded, transform)
    out.put((len(encoded), t0, t0 + seconds))


def _independent_rate(encoded: list[tuple[str, bytes]], transform: Any, processes: int) -> float | None:
    """(a) run in ``processes`` forked processes at once, each on its share: what the machine
    gives for that many cores of bare decoding, with no loader at all (None without fork)."""
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
        done = [out.get(timeout=600) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return sum(n for n, _, _ in done) / (max(t1 for _, _, t1 in done) - min(t0 for _, t0, _ in done))


def _webdataset_rate(
    source: Source, batch_size: int, num_workers: int, image_size: int, shuffle_buffer: int, epochs: int, steps: _Steps
) -> float:
    import webdataset as wds
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
    rates, _ = _rate(loader, epochs, steps=steps, what="(c) webdataset")
    return max(rates[1:] or rates)
