"""tools/bench_multirange.py runs end to end on a tiny batch (its figures are not checked)."""

from __future__ import annotations

import bench_multirange  # tools/bench_multirange.py (pytest's pythonpath holds tools/)


def test_the_benchmark_runs_and_prints_both_ways(capsys):
    assert bench_multirange.main(["--spans", "8", "--span-bytes", "100", "--file-mib", "1", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "one GET per span" in out and "multi-range GETs" in out
