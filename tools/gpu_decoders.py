"""The ``decoders`` group of tools/gpu_figures.py: the four ways to decode, side by side.

Each way feeds ``tools/bench_gpu_step.py``'s loop: ``workers`` (the CPU path, 15 workers),
``device`` (nvJPEG through torchvision, 8 workers), ``nvimgcodec`` (``decoder="nvimgcodec"``:
hardware engines, then CUDA, then the CPU; 8 workers) and ``hybrid`` (that with
``worker_share="auto"``, 15 workers). On two corpora: ``imagenet`` (the GPU tools' photo-like
JPEGs of ImageNet's sizes) and ``camera`` (camera-sized photos with a camera roll's mix of
encodings: 4:4:4, progressive, grayscale, CMYK; ``benchlib.corpus.camera_dataset``), or a folder
of real photos given with ``--photos-dir``. Figures: img/s into the GPU without a model (both
corpora), and ResNet-50 (bf16, channels_last, batch 256) ms/step against pre-staged batches
(``imagenet``). About 4-5 minutes on a 16-core H100/H200 host; the nvImageCodec figures are
skipped (not failed) where ``nvidia.nvimgcodec`` cannot be imported.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

__all__ = ["WAYS", "CAMERA_IMAGES", "CAMERA_SAMPLES", "decoder_figures", "nvimgcodec_missing"]

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
    return out
