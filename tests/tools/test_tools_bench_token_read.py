"""tools/bench_token_read.py runs at a tiny scale and reports a rate for each layout."""

from __future__ import annotations

import bench_token_read  # tools/ is on pytest's pythonpath


def test_reports_tokens_per_second_for_each_layout() -> None:
    out = bench_token_read.main(
        ["--docs", "200", "--mean", "50", "--seq-len", "64", "--batches", "5", "--rounds", "1",
         "--layouts", "chunked", "per-sample", "--no-litdata", "--json"]
    )  # fmt: skip
    assert out["tokens"] > 200
    assert out["shardify_chunked_tokens_per_s"] > 0 and out["shardify_per-sample_tokens_per_s"] > 0
