"""tools/bench_mapview.py runs at a tiny scale: every reader gives whole epochs of checked batches
(the tool exits when a batch has the wrong dtype or shape, or an epoch the wrong count)."""

from __future__ import annotations

from pathlib import Path

import bench_mapview  # tools/ is on pytest's pythonpath

TIME_LIMIT_S = 300


def test_photos_reports_every_reader_local_and_over_http(tmp_path: Path) -> None:
    out = bench_mapview.photos(tmp_path, n=8, workers=2, epochs=1, batch_size=4, delay_ms=1)
    rates = out["samples/s (best epoch)"]
    assert len(rates) == 5 and all(v > 0 for v in rates.values())
    assert sum("over HTTP" in name for name in rates) == 2 and any("FetchAhead" in name for name in rates)
    assert set(out["CPU ms a sample (this process and its workers, all epochs)"]) == set(rates)


def test_small_samples_every_reader_and_http_both_ways(tmp_path: Path) -> None:
    out = bench_mapview.read(tmp_path, samples=64, workers=2, batch_size=16, epochs=1, delay_ms=1)
    rates = out["samples/s"]
    assert sum("MapDataset" in name for name in rates) == 6  # local, chunked, ranged, FetchAhead, whole: first, later
    assert any("FetchAhead" in name for name in rates)
    assert all(v > 0 for v in rates.values())
    cpu = out["CPU us a sample over HTTP with FetchAhead (all its epochs)"]
    assert set(cpu) == {"main process", "workers", "server"} and all(v > 0 for v in cpu.values())


def test_key_index_build_both_ways(tmp_path: Path) -> None:
    out = bench_mapview.build_keys(tmp_path, 1000)
    assert out["keys"] == 1000 and len(out) == 3
    assert all(set(v) == {"seconds", "peak_rss_added_mb"} for k, v in out.items() if k != "keys")
