"""``loader.stats()`` on the CUDA path: pinning, the copy and the device decode are measured, and
waiting on the device is told apart from waiting on the workers. Skipped without CUDA (conftest.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from builders import augmented

from shardify.reader import DecodeOptions, ShardedDataset, make_loader
from shardify.reader import transforms as T


@pytest.mark.parametrize("workers", [0, 2])
def test_copy_and_pin_measured_waits_split(jpeg_dataset: Path, device: str, workers: int) -> None:
    with make_loader(augmented(jpeg_dataset), num_workers=workers, device=device) as loader:
        for x, _ in loader:
            assert x.device.type == device
        s = loader.stats()
    assert s.finished and s.batches == 12 and s.samples == 96
    assert s.stages["copy"] > 0
    if device == "cuda" and workers:
        assert s.stages["pin"] > 0  # DataLoader's pin thread, through the batch transport
    assert s.wait_s == pytest.approx(s.wait_workers_s + s.wait_device_s)
    assert s.bottleneck == "input"
    print(f"\n{s}")


def test_a_loop_busy_on_the_device_is_compute_bound(jpeg_dataset: Path, device: str) -> None:
    ds = augmented(jpeg_dataset)
    w = torch.randn(2048, 2048, device=device)
    with make_loader(ds, num_workers=2, device=device) as loader:
        for _ in loader:  # persistent workers started
            pass
        ds.set_epoch(1)
        for x, _ in loader:
            t = time.perf_counter()
            # ~0.3 s of device work per step, waited for: far more than two workers take to make
            # a batch of 8 small JPEGs even on a loaded machine, so the verdict does not hang on speed
            while time.perf_counter() - t < 0.3:
                y = w @ w
                float(y[0, 0] + x.float().mean())
        s = loader.stats()
    assert s.bottleneck == "compute" and s.wait_fraction <= 0.1
    print(f"\n{s}")


def test_device_decode_is_measured_on_the_device_side(jpeg_dataset: Path, device: str) -> None:
    if device != "cuda":
        pytest.skip("nvJPEG needs CUDA")
    pytest.importorskip("torchvision")
    ds = ShardedDataset(
        jpeg_dataset,
        batch_size=8,
        shuffle=True,
        seed=3,
        transform=T.imagenet_train(64),
        decoding=DecodeOptions(device="cuda"),
    )
    with make_loader(ds, num_workers=2) as loader:
        for _ in loader:
            pass
        s = loader.stats()
    # The workers only parse each JPEG's header (timed as their decode): a small share of the work.
    assert s.stages["device_decode"] > 0 and s.stages["decode"] < 0.1 * s.stages["device_decode"]
    assert s.wait_s == pytest.approx(s.wait_workers_s + s.wait_device_s)
    print(f"\n{s}")
