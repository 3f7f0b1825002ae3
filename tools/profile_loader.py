"""Where the host's time goes when feeding ImageNet-style training, stage by stage.

    python tools/profile_loader.py                      # 1 and 2 workers, CPU only
    python tools/profile_loader.py --workers 1 4 8 15 --device cuda   # on the GPU host

Recipe: RandomResizedCrop(224) + flip, batch 256, photo-like JPEGs of ImageNet's sizes (about
500x375, ~110 KB, made under ``--out`` with the tools' corpus maker). Stages, timed one by
one on one core in this process (best of ``--repeat``):

- CPU path (decode in the workers): shard read, decode (libjpeg-turbo at the DCT scale the
  crop allows, as the path does), augment (the rest of ``apply_encoded``: crop, resize,
  flip), collate (a batch of 256 into one tensor);
- device-decode path, worker side: shard read, header parse + box and flip draw
  (``DevicePrep``), pack (a batch's bytes into one tensor);
- loader runs with each ``--workers``: img/s out of ``make_loader`` (no device) over ``--batches``
  batches that cross epochs (``set_epoch`` at each), with the next epoch's first batches made
  ahead by the persistent workers and, in brackets, without (``epoch_ahead=False``); the main
  process's CPU time per batch (receiving the batch from a worker, unpacking it: the loader's
  own ``transfer`` stage in brackets);
  the same for the device-decode path's worker side (its batches are not decoded);
- with ``--device cuda``: pinning a batch, the host-to-device copy and normalisation, and
  img/s into the GPU for both paths (``tools/bench_gpu_step.py --feed``'s measurement; device
  decode with nvJPEG: needs torchvision).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from bench_gpu_step import epochs, feed_rate  # type: ignore[import-not-found]  # tools/ is on sys.path
from benchlib import corpus, timing  # type: ignore[import-not-found]

from shardify.reader import BatchOptions, DecodeOptions, ShardedDataset, make_loader
from shardify.reader import transforms as T
from shardify.reader.plan.shuffle import sample_rng
from shardify.reader.sample.collate import default_collate
from shardify.reader.sample.decode import _simplejpeg, draft_scale, turbo_jpeg_size
from shardify.reader.sample.device_prep import DevicePrep, pack_prepared

__all__ = ["profile", "main"]


def _read_all(ds: ShardedDataset) -> list[tuple[str, bytes]]:
    reader = ds._readers.get(ds._setup, ds.options)  # the dataset's own reader, in this process
    out = []
    for i, shard in enumerate(ds.source.shards):
        for item in reader.read(i, 0, shard.nsamples):
            out.append((str(item["__key__"]), bytes(item["jpg"])))  # type: ignore[index]
    return out


def stage_costs(dataset: Path, *, batch_size: int, size: int, repeat: int, limit: int) -> dict[str, float]:
    """Per image (us) and per batch (ms) costs of each stage on one core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a DataLoader worker
    try:
        return _stage_costs(dataset, batch_size=batch_size, size=size, repeat=repeat, limit=limit)
    finally:
        torch.set_num_threads(threads)


def _stage_costs(dataset: Path, *, batch_size: int, size: int, repeat: int, limit: int) -> dict[str, float]:
    t = T.imagenet_train(size)
    ds = ShardedDataset(dataset, batch_size=batch_size, transform=t, fields=("image", "cls"))
    read_s = timing.best_of(lambda: _read_all(ds), repeat)
    samples = _read_all(ds)[:limit]
    n = len(samples)
    read_us = read_s / len(_read_all(ds)) * 1e6
    crop = t.transforms[0]

    def decode_only() -> None:
        for key, data in samples:
            w, h = turbo_jpeg_size(data)  # type: ignore[misc]
            box, out = crop.draw_crop(w, h, sample_rng(0, 0, key))
            s = draft_scale(box, out)
            _simplejpeg.decode_jpeg(data, colorspace="RGB", min_width=-(-w // s), min_height=-(-h // s))

    def decode_augment() -> list[torch.Tensor]:
        return [t.apply_encoded(data, sample_rng(0, 0, key)) for key, data in samples]

    prep = DevicePrep(t)

    def prepare() -> list[Any]:
        return [prep.prepare(data, sample_rng(0, 0, key)) for key, data in samples]

    decode_us = timing.best_of(decode_only, repeat) / n * 1e6
    full_us = timing.best_of(decode_augment, repeat) / n * 1e6
    prep_us = timing.best_of(prepare, repeat) / n * 1e6
    images = decode_augment()
    batch = [(images[i % n], i % 1000) for i in range(batch_size)]
    collate_ms = timing.best_of(lambda: default_collate(batch), repeat) * 1e3
    prepared = prepare()
    prepared_batch = [prepared[i % n] for i in range(batch_size)]
    pack_ms = timing.best_of(lambda: pack_prepared(prepared_batch), repeat) * 1e3
    return {
        "images": n,
        "read_us": read_us,
        "decode_us": decode_us,
        "augment_us": full_us - decode_us,
        "decode_augment_us": full_us,
        "collate_ms": collate_ms,
        "header_draw_us": prep_us,
        "pack_ms": pack_ms,
    }


def _drain(batches: Any, count: int, sync: Callable[[], None]) -> tuple[float, float, int]:
    """(wall s, main-process CPU s, images) over ``count`` batches after the first (warm-up)."""
    it = iter(batches)
    next(it)
    sync()
    t0, c0, images = time.perf_counter(), time.process_time(), 0
    for _, b in zip(range(count), it):
        images += len(b[1]) if isinstance(b, (tuple, list)) else len(b)
    sync()
    return time.perf_counter() - t0, time.process_time() - c0, images


def loader_rates(
    dataset: Path, *, workers: int, batch_size: int, size: int, batches: int, device: str | None
) -> dict[str, float]:
    """img/s and main-process ms of CPU per batch: CPU path, device-decode worker side, and on
    CUDA the CPU path into the GPU and device decode (nvJPEG)."""

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    out: dict[str, float] = {"workers": workers}
    ds = ShardedDataset(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        batching=BatchOptions(drop_last=True),
        transform=T.imagenet_train(size),
    )
    for ahead in (False, True):  # the next epoch's first batches made ahead, or not (alternating runs)
        with make_loader(ds, num_workers=workers, epoch_ahead=ahead) as loader:
            wall, cpu, n = _drain(epochs(loader, ds), batches, sync)
            main = loader._meter.main.values()  # the main process's stages: receive + unpack ("transfer")
        key = "" if ahead else "_no_ahead"
        out |= {f"cpu_path{key}_img_s": n / wall, f"main_ms_per_batch{key}": 1e3 * cpu / batches}
        out[f"main_unpack_ms_per_batch{key}"] = 1e3 * main["transfer"] / (batches + 1)
    dev = ShardedDataset(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        batching=BatchOptions(drop_last=True),
        transform=T.imagenet_train(size),
        decoding=DecodeOptions(device="cpu"),
    )
    from torch.utils.data import DataLoader

    raw = DataLoader(dev, batch_size=None, num_workers=workers, collate_fn=lambda b: b, persistent_workers=workers > 0)
    wall, cpu, n = _drain(epochs(raw, dev), batches, sync)
    del raw
    out |= {"device_worker_side_img_s": n / wall, "device_main_ms_per_batch": 1e3 * cpu / batches}
    if device == "cuda":  # into the GPU: bench_gpu_step's --feed measurement, for both paths
        for decode, key in (("workers", "cpu_path_into_gpu_img_s"), ("device", "device_decode_into_gpu_img_s")):
            fed = feed_rate(
                dataset,
                device="cuda",
                batch_size=batch_size,
                image_size=size,
                workers=workers,
                steps=batches,
                warmup=1,
                decode=decode,
            )
            out[key] = fed["img_s"]
    return out


def copy_costs(*, batch_size: int, size: int, repeat: int) -> dict[str, float]:
    """On CUDA: pin a uint8 batch (ms), copy it to the GPU and normalise it there (ms)."""
    from shardify.reader.delivery.prefetch import DevicePrefetcher

    x = torch.randint(0, 256, (batch_size, 3, size, size), dtype=torch.uint8)
    pin_ms = timing.best_of(lambda: x.pin_memory(), repeat) * 1e3
    pinned = x.pin_memory()
    pre = DevicePrefetcher([], device="cuda")

    def copy() -> None:
        pre._convert(pinned)
        torch.cuda.synchronize()

    return {"pin_ms": pin_ms, "h2d_normalise_ms": timing.best_of(copy, repeat) * 1e3}


def profile(
    dataset: Path,
    *,
    workers: list[int],
    batch_size: int = 256,
    size: int = 224,
    batches: int = 6,
    repeat: int = 3,
    limit: int = 256,
    device: str | None = None,
) -> dict[str, Any]:
    r: dict[str, Any] = {
        "stages": stage_costs(dataset, batch_size=batch_size, size=size, repeat=repeat, limit=limit),
        "loaders": [
            loader_rates(dataset, workers=w, batch_size=batch_size, size=size, batches=batches, device=device)
            for w in workers
        ],
        "batch_size": batch_size,
        "size": size,
        "device": device or "none",
    }
    if device == "cuda":
        r["copy"] = copy_costs(batch_size=batch_size, size=size, repeat=repeat)
    return r


def format_profile(r: dict[str, Any]) -> str:
    s, b = r["stages"], r["batch_size"]
    per_image = [
        ("shard read", s["read_us"]),
        ("decode (DCT-scaled as the path does)", s["decode_us"]),
        ("augment (crop, resize, flip)", s["augment_us"]),
        ("collate", s["collate_ms"] * 1e3 / b),
    ]
    cpu_total = sum(v for _, v in per_image)
    dev = [
        ("shard read", s["read_us"]),
        ("header parse + box/flip draw", s["header_draw_us"]),
        ("pack bytes", s["pack_ms"] * 1e3 / b),
    ]
    dev_total = sum(v for _, v in dev)
    lines = [
        f"one core, {s['images']} images, batch {b}, crop {r['size']}",
        "",
        "| stage | us / image | ms / batch |",
        "|---|---:|---:|",
    ]
    lines += [f"| CPU path: {k} | {v:.0f} | {v * b / 1e3:.1f} |" for k, v in per_image]
    lines += [f"| **CPU path, worker total** | **{cpu_total:.0f}** | **{cpu_total * b / 1e3:.1f}** |"]
    lines += [f"| device decode, worker: {k} | {v:.1f} | {v * b / 1e3:.2f} |" for k, v in dev]
    lines += [f"| **device decode, worker total** | **{dev_total:.1f}** | **{dev_total * b / 1e3:.2f}** |"]
    if "copy" in r:
        c = r["copy"]
        lines += [
            f"| pin a batch | {c['pin_ms'] * 1e3 / b:.1f} | {c['pin_ms']:.1f} |",
            f"| host-to-device copy + normalise | {c['h2d_normalise_ms'] * 1e3 / b:.1f} | "
            f"{c['h2d_normalise_ms']:.1f} |",
        ]
    lines += [
        "",
        "| workers | CPU path img/s (next epoch's first batch not made ahead) | main-process CPU ms / batch "
        "(of which unpack) | device decode, worker side img/s |"
        + (" CPU path into GPU img/s | device decode into GPU img/s |" if r["device"] == "cuda" else ""),
        "|---:|---:|---:|---:|" + ("---:|---:|" if r["device"] == "cuda" else ""),
    ]
    for x in r["loaders"]:
        row = (
            f"| {x['workers']} | {x['cpu_path_img_s']:.0f} ({x['cpu_path_no_ahead_img_s']:.0f}) | "
            f"{x['main_ms_per_batch']:.1f} ({x['main_unpack_ms_per_batch']:.2f}) | "
            f"{x['device_worker_side_img_s']:.0f} |"
        )
        if r["device"] == "cuda":
            row += f" {x['cpu_path_into_gpu_img_s']:.0f} | {x['device_decode_into_gpu_img_s']:.0f} |"
        lines.append(row)
    lines += [
        "",
        f"one core: CPU path {1e6 / cpu_total:.0f} img/s, device-decode worker side {1e6 / dev_total:.0f} img/s",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", type=Path, help="a converted dataset of JPEGs (default: make one under --out)")
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    p.add_argument("--images", type=int, default=1024, help="images of the made dataset")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batches", type=int, default=6, help="timed batches per loader run (after one warm-up)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--device", choices=["cuda"], default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    dataset = args.dataset or corpus.step_dataset(args.out, args.images)
    r = profile(
        dataset,
        workers=args.workers,
        batch_size=args.batch_size,
        size=args.size,
        batches=args.batches,
        repeat=args.repeat,
        device=args.device,
    )
    print(json.dumps(r) if args.json else format_profile(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
