"""tools/bench_first_batch.py runs: its corpora, each system's first batch, and the table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_system_gives_a_first_batch_of_the_same_shards(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "bench_first_batch.py"),
            "--data",
            str(tmp_path),
            "--photos",
            "40",
            "--arrays",
            "200",
            "--repeat",
            "1",
            "--workers",
            "1",
            "--batch-size",
            "4",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line.split()[:2] for line in proc.stdout.splitlines() if line.startswith(("photos", "arrays"))]
    assert rows == [
        ["photos", "shardify"],
        ["photos", "webdataset"],
        ["photos", "folder"],
        ["arrays", "shardify"],
        ["arrays", "webdataset"],
    ]
    import json

    runs = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert all(
        r["batch"] == 4 and r["iter_first_s"] > 0 and r["setup_first_s"] >= r["iter_first_s"]
        for rs in runs.values()
        for r in rs
    )
    assert (tmp_path / "photos-40-c20-shards" / "train.json").exists()
    assert (tmp_path / "arrays-200" / "train.json").exists()


def test_next_epoch_times_shardifys_first_batch_of_epoch_1(tmp_path: Path) -> None:
    args = ["--data", str(tmp_path), "--photos", "40", "--corpus", "photos", "--repeat", "1", "--workers", "1"]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench_first_batch.py"), *args, "--batch-size", "4", "--next-epoch"]
        + ["--step-ms", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert [line.split()[:2] for line in proc.stdout.splitlines() if line.startswith("photos")] == [
        ["photos", "shardify"]
    ]
