"""``DecodeOptions(decoder="nvimgcodec")`` and the hybrid split on a GPU.

Skipped without CUDA (see conftest.py) and, on CUDA, without nvImageCodec (``pip install
shardify[gpu]``); with ``SHARDIFY_GPU_TESTS_ON_CPU=1`` they run on the CPU with Pillow standing in
for nvImageCodec. Checks: the batches agree with the CPU path's (same keys and labels, pixels
within the decoders' difference), every sample once per epoch, every image counted under one
kind, exact resume mid-epoch, and the hybrid split (auto) keeps every sample once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shardify.reader import DecodeOptions, ShardedDataset, make_loader
from shardify.reader import transforms as T

MEAN_LEVELS = 3.0
"""Largest mean |difference| per batch in uint8 levels against the CPU path (as for nvJPEG, whose
decoding nvImageCodec's backends share; the products in float16 add at most 1 level)."""
P99_LEVELS = 30


def _decoder(device: str) -> dict:
    if device == "cpu":
        from shardify.reader.sample.image_decoders import PillowDecoder

        return {"jpeg_decoder": PillowDecoder()}
    pytest.importorskip(
        "nvidia.nvimgcodec", reason="decoder='nvimgcodec' needs nvImageCodec: pip install shardify[gpu]"
    )
    return {}


def _make(root: Path, device: str | None, share: float | str | None = None) -> ShardedDataset:
    return ShardedDataset(
        root,
        batch_size=16,
        shuffle=True,
        seed=1,
        transform=T.imagenet_train(64),
        fields=("image", "cls", "__key__"),
        decoding=DecodeOptions(
            device=device,
            decoder="nvimgcodec" if device else "torchvision",
            worker_share=share,  # type: ignore[arg-type]
        ),
    )


@pytest.mark.parametrize("share", [None, "auto"])
def test_nvimgcodec_agrees_with_the_cpu_path_and_counts_every_image(
    jpeg_dataset: Path, device: str, share: str | None
) -> None:
    cpu_ds, dev_ds = _make(jpeg_dataset, None), _make(jpeg_dataset, device, share)
    with (
        make_loader(cpu_ds, num_workers=2, device=device, normalize=False) as cpu,
        make_loader(dev_ds, num_workers=2, device=device, normalize=False, **_decoder(device)) as dev,
    ):
        for epoch in range(2):
            cpu_ds.set_epoch(epoch)
            dev_ds.set_epoch(epoch)
            seen = []
            for (xc, yc, kc), (xd, yd, kd) in zip(cpu, dev, strict=True):
                assert kd == kc and torch.equal(yd.cpu(), yc.cpu())
                assert xd.device.type == device and xd.shape == xc.shape
                diff = ((xd - xc).abs() * 255).flatten().float()
                assert float(diff.mean()) <= MEAN_LEVELS
                assert float(diff.kthvalue(int(0.99 * diff.numel())).values) <= P99_LEVELS
                seen += kd
            assert sorted(seen) == sorted(set(seen)) and len(seen) == dev_ds.num_samples
            counts = dev_ds.decode_strategy.tally.read()  # type: ignore[union-attr]
            assert sum(counts.values()) == dev_ds.num_samples, counts
            if device == "cuda" and share is None:
                assert counts.get("hardware", 0) + counts.get("cuda", 0) > 0, counts


def test_nvimgcodec_resumes_exactly(jpeg_dataset: Path, device: str) -> None:
    ds = _make(jpeg_dataset, device)
    with make_loader(ds, num_workers=2, **_decoder(device)) as loader:
        ds.set_epoch(2)
        full = [(x.cpu(), k) for x, _, k in loader]
        ds.set_epoch(2)
        it = iter(loader)
        next(it), next(it)
        state = loader.state_dict()
        del it
    again = _make(jpeg_dataset, device)
    with make_loader(again, num_workers=2, **_decoder(device)) as loader:
        loader.load_state_dict(state)
        rest = [(x.cpu(), k) for x, _, k in loader]
    assert [k for _, k in rest] == [k for _, k in full[2:]]
    for (x, _), (xf, _) in zip(rest, full[2:]):
        assert torch.equal(x, xf)
