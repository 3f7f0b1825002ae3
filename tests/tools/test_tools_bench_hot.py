"""tools/bench_hot.py runs each hot path on a small scale and counts what it read or wrote."""

from __future__ import annotations

from pathlib import Path

import bench_hot
import pytest


@pytest.mark.parametrize(
    "what, args, samples", [("write", [], 100), ("arrays", [], 3 * 256), ("arrays", ["--no-check"], 3 * 256)]
)
def test_each_hot_path_runs_and_counts(tmp_path: Path, capsys, what: str, args: list[str], samples: int) -> None:
    assert bench_hot.main([what, str(tmp_path), "--scale", "0.001", *args]) == 0
    cpu, n = capsys.readouterr().out.split()
    assert float(cpu) > 0 and int(n) == samples
