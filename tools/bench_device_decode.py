"""Where the device side of device decode spends its time, per batch, on one GPU.

    python tools/bench_device_decode.py --dataset DIR [--batch-size 256] [--size 224] [--reps 10]

Takes batches as the workers plan them (``ShardedDataset(decoding=DecodeOptions(device=...))``
iterated in this process, no workers), then times on the device, each synchronised, best and
median of ``--reps``: (1) the batched JPEG decode alone (``torchvision.io.decode_jpeg(list,
device=...)``, nvJPEG); (2) crop, resize and flip alone (``augment_batch`` on the decoded images);
(3) the whole :class:`DeviceDecoder` call. 256 / (3) is the most images per second one decode
thread can give, whatever the workers do. ``--device cpu`` uses Pillow for (1): a check of the tool.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from bench_gpu_step import _dataset  # tools/: the dataset and transform the GPU benchmarks read

from shardify.reader.sample.device_augment import augment_batch
from shardify.reader.sample.device_decode import DeviceDecoder, encoded_images, nvjpeg_decoder, pil_decoder
from shardify.reader.sample.device_plan import EncodedBatch


def _timed(fn: Callable[[], Any], dev: torch.device, reps: int) -> dict[str, float]:
    fn()  # warm-up (nvJPEG handles, kernels)
    times = []
    for _ in range(reps):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t = time.perf_counter()
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t)
    return {"best_ms": 1000 * min(times), "median_ms": 1000 * statistics.median(times)}


def _encoded(batch: Any) -> EncodedBatch:
    images = batch[0] if isinstance(batch, (tuple, list)) else batch
    if not isinstance(images, EncodedBatch):
        raise TypeError(f"expected an EncodedBatch as the batch's first column, got {type(images).__name__}")
    return images


def measure(dataset: str | Path, *, device: str, batch_size: int, size: int, reps: int) -> dict[str, Any]:
    dev = torch.device(device)
    batch = _encoded(next(iter(_dataset(dataset, batch_size, size, "device", dev))))  # bench_gpu_step's dataset
    rows, encoded = encoded_images(batch)
    jpeg = nvjpeg_decoder() if dev.type == "cuda" else pil_decoder
    decoded = jpeg(encoded, dev)
    idx = torch.tensor(rows)
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "batch_size": batch_size,
        "size": size,
        "jpegs": len(encoded),
        "megapixels": sum(im.shape[1] * im.shape[2] for im in decoded) / 1e6,
    }
    out["decode"] = _timed(lambda: jpeg(encoded, dev), dev, reps)
    out["augment"] = _timed(
        lambda: augment_batch(decoded, batch.boxes[idx], batch.bounds[idx], batch.flips[idx], batch.size), dev, reps
    )
    whole = DeviceDecoder(dev, jpeg_decoder=jpeg)
    out["whole"] = _timed(lambda: whole(batch), dev, reps)
    out["img_s_one_thread"] = batch_size / (out["whole"]["best_ms"] / 1000)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", type=Path, required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args(argv)
    r = measure(args.dataset, device=args.device, batch_size=args.batch_size, size=args.size, reps=args.reps)
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
