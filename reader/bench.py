"""``run_bench``: how fast a dataset reads, next to a single process and webdataset.

Measures, on the dataset given: (a) one process decoding and augmenting the images (our
fast path, the better of two passes; and the plain PIL path), and ``num_workers`` such
processes at once, each on its share, with no loader: what the machine's cores give
together (shared caches, memory bandwidth and clock boost make it less than
``num_workers`` times (a)); (b) our loader with ``num_workers`` workers, its best epoch
after the first; (c) webdataset's pipeline doing the same work (PIL decode, the same crop
and flip, uint8 batches) in the same DataLoader setup; (d) time to the first batch of a
fresh loader; (e) memory (PSS) of the main process and its workers after each epoch; (f)
shuffle quality, the mean distance in the original order between consecutive samples,
against a full random permutation's (~N/3), here and for an ImageNet-size dataset
(computed from the plan alone); (g) shuffle quality across ranks: distinct classes per batch
on class-sorted shards relative to a full random permutation, at world 1, 2 and 8
(:func:`class_mixing`, from the plan alone). The CLI's ``shardify bench`` and
``tools/bench_read.py`` call it. (a) also times the same work with ``fast_decode=True`` (libjpeg-turbo's fast IDCT
and upsampling) against the exact path, in alternating passes of one run, and reports how
far its pixels are from the exact path's. A split without images gets (b), (d), (e) and (f) on its default fields, and the
result says which figures it cannot measure (``not_measured``).
"""

from __future__ import annotations

import itertools
import os
import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from shardify.reader.plan.mix import epoch_sequence
from shardify.reader.plan.resume import PlanOptions
from shardify.reader.plan.simulate import Entry, rank_batches
from shardify.reader.dataset import ShardedDataset
from shardify.reader.delivery.loader import make_loader
from shardify.reader.plan.shuffle import sample_rng
from shardify.errors import SplitRequiredError
from shardify.reader.io.sources import ShardInfo, Source, resolve_source
from shardify.reader.io.stream import Lost, ShardReader
from shardify.reader.bench_decode import fast_decode_figures
from shardify.reader.sample.fields import output_fields

__all__ = ["run_bench", "format_bench", "shuffle_quality", "class_mixing", "permutation_classes", "process_memory",
           "child_pids", "bench_source"]


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


def _rank0_batches(sizes: list[int], *, seed: int, epoch: int, batch_size: int, workers: int, shuffle_buffer: int,
                   shuffle_block: int, rank: int = 0, world: int = 1, interleave: bool = True) -> list[list[Entry]]:
    opts = PlanOptions(seed=seed, shuffle=True, batch_size=batch_size, drop_last=False, block=shuffle_block,
                       buffer=shuffle_buffer)
    seq = epoch_sequence([sizes], counts=None, seed=seed, epoch=epoch, shuffle=True, block=shuffle_block,
                         interleave=interleave)
    return rank_batches(seq, opts, epoch=epoch, rank=rank, world=world, workers=max(1, workers))


def shuffle_quality(source: Source, *, seed: int, epoch: int, batch_size: int, workers: int,
                    shuffle_buffer: int, shuffle_block: int) -> dict[str, float]:
    """How well rank 0's epoch is mixed, from the plan alone (no I/O).

    ``gap``: mean |original index difference| of consecutive samples over N/3 (a full random
    permutation gives ~1). ``shards_per_batch``: mean number of distinct shards in a batch.
    """
    start = [0]
    for s in source.sizes:
        start.append(start[-1] + s)
    batches = _rank0_batches(source.sizes, seed=seed, epoch=epoch, batch_size=batch_size, workers=workers,
                             shuffle_buffer=shuffle_buffer, shuffle_block=shuffle_block)
    seq = [start[shard] + i for batch in batches for shard, i, _ in batch]
    n = len(seq)
    if n < 2:
        return {"gap": 0.0, "shards_per_batch": 1.0}
    gap = sum(abs(a - b) for a, b in zip(seq, seq[1:])) / (n - 1)
    shards = sum(len({shard for shard, _, _ in batch}) for batch in batches) / len(batches)
    return {"gap": gap / (n / 3), "shards_per_batch": shards}


def bench_source(dataset: str | os.PathLike[str], split: str | None) -> Source:
    """The split to measure: ``split``, else the only split, else ``train`` when there is one."""
    try:
        return resolve_source(dataset, split=split)
    except SplitRequiredError as e:
        if split is not None or "train" not in e.splits:
            raise
        return resolve_source(dataset, split="train")


def permutation_classes(*, classes: int, per_class: int, batch_size: int) -> float:
    """Expected distinct classes in ``batch_size`` samples of a uniform random permutation."""
    n = classes * per_class
    absent = 1.0
    for i in range(min(batch_size, n)):
        absent *= max(0, n - per_class - i) / (n - i)
    return classes * (1 - absent)


def class_mixing(*, world: int, classes: int = 100, per_class: int = 1000, samples_per_shard: int = 1000,
                 batch_size: int = 256, workers: int = 4, shuffle_buffer: int = 1024, shuffle_block: int = 4,
                 seed: int = 0, epoch: int = 0, interleave: bool = True) -> float:
    """Mean distinct classes per batch (every rank's batches) on class-sorted shards, over a
    uniform random permutation's; ``interleave=False``: whole shards in order, as before
    cross-rank shuffle. Computed from the plan alone."""
    n = classes * per_class
    sizes = [min(samples_per_shard, n - a) for a in range(0, n, samples_per_shard)]
    start = list(itertools.accumulate(sizes, initial=0))
    distinct, count = 0, 0
    for rank in range(world):
        for batch in _rank0_batches(sizes, seed=seed, epoch=epoch, batch_size=batch_size, workers=workers,
                                    shuffle_buffer=shuffle_buffer, shuffle_block=shuffle_block, rank=rank,
                                    world=world, interleave=interleave):
            if len(batch) == batch_size:
                distinct += len({(start[s] + i) // per_class for s, i, _ in batch})
                count += 1
    return distinct / count / permutation_classes(classes=classes, per_class=per_class, batch_size=batch_size)


def _encoded_images(source: Source, limit: int | None) -> list[tuple[str, bytes]]:
    """``(key, image bytes)`` of the first ``limit`` samples (all when None)."""
    reader = ShardReader([s.url for s in source.shards], source.sizes, skip_damaged=True,
                         chunks=[s.chunk for s in source.shards])
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
        from shardify.reader.sample.transforms import RandomResizedCrop

        self.size = size
        self._crop = RandomResizedCrop(size)  # only its torchvision-equivalent parameter draw

    def __call__(self, img: Any) -> torch.Tensor:
        from PIL import Image

        y, x, ch, cw = self._crop.crop_params(img.width, img.height, random)  # type: ignore[arg-type]
        img = img.resize((self.size, self.size), Image.BILINEAR, box=(x, y, x + cw, y + ch))
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1).contiguous()


def _stack_batch(samples: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    images = torch.stack([s[0] for s in samples])
    return images, torch.tensor([int(s[1]) for s in samples], dtype=torch.int64)


def _rate(loader: Any, epochs: int, set_epoch: Callable[[int], None] | None = None,
          memory: list[int] | None = None) -> tuple[list[float], float]:
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
) -> dict[str, Any]:
    """Benchmark reading ``dataset``; see the module docstring. Returns the figures as a dict."""
    from shardify.reader.sample import transforms as T
    from shardify.reader.sample.decode import decode_image

    source = bench_source(dataset, split)
    transform = T.Compose([T.RandomResizedCrop(image_size, fast_decode=fast_decode), T.RandomHorizontalFlip()])
    result: dict[str, Any] = {"dataset": str(dataset), "split": source.split, "samples": source.num_samples,
                              "shards": len(source.shards), "batch_size": batch_size,
                              "num_workers": num_workers, "image_size": image_size, "fast_decode": fast_decode}
    encoded = _encoded_images(source, single_limit)
    if not encoded:
        return _run_without_images(result, source, epochs=epochs, shuffle_buffer=shuffle_buffer,
                                   shuffle_block=shuffle_block)

    # (a) the same work as one loader worker does: per-key RNG, one torch thread.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _decode_all(encoded[:8], transform)  # warm up
        # The better of two passes, as the loader's figure is its best epoch.
        result["single_process_ips"] = max(len(encoded) / _decode_all(encoded, transform)[1] for _ in range(2))
        plain = PlainCropFlip(image_size)
        t0 = time.perf_counter()
        for _, data in encoded:
            plain(decode_image(data))
        result["single_process_plain_ips"] = len(encoded) / (time.perf_counter() - t0)
        result["fast_decode_vs_exact"] = fast_decode_figures(encoded, image_size)  # see bench_decode
    finally:
        torch.set_num_threads(threads)
    if num_workers > 1:
        result["independent_processes_ips"] = _independent_rate(encoded, transform, num_workers)
    del encoded

    base = process_memory()
    ds = ShardedDataset(source, batch_size=batch_size, shuffle=True, seed=0, transform=transform,
                        shuffle_buffer=shuffle_buffer, shuffle_block=shuffle_block)
    _loader_figures(result, ds, num_workers=num_workers, epochs=epochs, base=base)
    del ds

    if compare_webdataset:
        result["webdataset_ips"] = _webdataset_rate(source, batch_size, num_workers, image_size,
                                                    shuffle_buffer, min(epochs, 3))
    _shuffle_figures(result, source, shuffle_buffer, shuffle_block)
    single = result["single_process_ips"]
    result["loader_vs_2x_single"] = result["loader_ips"] / (max(1, num_workers) * single)
    if result.get("independent_processes_ips"):
        result["independent_vs_2x_single"] = result["independent_processes_ips"] / (num_workers * single)
    if "webdataset_ips" in result:
        result["loader_vs_webdataset"] = result["loader_ips"] / result["webdataset_ips"]
    return result


def _loader_figures(result: dict[str, Any], ds: ShardedDataset, *, num_workers: int, epochs: int, base: int) -> None:
    """(b), (d), (e): the loader's rate per epoch (best after the first), first batch, memory."""
    loader = make_loader(ds, num_workers=num_workers)
    memory: list[int] = []
    rates, result["first_batch_s"] = _rate(loader, epochs, ds.set_epoch, memory)
    result["loader_ips_per_epoch"] = rates
    result["loader_ips"] = max(rates[1:] or rates)
    result["memory_mb_per_epoch"] = [(m - base) / 2**20 for m in memory]
    loader.close()


def _shuffle_figures(result: dict[str, Any], source: Source, shuffle_buffer: int, shuffle_block: int) -> None:
    """(f): shuffle quality here, with the buffer alone, and at ImageNet scale; (g) class mixing across ranks."""
    batch_size, workers = result["batch_size"], result["num_workers"]
    result["shuffle_quality"] = shuffle_quality(source, seed=0, epoch=1, batch_size=batch_size, workers=workers,
                                                shuffle_buffer=shuffle_buffer, shuffle_block=shuffle_block)
    result["shuffle_quality_buffer_only"] = shuffle_quality(
        source, seed=0, epoch=1, batch_size=batch_size, workers=workers, shuffle_buffer=shuffle_buffer,
        shuffle_block=source.num_samples)
    imagenet = Source(name="imagenet-like", split=None, shards=tuple(ShardInfo("", 1251) for _ in range(1024)))
    result["shuffle_quality_imagenet"] = shuffle_quality(
        imagenet, seed=0, epoch=1, batch_size=256, workers=8, shuffle_buffer=shuffle_buffer, shuffle_block=shuffle_block)
    result["class_mixing"] = {w: class_mixing(world=w, shuffle_buffer=shuffle_buffer, shuffle_block=shuffle_block)
                              for w in (1, 2, 8)}
    result["class_mixing_whole_shards"] = {
        w: class_mixing(world=w, shuffle_buffer=shuffle_buffer, shuffle_block=shuffle_block, interleave=False)
        for w in (1, 2, 8)}


def _run_without_images(result: dict[str, Any], source: Source, *, epochs: int, shuffle_buffer: int,
                        shuffle_block: int) -> dict[str, Any]:
    """(b), (d), (e), (f) for a split without images, reading its default fields undecoded-by-us."""
    base = process_memory()
    fields = output_fields(None, source.fields, where=f"{source.name} split {source.split!r}")
    ds = ShardedDataset(source, batch_size=result["batch_size"], shuffle=True, seed=0, fields=fields,
                        shuffle_buffer=shuffle_buffer, shuffle_block=shuffle_block)
    result["fields"] = list(fields)
    result["not_measured"] = (
        f"this split holds no images (its fields: {', '.join(source.fields) or 'unknown'}), so (a) image "
        "decoding and augmentation and (c) the webdataset comparison are not measured; (b) counts samples/s "
        f"reading and decoding fields {', '.join(fields)}, with no transform")
    _loader_figures(result, ds, num_workers=result["num_workers"], epochs=epochs, base=base)
    del ds
    _shuffle_figures(result, source, shuffle_buffer, shuffle_block)
    return result


def _decode_all(encoded: list[tuple[str, bytes]], transform: Any) -> tuple[float, float]:
    """Decode and augment every image as a loader worker would (per-key RNG); (start, seconds)."""
    from shardify.reader.sample.transforms import run_image_transform

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
    procs = [ctx.Process(target=_decode_share, args=(encoded[i::processes], transform, start, out))
             for i in range(processes)]
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


def _webdataset_rate(source: Source, batch_size: int, num_workers: int, image_size: int,
                     shuffle_buffer: int, epochs: int) -> float:
    import webdataset as wds
    from torch.utils.data import DataLoader

    crop = PlainCropFlip(image_size)
    pipeline = (wds.WebDataset([s.url for s in source.shards], shardshuffle=len(source.shards), seed=0,
                               empty_check=False)
                .shuffle(shuffle_buffer)
                .decode("pil")
                .to_tuple("jpg;jpeg;png;webp", "cls")
                .map_tuple(crop, int)
                .batched(batch_size, collation_fn=_stack_batch, partial=True))
    loader = DataLoader(pipeline, batch_size=None, num_workers=num_workers, persistent_workers=num_workers > 0)
    rates, _ = _rate(loader, epochs)
    return max(rates[1:] or rates)


def format_bench(r: dict[str, Any]) -> str:
    """The figures of :func:`run_bench` as a table."""
    w = r["num_workers"]
    q, b, i = r["shuffle_quality"], r["shuffle_quality_buffer_only"], r["shuffle_quality_imagenet"]
    if "not_measured" in r:
        return _format_without_images(r)
    rows = [
        ("dataset", f"{r['samples']} samples in {r['shards']} shards, batches of {r['batch_size']}, "
                    f"{w} workers, RandomResizedCrop {r['image_size']} + flip, uint8"),
        ("(a) single process, fast path", f"{r['single_process_ips']:.0f} images/s"),
        ("    single process, plain PIL", f"{r['single_process_plain_ips']:.0f} images/s"),
    ]
    fd = r.get("fast_decode_vs_exact")
    if fd:
        rows.append(("    fast IDCT (fast_decode=True)", f"{fd['ratio']:.2f} x the exact path ({fd['fast_ips']:.0f} vs "
                     f"{fd['exact_ips']:.0f} images per CPU second); pixels off by {fd['mean_abs_diff']:.2f} on average, "
                     f"{fd['max_abs_diff']:.0f} at most (0..255), {100 * fd['share_differing']:.0f}% differ"))
    if r.get("independent_processes_ips"):
        rows.append((f"    {w} bare processes at once", f"{r['independent_processes_ips']:.0f} images/s = "
                     f"{r['independent_vs_2x_single']:.2f} x {w} x (a)  (this machine's ceiling for (b))"))
    rows.append((f"(b) shardify loader, {w} workers", f"{r['loader_ips']:.0f} images/s = "
                 f"{r['loader_vs_2x_single']:.2f} x {w} x (a)  (target >= 0.90)"))
    if "webdataset_ips" in r:
        rows.append((f"(c) webdataset, {w} workers", f"{r['webdataset_ips']:.0f} images/s; shardify = "
                     f"{r['loader_vs_webdataset']:.2f} x  (target >= 1.30)"))
    rows += [
        ("(d) time to first batch", f"{r['first_batch_s']:.2f} s  (target < 1 s)"),
        ("(e) memory by epoch (PSS, MB)", " ".join(f"{m:.0f}" for m in r["memory_mb_per_epoch"])),
        ("    loader images/s by epoch", " ".join(f"{x:.0f}" for x in r["loader_ips_per_epoch"])),
        ("(f) shuffle: mean gap / (N/3)", f"{q['gap']:.2f}, {q['shards_per_batch']:.1f} shards per batch "
         f"(buffer alone: {b['gap']:.2f}, {b['shards_per_batch']:.1f}; full permutation: 1.00)"),
        ("    at ImageNet scale", f"{i['gap']:.2f}, {i['shards_per_batch']:.1f} shards per batch of 256 "
         "(1.28 M samples in 1024 shards, 8 workers; full permutation: 1.00, ~226)"),
    ]
    mix, old = r["class_mixing"], r["class_mixing_whole_shards"]
    rows.append(("(g) classes per batch / permutation", ", ".join(f"world {w}: {mix[w]:.2f}" for w in mix) +
                 "  (target >= 0.90; class-sorted shards, 100 classes x 1000, batches of 256, 4 workers; "
                 "whole shards per rank as before: " + ", ".join(f"{old[w]:.2f}" for w in old) + ")"))
    return _table(rows)


def _table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _format_without_images(r: dict[str, Any]) -> str:
    q = r["shuffle_quality"]
    return _table([
        ("dataset", f"{r['samples']} samples in {r['shards']} shards, batches of {r['batch_size']}, "
                    f"{r['num_workers']} workers, fields {', '.join(r['fields'])}"),
        ("not measured", r["not_measured"]),
        (f"(b) shardify loader, {r['num_workers']} workers", f"{r['loader_ips']:.0f} samples/s"),
        ("(d) time to first batch", f"{r['first_batch_s']:.2f} s"),
        ("(e) memory by epoch (PSS, MB)", " ".join(f"{m:.0f}" for m in r["memory_mb_per_epoch"])),
        ("(f) shuffle: mean gap / (N/3)", f"{q['gap']:.2f}, {q['shards_per_batch']:.1f} shards per batch"),
    ])
