"""The device prefetcher on the CPU (same code path as CUDA, minus streams) and make_loader."""

from __future__ import annotations

import threading

import pytest
import torch

from shardify.errors import SampleError
from shardify.reader import IMAGENET_MEAN, IMAGENET_STD, BatchOptions, DevicePrefetcher, ShardedDataset, make_loader
from shardify.reader import transforms as T
from shardify.reader.delivery.prefetch import DECODE_AHEAD, resolve_device
from shardify.reader.sample.device_prep import EncodedBatch


def batches(n: int = 3):
    g = torch.Generator().manual_seed(0)
    return [
        (torch.randint(0, 256, (2, 3, 5, 4), dtype=torch.uint8, generator=g), torch.arange(2) + i) for i in range(n)
    ]


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
    ((xo, _),) = DevicePrefetcher([(x, 0)], device="cpu", dtype=torch.bfloat16, channels_last=True)
    assert xo.dtype == torch.bfloat16 and xo.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(xo.float(), expected(x), atol=0.03)
    ((xs,),) = DevicePrefetcher([(x,)], device="cpu", normalize=False)
    assert torch.allclose(xs, x.float() / 255)
    with pytest.raises(ValueError, match="floating point"):
        DevicePrefetcher([], device="cpu", dtype=torch.int32)


def test_nested_structures_and_non_image_tensors():
    x, y = batches(1)[0]
    (out,) = DevicePrefetcher([{"img": x, "tokens": torch.zeros(2, 7, dtype=torch.uint8), "meta": ["a"]}], device="cpu")
    assert out["img"].dtype == torch.float32 and out["tokens"].dtype == torch.uint8 and out["meta"] == ["a"]


def test_make_loader_end_to_end_with_two_workers(image_dataset):
    ds = ShardedDataset(
        image_dataset,
        batch_size=4,
        shuffle=True,
        batching=BatchOptions(drop_last=True),
        transform=T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip()]),
    )
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


# The decode thread (device decode): the same code on CPU tensors, with a stand-in decoder.


def _encoded(i: int, n: int = 2) -> EncodedBatch:
    """A stand-in EncodedBatch whose ``data`` carries the batch number."""
    return EncodedBatch(
        data=torch.full((n,), i, dtype=torch.uint8),
        offsets=torch.arange(n + 1),
        boxes=torch.zeros(n, 4, dtype=torch.float64),
        bounds=torch.zeros(n, 4, dtype=torch.float64),
        flips=torch.zeros(n, dtype=torch.bool),
        pixels=torch.empty(0, 3, 4, 4, dtype=torch.uint8),
        pixel_rows=torch.empty(0, dtype=torch.int64),
        size=(4, 4),
        shards=["s"] * n,
        keys=[f"k{i}-{j}" for j in range(n)],
    )


def _images(batch: EncodedBatch) -> torch.Tensor:
    return batch.data.view(-1, 1, 1, 1).expand(-1, 3, 4, 4).contiguous()


def test_decode_runs_in_its_own_thread_in_order_and_ahead_of_the_loop():
    """Each batch is decoded in the ``shardify-decode`` thread, in order, while the loop holds
    the batch before it: the decoder of batch 1 waits until the loop has batch 0 (had the decode
    run in the loop's thread before handing batch 0 over, it would wait in vain and fail)."""
    has_zero = threading.Event()
    threads: list[str] = []

    def decode(batch: EncodedBatch) -> tuple[torch.Tensor, None]:
        i = int(batch.data[0])
        threads.append(threading.current_thread().name)
        if i == 1 and not has_zero.wait(timeout=30):
            raise RuntimeError("batch 1 was decoded before the loop had batch 0")
        return _images(batch), None

    got = []
    for images, labels in DevicePrefetcher(
        [(_encoded(i), torch.tensor([i, i])) for i in range(6)], device="cpu", normalize=False, decode=decode
    ):
        got.append((int(images[0, 0, 0, 0] * 255 + 0.5), labels.tolist()))
        has_zero.set()
    assert got == [(i, [i, i]) for i in range(6)]
    assert len(threads) == 6 and all(t.startswith("shardify-decode") for t in threads)


def test_decode_keeps_at_most_decode_ahead_batches_beyond_the_one_in_use():
    decoded: list[int] = []

    def decode(batch: EncodedBatch) -> tuple[torch.Tensor, None]:
        decoded.append(int(batch.data[0]))
        return _images(batch), None

    source = iter([(_encoded(i),) for i in range(10)])
    taken: list[int] = []

    def counted():
        for b in source:
            taken.append(int(b[0].data[0]))
            yield b

    it = iter(DevicePrefetcher(counted(), device="cpu", decode=decode))
    for held in range(10):
        next(it)
        assert len(taken) <= min(10, held + 1 + DECODE_AHEAD)  # never asks the workers for more
    assert next(it, None) is None and decoded == list(range(10))


def test_a_decode_error_reaches_the_loop_at_its_batch_and_the_thread_ends():
    def decode(batch: EncodedBatch) -> tuple[torch.Tensor, None]:
        if int(batch.data[0]) == 3:
            raise SampleError("cannot decode", shard="s", key="k3-0")
        return _images(batch), None

    got = []
    with pytest.raises(SampleError, match="k3-0"):
        for (images,) in DevicePrefetcher([(_encoded(i),) for i in range(6)], device="cpu", decode=decode):
            got.append(images)
    assert len(got) == 3
    assert not [t for t in threading.enumerate() if t.name.startswith("shardify-decode")]


def test_leaving_the_loop_early_stops_the_decode_thread():
    started = threading.Event()

    def decode(batch: EncodedBatch) -> tuple[torch.Tensor, None]:
        started.set()
        return _images(batch), None

    it = iter(DevicePrefetcher([(_encoded(i),) for i in range(50)], device="cpu", decode=decode))
    next(it)
    assert started.is_set()
    it.close()  # what `break` does to the loop's generator
    assert not [t for t in threading.enumerate() if t.name.startswith("shardify-decode")]


def test_an_unindexed_cuda_device_is_named_in_the_calling_thread(monkeypatch: pytest.MonkeyPatch):
    """Under DDP rank 1 calls torch.cuda.set_device(1) and passes device="cuda": the decode
    thread, whose own current device is 0, must be told 1."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert resolve_device("cpu") == torch.device("cpu")
