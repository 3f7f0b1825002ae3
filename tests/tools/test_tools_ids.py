"""The ID-labelled recipe's runnable example (examples/demo_ids.py) and benchmark (tools/bench_ids.py) run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIME_LIMIT_S = 180


def test_demo_trains_two_epochs_and_names_every_validation_id(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo_ids.py"), "--dir", str(tmp_path), "--samples", "100"],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "exit code 0" in out and "epoch 0: 80 samples" in out and "epoch 1: 80 samples" in out
    assert "validation: 20 IDs" in out
    labels = json.loads((tmp_path / "labels.json").read_text())
    first = out.split("first: ", 1)[1].split(", ")[0]  # "patient00087 (label 3"
    ident, label = first.split(" (label ")
    assert labels[ident] == int(label) and ident in json.loads((tmp_path / "partition.json").read_text())["validation"]
    index = json.loads((tmp_path / "shards" / "train.json").read_text())
    assert index["shardify"]["fields"] == ["cls", "json", "npy"]


def test_bench_runs_both_recipes_and_checks_the_same_tensors() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench_ids.py"), "--samples", "200", "--epochs", "1"],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "same tensors and labels for all 200 IDs" in proc.stdout
    assert "map-style torch.load" in proc.stdout and "shardify npy" in proc.stdout and "ratio:" in proc.stdout
