"""Multi-rank training under torchrun: 2 ranks x 2 workers, fewer shards than that, DDP on gloo.

Runs tools/train_imagenet.py (the example users copy) for real: both ranks take the same
number of steps, together they see exactly the dataset, nothing hangs, and a run stopped
after a checkpoint resumes with exactly the batches the uninterrupted run had left.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shardify.convert.options import ConvertOptions
from shardify.convert.run import convert_imagefolder
from shardify.convert.synth import make_imagefolder

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 240


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("torchrun")
    make_imagefolder(base / "src", classes=3, per_class=8, sizes=((80, 64), (64, 80)))
    convert_imagefolder(base / "src", base / "ds", options=ConvertOptions(samples_per_shard=10, workers=1, progress=False))
    return base / "ds"


def _train(dataset: Path, tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "tools" / "train_imagenet.py"), "--data", str(dataset), "--batch-size", "4",
           "--workers", "2", "--size", "32", "--log-keys", str(tmp / "keys"), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _log(tmp: Path, rank: int) -> list[dict]:
    path = tmp / f"keys.rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_two_ranks_same_steps_union_is_the_dataset(dataset: Path, tmp_path: Path) -> None:
    index = json.loads((dataset / "train.json").read_text())
    assert [s["nsamples"] for s in index["shardlist"]] == [10, 10, 4]  # 3 shards < 2 ranks x 2 workers
    proc = _train(dataset, tmp_path, "--epochs", "1")
    assert "rank 0: epoch 0: 3 steps" in proc.stdout and "rank 1: epoch 0: 3 steps" in proc.stdout
    keys = [k for rank in (0, 1) for entry in _log(tmp_path, rank) for k in entry["keys"]]
    assert len(keys) == 24 and len(set(keys)) == 24
    with_tar = subprocess.run(["tar", "tf", str(dataset / index["shardlist"][0]["url"])], capture_output=True, text=True)
    assert with_tar.returncode == 0


def test_checkpoint_and_resume_continue_batch_for_batch(dataset: Path, tmp_path: Path) -> None:
    full, parts = tmp_path / "full", tmp_path / "parts"
    full.mkdir()
    parts.mkdir()
    _train(dataset, full, "--epochs", "2")
    ckpt = str(parts / "ckpt.pt")
    stopped = _train(dataset, parts, "--epochs", "2", "--checkpoint", ckpt, "--checkpoint-every", "2",
                     "--max-steps", "4")
    assert "stopping at step 4" in stopped.stdout
    resumed = _train(dataset, parts, "--epochs", "2", "--checkpoint", ckpt, "--checkpoint-every", "100")
    assert "resumed at epoch 1, batch 1, step 4" in resumed.stdout
    for rank in (0, 1):
        assert [e["keys"] for e in _log(parts, rank)] == [e["keys"] for e in _log(full, rank)]
