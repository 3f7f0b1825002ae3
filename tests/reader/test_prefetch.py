"""The device prefetcher on the CPU (same code path as CUDA, minus streams) and make_loader."""

from __future__ import annotations

import pytest
import torch

from shardify.reader import IMAGENET_MEAN, IMAGENET_STD, DevicePrefetcher, ShardedDataset, make_loader
from shardify.reader import transforms as T


def batches(n: int = 3):
    g = torch.Generator().manual_seed(0)
    return [(torch.randint(0, 256, (2, 3, 5, 4), dtype=torch.uint8, generator=g), torch.arange(2) + i)
            for i in range(n)]


def expected(x: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return (x.float() / 255 - mean) / std


def test_normalises_images_and_moves_everything_else_as_is():
    src = batches()
    out = list(DevicePrefetcher(src, device="cpu"))
    assert len(out) == 3
    for (x, y), (xo, yo) in zip(src, out):
        assert xo.dtype == torch.float32 and torch.allclose(xo, expected(x), atol=1e-5)
        assert torch.equal(yo, y) and yo.dtype == torch.int64


def test_bf16_channels_last_and_plain_scaling():
    x, _ = batches(1)[0]
    (xo, _), = DevicePrefetcher([(x, 0)], device="cpu", dtype=torch.bfloat16, channels_last=True)
    assert xo.dtype == torch.bfloat16 and xo.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(xo.float(), expected(x), atol=0.03)
    (xs,), = DevicePrefetcher([(x,)], device="cpu", normalize=False)
    assert torch.allclose(xs, x.float() / 255)
    with pytest.raises(ValueError, match="floating point"):
        DevicePrefetcher([], device="cpu", dtype=torch.int32)


def test_nested_structures_and_non_image_tensors():
    x, y = batches(1)[0]
    (out,) = DevicePrefetcher([{"img": x, "tokens": torch.zeros(2, 7, dtype=torch.uint8), "meta": ["a"]}],
                              device="cpu")
    assert out["img"].dtype == torch.float32 and out["tokens"].dtype == torch.uint8 and out["meta"] == ["a"]


def test_make_loader_end_to_end_with_two_workers(image_dataset):
    ds = ShardedDataset(image_dataset, batch_size=4, shuffle=True, drop_last=True,
                        transform=T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip()]))
    loader = make_loader(ds, num_workers=2, device="cpu", channels_last=True)
    assert loader.dataloader.persistent_workers and not loader.dataloader.pin_memory
    for epoch in range(2):
        ds.set_epoch(epoch)
        got = list(loader)
        assert len(got) == len(ds) == 5
        for images, labels in got:
            assert images.shape == (4, 3, 16, 16) and images.dtype == torch.float32
            assert images.is_contiguous(memory_format=torch.channels_last)
            assert images.min() >= expected(torch.zeros(1, 3, 1, 1, dtype=torch.uint8)).min() - 1e-5
            assert labels.dtype == torch.int64 and set(labels.tolist()) <= {0, 1, 2}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_cuda_without_cuda_is_a_clear_error(image_dataset):
    with pytest.raises(ValueError, match="CUDA is not available"):
        make_loader(ShardedDataset(image_dataset, batch_size=2), device="cuda")
