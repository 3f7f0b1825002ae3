"""tools/sim_tokens.py: a worker's packed-token plan from per-shard totals only, at a small scale."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "sim_tokens.py"


def test_plans_a_worker_from_shard_totals_and_maps_its_share() -> None:
    args = ["--tokens", "1e9", "--docs", "1e6", "--shard-tokens", "1e7", "--world", "16", "--workers", "2"]
    out = subprocess.run(
        [sys.executable, str(TOOL), *args, "--map", "1e4"], capture_output=True, text=True, check=True, timeout=300
    ).stdout
    got = json.loads(out)
    assert got["shards"] == 100 and got["sequences"] == -(-(10**9) // 2048)
    assert got["plan_memory_bytes"] == 101 * 8 + 100 * 8  # totals and starts: nothing per document
    assert got["mapped_positions"] == 10**4 and got["plan_s"] > 0
