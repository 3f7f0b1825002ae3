"""Training step time with shardify's loader against pre-staged device batches.

``python tools/bench_gpu_step.py [--dataset DIR] [--device cuda] [--steps 50]``

(1) pre-staged: a few batches are read once, normalised and kept on the device; the loop
only runs the model (forward, backward, SGD step): the step time with no input cost at all.
(2) loader: the same model fed by ``make_loader(..., device=...)`` (workers decoding and
augmenting, pinned memory, side-stream copy, normalisation on the device). The ratio
(2)/(1) is what the input pipeline costs the step; near 1.0 means the GPU never waits. Runs
on the CPU too (``--device cpu``: no streams, a smaller default model), where the figure
mostly shows the cores shared between the model and the workers.
Without ``--dataset``, a dataset of photo-like JPEGs is made under ``--out`` (``benchlib.corpus.step_dataset``).

``tools/gpu_figures.py`` runs the GPU figures of docs/performance.md, each one command of this tool.

``--feed``: no model, the loop only takes batches (synchronising at the end): the loader's
rate into the GPU. ``--device-side``: where the device side of device decode spends its time,
per batch (batches as the workers prepare them, iterated in this process, no workers), timed on
the device, each synchronised, best and median of ``--reps``: (1) the batched JPEG decode alone
(``torchvision.io.decode_jpeg(list, device=...)``, nvJPEG); (2) crop, resize and flip alone
(``augment_batch`` on the decoded images); (3) the whole :class:`DeviceDecoder` call.
``--decode device``: ``DecodeOptions(device="cuda")`` (nvJPEG, needs torchvision); ``nvimgcodec``:
``decoder="nvimgcodec"`` (needs nvImageCodec); ``hybrid``: that with ``worker_share=--share``
(default auto). Their results add ``decoded_by`` (images by kind) and the share at the end.
``--model resnet50``: torchvision's ResNet-50 (bf16 autocast with ``--bf16``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from benchlib import corpus, timing
from torch import nn

from shardify.reader import BatchOptions, DecodeOptions, SamplingOptions, ShardedDataset, make_loader
from shardify.reader import transforms as T
from shardify.reader.delivery.prefetch import DevicePrefetcher
from shardify.reader.sample.device_augment import augment_batch
from shardify.reader.sample.device_decode import DeviceDecoder, encoded_images, nvjpeg_decoder, pil_decoder
from shardify.reader.sample.device_prep import EncodedBatch
from shardify.reader.sample.image_decoders import PillowDecoder


def small_convnet(width: int = 32, classes: int = 1000) -> nn.Module:
    """A ResNet-like stack of strided conv blocks (no torchvision needed)."""
    layers: list[nn.Module] = [
        nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
    ]
    c = width
    for _ in range(4):
        layers += [
            nn.Conv2d(c, 2 * c, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(2 * c),
            nn.ReLU(),
            nn.Conv2d(2 * c, 2 * c, 3, padding=1, bias=False),
            nn.BatchNorm2d(2 * c),
            nn.ReLU(),
        ]
        c *= 2
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, classes)]
    return nn.Sequential(*layers)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Waited:
    """Iterate ``batches``, adding up the host time spent waiting for each next batch (after ``skip``)."""

    def __init__(self, batches: Any, skip: int) -> None:
        self._batches, self._skip, self.seconds = batches, skip, 0.0

    def __iter__(self) -> Any:
        it = iter(self._batches)
        n = 0
        while True:
            t = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            if n >= self._skip:
                self.seconds += time.perf_counter() - t
            n += 1
            yield batch


def _steps(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    batches: Any,
    steps: int,
    device: torch.device,
    warmup: int,
    bf16: bool = False,
) -> float:
    """Seconds per step over ``steps`` steps after ``warmup`` (batches cycled as needed)."""
    loss_fn = nn.CrossEntropyLoss()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)
    done, t0 = 0, 0.0
    while done < warmup + steps:
        for images, labels in batches:
            if done == warmup:
                _sync(device)
                t0 = time.perf_counter()
            with autocast:
                loss = loss_fn(model(images), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            done += 1
            if done == warmup + steps:
                break
    _sync(device)
    return (time.perf_counter() - t0) / steps


def _model(name: str, width: int) -> nn.Module:
    if name == "resnet50":
        from torchvision.models import resnet50

        return resnet50()
    return small_convnet(width)


def feed_rate(
    dataset: str | Path,
    *,
    device: str = "cuda",
    batch_size: int = 256,
    image_size: int = 224,
    workers: int = 8,
    steps: int = 50,
    warmup: int = 5,
    decode: str = "workers",
    **kw: Any,
) -> dict[str, float]:
    """``{"img_s"}``: images per second out of the loader into ``device``, no model (``kw``: :func:`_dataset`'s)."""
    dev = torch.device(device)
    ds = _dataset(dataset, batch_size, image_size, decode, dev, **kw)
    with make_loader(ds, num_workers=workers, device=dev, **_decoder(decode, dev)) as loader:
        done, t0 = 0, 0.0
        for _images, _ in epochs(loader, ds):
            done += 1
            if done == warmup:
                _sync(dev)
                t0 = time.perf_counter()
            if done == warmup + steps:
                break
        _sync(dev)
    seconds = time.perf_counter() - t0
    return {
        "img_s": steps * batch_size / seconds,
        "batch_size": batch_size,
        "image_size": image_size,
        "workers": workers,
        "steps": steps,
        "decode": decode,
        **_decoded_by(ds),
    }


DECODES: dict[str, dict[str, Any] | None] = {  # --decode: DecodeOptions with device=; None: the CPU path
    "workers": None,
    "device": {},
    "nvimgcodec": {"decoder": "nvimgcodec"},
    "hybrid": {"decoder": "nvimgcodec", "worker_share": "auto"},  # --share
}


def _decoder(decode: str, dev: torch.device) -> dict[str, Any]:
    """On the CPU, device decode runs with Pillow in place of nvJPEG/nvImageCodec (a check of the tool only)."""
    if dev.type == "cpu" and DECODES[decode] is not None:
        return {"jpeg_decoder": PillowDecoder() if decode in ("nvimgcodec", "hybrid") else pil_decoder}
    return {}


def _dataset(
    dataset: str | Path, batch_size: int, image_size: int, decode: str, dev: torch.device, **kw: Any
) -> ShardedDataset:
    """``kw``: ``share`` (hybrid's worker_share), ``samples`` (samples_per_epoch: an epoch of many
    batches per worker from a small corpus)."""
    chosen = DECODES[decode]
    share = {"worker_share": kw.get("share", "auto")} if chosen and "worker_share" in chosen else {}
    decoding = DecodeOptions() if chosen is None else DecodeOptions(device=dev, **{**chosen, **share})
    return ShardedDataset(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        batching=BatchOptions(drop_last=True),
        sampling=SamplingOptions(samples_per_epoch=kw.get("samples")),
        transform=T.imagenet_train(image_size),
        decoding=decoding,
    )


def _decoded_by(ds: ShardedDataset) -> dict[str, Any]:
    """How the last epoch's images were decoded, by kind, and the hybrid split's share at the end."""
    strategy = ds.decode_strategy
    out: dict[str, Any] = {"decoded_by": strategy.tally.read()} if hasattr(strategy, "tally") else {}
    if getattr(strategy, "split", None) is not None:
        out["worker_share"] = round(strategy.split.share, 3)  # type: ignore[union-attr]
    return out


def step_times(
    dataset: str | Path,
    *,
    device: str = "cuda",
    batch_size: int = 64,
    image_size: int = 224,
    workers: int = 4,
    steps: int = 50,
    warmup: int = 5,
    width: int = 32,
    channels_last: bool = False,
    model_name: str = "convnet",
    bf16: bool = False,
    decode: str = "workers",
    **kw: Any,
) -> dict[str, float]:
    """``{"prestaged_ms", "loader_ms", "ratio"}``: see the module docstring (``kw``: :func:`_dataset`'s)."""
    dev = torch.device(device)
    ds = _dataset(dataset, batch_size, image_size, "workers", dev, **kw)
    model = _model(model_name, width).to(dev)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    staged = list(DevicePrefetcher([b for _, b in zip(range(4), iter(ds))], device=dev, channels_last=channels_last))
    prestaged = _steps(model, opt, staged, steps, dev, warmup, bf16)
    del staged
    ds = _dataset(dataset, batch_size, image_size, decode, dev, **kw)
    loader = make_loader(ds, num_workers=workers, device=dev, channels_last=channels_last, **_decoder(decode, dev))
    waited = _Waited(epochs(loader, ds), skip=warmup + 1)
    try:
        fed = _steps(model, opt, waited, steps, dev, warmup, bf16)
    finally:
        loader.close()
    # wait_ms: host time per step the loop spent in next(loader) (for the loader's batch, the
    # workers or the decode thread); near 0 with the step slower: the GPU is the limit.
    return {
        "prestaged_ms": 1000 * prestaged,
        "loader_ms": 1000 * fed,
        "ratio": fed / prestaged,
        "wait_ms": 1000 * waited.seconds / max(1, steps - 1),
        "batch_size": batch_size,
        "image_size": image_size,
        "workers": workers,
        "steps": steps,
        "model": model_name,
        "decode": decode,
        **_decoded_by(ds),
    }


def _encoded(batch: Any) -> EncodedBatch:
    images = batch[0] if isinstance(batch, (tuple, list)) else batch
    if not isinstance(images, EncodedBatch):
        raise TypeError(f"expected an EncodedBatch as the batch's first column, got {type(images).__name__}")
    return images


def device_side(dataset: str | Path, *, device: str, batch_size: int, size: int, reps: int) -> dict[str, Any]:
    """``--device-side``: the device decode's parts timed on one batch; see the module docstring."""
    dev = torch.device(device)
    batch = _encoded(next(iter(_dataset(dataset, batch_size, size, "device", dev))))
    rows, encoded = encoded_images(batch)
    jpeg = nvjpeg_decoder() if dev.type == "cuda" else pil_decoder
    decoded = jpeg(encoded, dev)
    idx = torch.tensor(rows)

    def timed(fn: Any) -> dict[str, float]:
        fn()  # warm-up (nvJPEG handles, kernels)
        sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else None
        ms = [1000 * t for t in timing.runs(fn, reps, sync=sync)]
        return {f"{k}_ms": v for k, v in timing.summary(ms).items()}

    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "batch_size": batch_size,
        "size": size,
        "jpegs": len(encoded),
        "megapixels": sum(im.shape[1] * im.shape[2] for im in decoded) / 1e6,
    }
    out["decode"] = timed(lambda: jpeg(encoded, dev))
    out["augment"] = timed(
        lambda: augment_batch(decoded, batch.boxes[idx], batch.bounds[idx], batch.flips[idx], batch.size)
    )
    whole = DeviceDecoder(dev, jpeg_decoder=jpeg)
    out["whole"] = timed(lambda: whole(batch))
    out["img_s_one_thread"] = batch_size / (out["whole"]["best_ms"] / 1000)
    return out


def epochs(loader: Any, ds: ShardedDataset) -> Any:
    """The loader's batches, epoch after epoch (``ds.set_epoch`` before each), without end."""
    epoch = 0
    while True:
        ds.set_epoch(epoch)
        yield from loader
        epoch += 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", type=Path, help="a converted dataset (default: make one under --out)")
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    p.add_argument("--images", type=int, default=1000, help="images of the made dataset (default: 1000)")
    p.add_argument("--copies", type=int, default=1, help="store each made image this many times (a longer epoch)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch-size", type=int, default=None, help="default: 128 on CUDA, 16 on the CPU")
    p.add_argument("--size", type=int, default=None, help="crop size (default: 224 on CUDA, 96 on the CPU)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--width", type=int, default=None, help="model width (default: 64 on CUDA, 16 on the CPU)")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--decode",
        choices=list(DECODES),
        default="workers",
        help="device: DecodeOptions(device=--device) (nvJPEG, needs torchvision); nvimgcodec: decoder='nvimgcodec' "
        "(needs nvImageCodec); hybrid: nvimgcodec with worker_share=--share",
    )
    p.add_argument("--share", default="auto", help="--decode hybrid: worker_share, a number in [0, 1] or auto")
    p.add_argument("--samples-per-epoch", type=int, default=None, help="an epoch of this many samples (oversampled)")
    p.add_argument("--model", choices=["convnet", "resnet50"], default="convnet")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast for the model")
    p.add_argument("--feed", action="store_true", help="no model: img/s of the loader into the device")
    p.add_argument("--device-side", action="store_true", help="device decode's own parts, per batch (JSON)")
    p.add_argument("--reps", type=int, default=10, help="--device-side: timed runs of each part")
    args = p.parse_args(argv)
    kw = {"share": args.share if args.share == "auto" else float(args.share), "samples": args.samples_per_epoch}
    cuda = args.device.startswith("cuda")
    dataset = args.dataset or corpus.step_dataset(args.out, args.images, copies=args.copies)
    name = torch.cuda.get_device_name() if cuda else "CPU"
    if args.device_side:
        batch_size, size = args.batch_size or 256, args.size or 224
        side = device_side(dataset, device=args.device, batch_size=batch_size, size=size, reps=args.reps)
        print(json.dumps(side))
        return 0
    if args.feed:
        f = feed_rate(
            dataset,
            device=args.device,
            batch_size=args.batch_size or (256 if cuda else 16),
            image_size=args.size or (224 if cuda else 96),
            workers=args.workers,
            steps=args.steps,
            decode=args.decode,
            **kw,
        )
        print(
            json.dumps(f)
            if args.json
            else f"{name}: {f['img_s']:.0f} img/s into the device ({args.decode} decode, {args.workers} workers, "
            f"batch {f['batch_size']} x {f['image_size']}px)"
        )
        return 0
    r = step_times(
        dataset,
        device=args.device,
        batch_size=args.batch_size or (128 if cuda else 16),
        image_size=args.size or (224 if cuda else 96),
        workers=args.workers,
        steps=args.steps,
        width=args.width or (64 if cuda else 16),
        channels_last=args.channels_last,
        model_name=args.model,
        bf16=args.bf16,
        decode=args.decode,
        **kw,
    )
    print(
        json.dumps(r)
        if args.json
        else f"{name}: batch {r['batch_size']} x {r['image_size']}px, {r['workers']} workers, {r['steps']} steps\n"
        f"  pre-staged device batches: {r['prestaged_ms']:.1f} ms/step\n"
        f"  shardify loader:           {r['loader_ms']:.1f} ms/step  = {r['ratio']:.2f} x pre-staged\n"
        f"  of which waiting for the next batch: {r['wait_ms']:.1f} ms/step (host time in next(loader))"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
