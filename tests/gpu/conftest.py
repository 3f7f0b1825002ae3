"""The CUDA path's tests: skipped without CUDA.

``SHARDIFY_GPU_TESTS_ON_CPU=1`` runs them on the CPU instead (no streams, no pinning), which
checks the tests themselves on a machine without a GPU; the stream-specific assertions are
then skipped.
"""

from __future__ import annotations

import os
from pathlib import Path

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
    from shardify.convert.write.run import convert_imagefolder
    from shardify.convert.synth import make_imagefolder

    root = tmp_path_factory.mktemp("gpu")
    make_imagefolder(root / "src", classes=4, per_class=24, seed=0, sizes=((160, 120), (120, 160), (200, 150)))
    convert_imagefolder(root / "src", root / "ds", options=ConvertOptions(
        samples_per_shard=16, shard_size=None, workers=1, progress=False, fsync=False))
    return root / "ds"
