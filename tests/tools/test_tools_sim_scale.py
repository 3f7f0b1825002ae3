"""tools/sim_scale.py: the sizing figures of docs/scale.md, and their chart, from the real plan functions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "sim_scale.py"


def test_the_chart_plans_each_size_and_draws_both_layouts(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "plan.png"
    out = subprocess.run(
        [sys.executable, str(TOOL), "--chart", str(png), "--sizes", "1e4", "1e5", "--world", "16", "--workers", "2"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["samples"] for r in rows] == [10_000, 100_000]
    assert all(r["keyed"]["one_worker_s"] > 0 and "whole" in r for r in rows)  # both layouts under --max-blocks
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
