"""tools/bench_sample_checks.py runs its three settings on a small scale (the SHA-256 setting
replaces the reader's CRC-32 function, so it must find it where the reader calls it)."""

from __future__ import annotations

from pathlib import Path

import bench_sample_checks


def test_each_setting_runs_on_each_corpus(tmp_path: Path, capsys) -> None:
    bench_sample_checks.main(["--images", "12", "--tiny", "300", "--rounds", "1", "--dir", str(tmp_path)])
    out = capsys.readouterr().out
    for corpus in ("JPEGs", "tiny samples", "3x32x32 arrays"):
        assert corpus in out
    assert out.count("SHA-256") >= 3
