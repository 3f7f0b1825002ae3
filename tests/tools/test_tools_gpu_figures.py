"""tools/gpu_figures.py: the figure list, a real (tiny, CPU) figure run, and the report's verdicts."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).parents[2] / "tools"


@pytest.fixture()
def tool(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(TOOLS))
    spec = importlib.util.spec_from_file_location("gpu_figures", TOOLS / "gpu_figures.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "gpu_figures", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_the_full_list_is_every_gpu_figure(tool, tmp_path: Path) -> None:
    figs = tool.figures(tmp_path, device="cuda", quick=False)
    names = [f.name for f in figs]
    assert names == [
        "tests/gpu",
        "per-stage profile",
        "device side of device decode, per batch",
        "feed, CPU path, 8 workers",
        "feed, CPU path, 15 workers",
        "feed, device decode, 2 workers",
        "feed, device decode, 4 workers",
        "feed, device decode, 8 workers",
        "convnet step, workers decode, 15 workers",
        "convnet step, device decode, 8 workers",
        "resnet50 step, workers decode, 15 workers",
        "resnet50 step, device decode, 8 workers",
    ]
    profile = figs[1].argv
    assert profile[profile.index("--workers") + 1 : profile.index("--workers") + 5] == ["1", "4", "8", "15"]
    assert "--device" in profile and "cuda" in profile
    resnet = figs[-1].argv
    assert {"--bf16", "--channels-last", "resnet50"} <= set(resnet)
    assert all(f.argv[f.argv.index("--batch-size") + 1] == "256" for f in figs[3:])
    assert "--device-side" in figs[2].argv and "--batch-size" not in figs[2].argv  # its default: 256


def test_the_device_side_figure_runs_and_reads_as_one_decode_threads_ceiling(tool, tmp_path: Path) -> None:
    from benchlib.corpus import step_dataset  # type: ignore[import-not-found]

    from shardify.reader import ShardedDataset

    dataset = step_dataset(tmp_path, 16, copies=2)
    once = step_dataset(tmp_path, 16)
    assert ShardedDataset(dataset, batch_size=4).num_samples == 2 * ShardedDataset(once, batch_size=4).num_samples
    device = next(f for f in tool.figures(dataset, device="cpu", quick=True) if f.group == "device")
    tool.run(device)
    assert device.result["status"] == "ok", device.result
    assert device.result["jpegs"] == 8 and device.result["whole"]["best_ms"] > 0
    result, met = tool.verdict(device)
    assert "for one decode thread" in result and met == "-"


def test_a_tiny_figure_runs_for_real_and_the_report_judges_each_outcome(tool, tmp_path: Path) -> None:
    from benchlib.corpus import step_dataset  # type: ignore[import-not-found]

    dataset = step_dataset(tmp_path, 24)
    feed = next(
        f for f in tool.figures(dataset, device="cpu", quick=True) if f.name == "feed, device decode, 1 workers"
    )
    tool.run(feed)
    assert feed.result["status"] == "ok" and feed.result["img_s"] > 0 and feed.result["decode"] == "device"
    assert tool.verdict(feed)[1] == "NO"  # a CPU is far from 10,000 img/s

    hang = tool.Figure("feed", "hang", [sys.executable, "-c", "import time; time.sleep(30)"], limit_s=1)
    broken = tool.Figure("feed", "broken", [sys.executable, "-c", "raise SystemExit(3)"])
    fast = tool.Figure(
        "step",
        "fast",
        [],
        "<= 1.3x pre-staged",
        result={"status": "ok", "loader_ms": 26.0, "prestaged_ms": 24.0, "ratio": 26 / 24, "model": "convnet"},
    )
    slow = tool.Figure(
        "step",
        "slow",
        [],
        result={"status": "ok", "loader_ms": 90.0, "prestaged_ms": 80.0, "ratio": 1.125, "model": "resnet50"},
    )
    tool.run(hang)
    tool.run(broken)
    assert hang.result["status"] == "timed out after 1 s" and broken.result["status"] == "failed (exit 3)"
    assert tool.verdict(fast) == ("26.0 ms vs 24.0 ms pre-staged = 1.08x", "yes")
    assert tool.verdict(slow)[1] == "NO"  # 1.125 > 1.05 for ResNet-50
    text = tool.report([feed, hang, broken, fast, slow], ["- machine"])
    assert "| hang |" in text and "timed out after 1 s" in text and "| fast |" in text and "img/s" in text


def test_the_chart_is_drawn_from_the_tools_own_results(tool, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    records = [
        {"figure": "feed", "status": "ok", "img_s": 8664.0, "decode": "device", "workers": 2},
        {"figure": "feed", "status": "ok", "img_s": 4238.0, "decode": "workers", "workers": 15},
        {"figure": "step", "status": "ok", "ratio": 1.30, "decode": "workers", "workers": 15, "model": "resnet50"},
        {"figure": "broken", "status": "failed (exit 1)"},
    ]
    jsonl = tmp_path / "gpu_figures.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
    png = tmp_path / "chart" / "figs.png"
    assert tool.main(["--redraw", str(jsonl), "--chart", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    with pytest.raises(ValueError, match="no feed or step figure"):
        tool.chart(records[3:], tmp_path / "none.png")


def test_the_decoders_group_sets_the_four_ways_side_by_side_on_each_corpus(tool, tmp_path: Path) -> None:
    corpora = {"imagenet": tmp_path / "a", "camera": tmp_path / "b"}
    figs = [
        f for f in tool.figures(tmp_path / "a", device="cuda", quick=False, corpora=corpora) if f.group == "decoders"
    ]
    assert [f.name for f in figs] == [
        *(f"feed {c}, {d}, {w} workers" for c in corpora for d, w in tool_ways()),
        *(f"resnet50 step imagenet, {d}, {w} workers" for d, w in tool_ways()),
        *(f"nvimgcodec device side {c}, per batch" for c in corpora),
    ]
    assert [f.needs_nvimgcodec for f in figs[:4]] == [False, False, True, True]
    for f in figs[:12]:
        assert f.argv[f.argv.index("--batch-size") + 1] == "256" and f.argv[f.argv.index("--steps") + 1] == "30"
    assert all("--samples-per-epoch" in f.argv for f in figs[4:8]) and "--samples-per-epoch" not in figs[0].argv
    assert all({"--bf16", "--channels-last", "resnet50"} <= set(f.argv) for f in figs[8:12])
    assert all("--device-side" in f.argv and f.needs_nvimgcodec for f in figs[12:])


def tool_ways() -> list[tuple[str, int]]:
    sys.path.insert(0, str(TOOLS))
    from gpu_decoders import WAYS  # type: ignore[import-not-found]

    return list(WAYS)


def test_nvimgcodec_figures_are_skipped_where_it_is_missing(
    tool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gpu_decoders  # type: ignore[import-not-found]

    monkeypatch.setattr(gpu_decoders, "nvimgcodec_missing", lambda: True)
    figs = tool.figures(tmp_path, device="cuda", quick=True, corpora={"imagenet": tmp_path})
    hybrid = next(f for f in figs if f.group == "decoders" and f.needs_nvimgcodec)
    tool.run(hybrid)
    assert hybrid.result["status"].startswith("skipped: nvImageCodec is not installed")
    assert tool.verdict(hybrid) == (hybrid.result["status"], "-")
    failed = tool.Figure(
        "decoders", "x", [sys.executable, "-c", "raise SystemExit('nvidia.nvimgcodec cannot be imported')"]
    )
    tool.run(failed)
    assert failed.result["status"] == "skipped: nvImageCodec is not installed"


def test_the_nvimgcodec_device_side_figure_runs_on_the_cpu(tool, tmp_path: Path) -> None:
    from benchlib.corpus import step_dataset  # type: ignore[import-not-found]

    figs = tool.figures(tmp_path, device="cpu", quick=True, corpora={"imagenet": step_dataset(tmp_path, 16)})
    side = next(f for f in figs if f.name == "nvimgcodec device side imagenet, per batch")
    tool.run(side)
    assert side.result["status"] == "ok", side.result
    assert side.result["decoded_by"]["cpu"] > 0 and side.result["stage"]["best_ms"] > 0
    result, met = tool.verdict(side)
    assert result.startswith("per batch: decode whole/regions ms cpu ") and "for one decode thread" in result
