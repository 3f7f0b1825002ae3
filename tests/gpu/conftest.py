"""The CUDA path's tests: skipped without CUDA.

``SHARDIFY_GPU_TESTS_ON_CPU=1`` runs them on the CPU instead (no streams, no pinning), which
checks the tests themselves on a machine without a GPU; the stream-specific assertions are
then skipped.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch


@pytest.fixture(scope="session")
def device() -> str:
    if torch.cuda.is_available():
        return "cuda"
    if os.environ.get("SHARDIFY_GPU_TESTS_ON_CPU") == "1":
        return "cpu"
    pytest.skip("needs CUDA (SHARDIFY_GPU_TESTS_ON_CPU=1 runs these on the CPU)")


@pytest.fixture(scope="session")
def jpeg_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A converted dataset of 96 natural-looking JPEGs (4 classes, 120 to 200 pixels wide), shards of 16."""
    from shardify.convert.options import ConvertOptions
    from shardify.convert.synth import make_imagefolder
    from shardify.convert.write.run import convert_imagefolder

    root = tmp_path_factory.mktemp("gpu")
    make_imagefolder(root / "src", classes=4, per_class=24, seed=0, sizes=((160, 120), (120, 160), (200, 150)))
    convert_imagefolder(
        root / "src",
        root / "ds",
        options=ConvertOptions(samples_per_shard=16, shard_size=None, workers=1, progress=False, fsync=False),
    )
    return root / "ds"


@pytest.fixture
def delayed_read_sums(device: str) -> Callable[..., list[tuple[float, int]]]:
    """``sums(loader, ds, epochs=, max_allocated=)``: each batch's image and label sums, read by
    work queued behind a delay on the training stream after the loop dropped the batch (while
    the prefetch makes the next ones on its side stream); every 7 batches the GPU memory in
    use must stay under ``max_allocated`` bytes (batches freed, not piling up). A batch's
    first two items are its images and labels. Sums of memory the caching allocator handed
    to a later batch too early differ from a run read at once."""
    cuda = device == "cuda"

    def sums(loader: Any, ds: Any, *, epochs: int, max_allocated: int) -> list[tuple[float, int]]:
        queued = []
        for epoch in range(epochs):
            ds.set_epoch(epoch)
            for i, batch in enumerate(loader):
                x, y = batch[0], batch[1]
                if cuda:
                    torch.cuda._sleep(2_000_000)  # ~1 ms of GPU time queued before the read
                queued.append((x.double().sum(), y.sum()))  # queued, not yet run
                del x, y, batch
                if cuda and i % 7 == 6:
                    torch.cuda.synchronize()
                    assert torch.cuda.memory_allocated() < max_allocated
        if cuda:
            torch.cuda.synchronize()
        return [(s.item(), int(t)) for s, t in queued]

    return sums
