"""The ``decoders`` group of tools/gpu_figures.py: the four ways to decode, side by side.

Each way feeds ``tools/bench_gpu_step.py``'s loop: ``workers`` (the CPU path, 15 workers),
``device`` (nvJPEG through torchvision, 8 workers), ``nvimgcodec`` (``decoder="nvimgcodec"``:
hardware engines, then CUDA, then the CPU; 8 workers) and ``hybrid`` (that with
``worker_share="auto"``, 15 workers). On two corpora: ``imagenet`` (the GPU tools' photo-like
JPEGs of ImageNet's sizes) and ``camera`` (camera-sized photos with a camera roll's mix of
encodings: 4:4:4, progressive, grayscale, CMYK; ``benchlib.corpus.camera_dataset``), or a folder
of real photos given with ``--photos-dir``. Figures: img/s into the GPU without a model (both
corpora), and ResNet-50 (bf16, channels_last, batch 256) ms/step against pre-staged batches
(``imagenet``), and the device side of ``decoder="nvimgcodec"`` per batch (``python
tools/gpu_decoders.py --device-side --dataset DIR``: each backend's decode with and without
regions, the crop/resize/flip, the whole stage; the most one decode thread gives). About 4-5
minutes on a 16-core H100/H200 host; the nvImageCodec figures are skipped (not failed) where
``nvidia.nvimgcodec`` cannot be imported.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["WAYS", "CAMERA_IMAGES", "CAMERA_SAMPLES", "decoder_figures", "nvimgcodec_missing", "device_side"]

WAYS = (("workers", 15), ("device", 8), ("nvimgcodec", 8), ("hybrid", 15))
"""(--decode, workers) of each way, in the order they run."""
CAMERA_IMAGES = 320
CAMERA_SAMPLES = 7680
"""The camera corpus's photos, and the samples of an epoch over them (each read 24 times): two
batches of 256 for each of 15 workers, so that the steady rate is measured, not epoch starts."""


def nvimgcodec_missing() -> bool:
    """Whether ``nvidia.nvimgcodec`` cannot be found (its figures are then skipped)."""
    try:
        return importlib.util.find_spec("nvidia.nvimgcodec") is None
    except ModuleNotFoundError:  # no ``nvidia`` package at all
        return True


def decoder_figures(
    corpora: dict[str, Path], *, device: str, quick: bool, bench: Path
) -> list[tuple[str, list[str], str, bool]]:
    """``(name, argv, target, needs nvImageCodec)`` of each figure, for ``corpora`` (name -> dataset;
    ``imagenet`` first, which also gets the ResNet-50 step figures)."""
    py = sys.executable
    size = ["--batch-size", "8", "--size", "64", "--steps", "3"] if quick else ["--batch-size", "256", "--size", "224"]
    steps = [] if quick else ["--steps", "30"]
    out = []
    for corpus, dataset in corpora.items():
        common = ["--dataset", str(dataset), "--device", device, "--json", *size, *steps]
        if corpus != "imagenet" and not quick:
            common += ["--samples-per-epoch", str(CAMERA_SAMPLES)]
        for decode, workers in WAYS:
            w = str(min(workers, 2) if quick else workers)
            argv = [py, str(bench), "--feed", *common, "--decode", decode, "--workers", w]
            needs = decode in ("nvimgcodec", "hybrid") and device != "cpu"
            out.append((f"feed {corpus}, {decode}, {w} workers", argv, ">= 10,000 img/s", needs))
    model = ["--model", "resnet50"] + ([] if quick else ["--bf16", "--channels-last"])
    common = ["--dataset", str(corpora["imagenet"]), "--device", device, "--json", *size, *steps, *model]
    for decode, workers in WAYS:
        w = str(min(workers, 2) if quick else workers)
        argv = [py, str(bench), *common, "--decode", decode, "--workers", w]
        needs = decode in ("nvimgcodec", "hybrid") and device != "cpu"
        out.append((f"resnet50 step imagenet, {decode}, {w} workers", argv, "<= 1.05x pre-staged", needs))
    for corpus, dataset in corpora.items():
        argv = [py, str(Path(__file__)), "--device-side", "--dataset", str(dataset), "--device", device]
        argv += ["--batch-size", "8", "--size", "64", "--reps", "2"] if quick else []
        out.append((f"nvimgcodec device side {corpus}, per batch", argv, "", device != "cpu"))
    return out


def device_side(dataset: Path, *, device: str, batch_size: int, size: int, reps: int) -> dict[str, Any]:
    """ms per batch (best and median of ``reps``) of each decoder kind alone, with and without
    regions, of crop/resize/flip, and of the whole ``CodecDecoder`` call; on the CPU, Pillow."""
    import torch
    from benchlib import timing

    from shardify.reader import DecodeOptions, ShardedDataset
    from shardify.reader import transforms as T
    from shardify.reader.sample.codec_decode import CodecDecoder, crop_regions
    from shardify.reader.sample.device_augment import augment_batch
    from shardify.reader.sample.device_decode import encoded_images
    from shardify.reader.sample.image_decoders import NvImageCodecDecoder, PillowDecoder

    dev = torch.device(device)
    options = DecodeOptions(device=dev, decoder="nvimgcodec")
    transform = T.imagenet_train(size)
    batch = next(
        iter(ShardedDataset(dataset, batch_size=batch_size, shuffle=True, transform=transform, decoding=options))
    )
    batch = batch[0]
    rows, encoded = encoded_images(batch)
    idx = torch.tensor(rows)
    boxes, bounds = batch.boxes[idx], batch.bounds[idx]
    regions = crop_regions(boxes, bounds, batch.size)
    cuda = dev.type == "cuda"
    kinds = [NvImageCodecDecoder(k, dev) for k in ("hardware", "cuda")] if cuda else [PillowDecoder()]
    sync = (lambda: torch.cuda.synchronize(dev)) if cuda else None

    def timed(fn: Any) -> dict[str, float]:
        fn()  # warm-up
        return {f"{k}_ms": v for k, v in timing.summary([1000 * t for t in timing.runs(fn, reps, sync=sync)]).items()}

    out: dict[str, Any] = {"device": torch.cuda.get_device_name(dev) if cuda else "cpu", "jpegs": len(encoded)}
    for d in kinds:
        decoded = d.decode(encoded, [None] * len(encoded), dev)
        out[f"{d.kind}_decoded"] = sum(im is not None for im in decoded)
        out[f"{d.kind}_whole"] = timed(lambda d=d: d.decode(encoded, [None] * len(encoded), dev))
        out[f"{d.kind}_regions"] = timed(lambda d=d: d.decode(encoded, list(regions), dev))
    cut = [im for im in kinds[-1].decode(encoded, list(regions), dev) if im is not None]
    if len(cut) == len(encoded):  # crop/resize/flip of the regions, as the stage runs it
        shift = torch.tensor([[r[0], r[1]] * 2 for r in regions], dtype=torch.float64)
        dtype = torch.float16 if cuda else torch.float32
        args = (cut, boxes - shift, bounds - shift, batch.flips[idx], batch.size)
        out["augment"] = timed(lambda: augment_batch(*args, dtype=dtype))
    stage = CodecDecoder(dev, decoders=[*kinds, PillowDecoder()] if cuda else kinds)
    out["stage"] = timed(lambda: stage(batch))
    out["img_s_one_thread"] = batch_size / (out["stage"]["best_ms"] / 1000)
    out["decoded_by"] = stage.tally.read()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device-side", action="store_true", required=True)
    p.add_argument("--dataset", type=Path, required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--reps", type=int, default=10)
    a = p.parse_args(argv)
    print(json.dumps(device_side(a.dataset, device=a.device, batch_size=a.batch_size, size=a.size, reps=a.reps)))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
