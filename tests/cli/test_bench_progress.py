"""shardify bench shows its stages and epochs on a terminal's stderr, and nothing elsewhere."""

from __future__ import annotations

import io
import sys

import numpy as np

from shardify.cli.bench import run_bench
from shardify.convert import ShardWriter


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bench_progress_counts_every_stage(tmp_path, monkeypatch):
    root = tmp_path / "ds"
    with ShardWriter(root, split="train", samples_per_shard=8) as w:
        for i in range(16):
            w.write({"npy": np.full((2, 3), i, dtype=np.float32), "cls": i % 2})
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    r = run_bench(root, batch_size=4, num_workers=0, epochs=2, compare_webdataset=False, progress=True)
    assert r["loader_ips"] > 0
    text = term.getvalue()
    assert "bench" in text and "4/4" in text  # read, 2 loader epochs, shuffle figures
    assert "(f) shuffle" in text  # the last stage names itself (earlier postfixes may be skipped by tqdm's interval)
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", piped)
    run_bench(root, batch_size=4, num_workers=0, epochs=1, compare_webdataset=False, progress=True)
    assert piped.getvalue() == ""
