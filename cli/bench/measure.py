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
(g): :mod:`~shardify.cli.bench.shufflequality`, from the plan alone). What (a) and (c) run is in
:mod:`~shardify.cli.bench.compare`, the memory reading in :mod:`~shardify.cli.procmem`.
The CLI's ``shardify bench`` and ``tools/bench_read.py`` call it;
:func:`~shardify.cli.bench.table.format_bench` prints it. (a) also times the same work with
``fast_decode=True`` (libjpeg-turbo's fast IDCT and upsampling) against the exact path, in
alternating passes of one run, and reports how far its pixels are from the exact path's. A
split without images gets (b), (d), (e) and (f) on its default fields, and the result says
which figures it cannot measure (``not_measured``).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from shardify.cli.bench.compare import PlainCropFlip, decode_all, independent_rate, webdataset_rate
from shardify.cli.bench.fastdecode import fast_decode_figures
from shardify.cli.bench.shufflequality import shuffle_figures
from shardify.cli.common import split_source
from shardify.cli.procmem import process_memory
from shardify.progress import progress_bar
from shardify.reader import SamplingOptions
from shardify.reader.dataset import ShardedDataset
from shardify.reader.delivery.loader import make_loader
from shardify.reader.io.sources import Source
from shardify.reader.io.stream import Lost, ShardReader
from shardify.reader.io.tablesetup import sample_tables
from shardify.reader.sample import transforms as T
from shardify.reader.sample.decode import decode_image
from shardify.reader.sample.fields import output_fields

__all__ = ["run_bench"]


def _encoded_images(source: Source, limit: int | None) -> list[tuple[str, bytes]]:
    """``(key, image bytes)`` of the first ``limit`` samples (all when None)."""
    reader = ShardReader(
        [s.url for s in source.shards],
        source.sizes,
        skip_damaged=True,
        chunks=[s.chunk for s in source.shards],
        tables=sample_tables([source]),  # each sample checked, as the loader does
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
        decode_all(encoded[:8], transform)  # warm up
        # The better of two passes, as the loader's figure is its best epoch.
        result["single_process_ips"] = max(len(encoded) / decode_all(encoded, transform)[1] for _ in range(2))
        steps.done("(a) single process")
        plain = PlainCropFlip(image_size)
        t0 = time.perf_counter()
        for _, data in encoded:
            plain(decode_image(data))
        result["single_process_plain_ips"] = len(encoded) / (time.perf_counter() - t0)
        steps.done("(a) plain PIL")
        result["fast_decode_vs_exact"] = fast_decode_figures(encoded, image_size)  # see cli/bench/fastdecode.py
        steps.done("(a) fast IDCT")
    finally:
        torch.set_num_threads(threads)
    if num_workers > 1:
        result["independent_processes_ips"] = independent_rate(encoded, transform, num_workers)
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
        result["webdataset_ips"] = webdataset_rate(
            source,
            batch_size=batch_size,
            num_workers=num_workers,
            image_size=image_size,
            shuffle_buffer=shuffle_buffer,
            epochs=wds_epochs,
            done=steps.done,
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
