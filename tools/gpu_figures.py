"""Every GPU figure of docs/performance.md, in one command, with a report to paste.

    python tools/gpu_figures.py --out $OUT                   # on the GPU host: all groups, ~10-13 min
    python tools/gpu_figures.py --out $OUT --groups decoders  # the four ways to decode side by side, ~5 min
    python tools/gpu_figures.py --out $OUT --groups feed step  # some of them
    python tools/gpu_figures.py --device cpu --quick --out /tmp/figs   # a check of the tool, on a CPU
    python tools/gpu_figures.py --redraw figs/gpu_figures.jsonl --chart docs/img/gpu_figures.png  # the chart

Groups, run in this order, each figure a process of its own with a time limit (a hang costs
its limit, not the whole run):

- ``tests``: ``python -m pytest tests/gpu`` (nvJPEG path against the CPU path, exactly once,
  resume, the decode thread on real streams);
- ``profile``: ``tools/profile_loader.py --workers 1 4 8 15 --device cuda`` (the per-stage table);
- ``device``: ``tools/bench_gpu_step.py --device-side`` (nvJPEG decode, crop/resize/flip and the whole
  device-side call, per batch: the most one decode thread gives);
- ``feed``: img/s into the device, CPU path with 8 and 15 workers, device decode with 2, 4, 8;
- ``step``: step time with the loader against pre-staged batches, batch 256 x 224 px, the tiny
  convnet and torchvision's ResNet-50 (channels_last, bf16 autocast), each with the CPU path
  (15 workers) and device decode (8 workers);
- ``decoders``: the CPU path, nvJPEG, nvImageCodec and the hybrid split side by side, img/s on
  two corpora and ResNet-50 ms/step (``tools/gpu_decoders.py``; ~4-5 min; ``bash
  tools/gpu_run.sh --groups decoders``; nvImageCodec's figures skipped where it is missing).

The dataset (1,000 photo-like JPEGs of ImageNet's sizes, ~110 KB, each stored ``--copies``
times, 12 by default, so that an epoch holds ~46 batches of 256 and every worker makes several:
with 1,000 images an epoch is 3 batches, and 8 or 15 workers measure the epoch's start, not the
steady rate) is made once under ``--data`` (default ``--out``). Written there: ``gpu_figures.md`` (machine, then
one row per figure: its command,
result, target, met or not) and ``gpu_figures.jsonl`` (one JSON object per figure, as it ends).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
GROUPS = ("tests", "profile", "device", "feed", "step", "decoders")
TARGET_IMG_S = 10_000
TARGET_RATIO = {"convnet": 1.3, "resnet50": 1.05}
_MISSING = {"No module named 'torchvision'": "torchvision", "nvidia.nvimgcodec cannot be imported": "nvImageCodec"}
"""What a failed figure's output says when an optional package is missing: it is then skipped."""
_LABEL = {"workers": "CPU", "device": "device"}


@dataclass
class Figure:
    group: str
    name: str
    argv: list[str]
    target: str = ""
    limit_s: int = 240
    result: dict[str, Any] = field(default_factory=dict)
    needs_nvimgcodec: bool = False


def figures(dataset: Path, *, device: str, quick: bool, corpora: dict[str, Path] | None = None) -> list[Figure]:
    """The figures to run, on ``dataset``: the full list, or a tiny version of it (``quick``);
    with ``corpora`` (name -> dataset, ``imagenet`` first) the ``decoders`` group's too."""
    py, step, profile = sys.executable, str(TOOLS / "bench_gpu_step.py"), str(TOOLS / "profile_loader.py")
    common = ["--dataset", str(dataset), "--device", device, "--json"]
    size = ["--batch-size", "8", "--size", "64", "--steps", "3"] if quick else ["--batch-size", "256", "--size", "224"]
    cpu_workers, dev_workers = ([1, 2], [1, 2]) if quick else ([8, 15], [2, 4, 8])
    cpu_step, dev_step = (2, 2) if quick else (15, 8)
    out = [
        Figure(
            "tests",
            "tests/gpu",
            [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "tests" / "gpu")],
            "passes",
            limit_s=400,
        )
    ]
    prof = [
        py,
        profile,
        "--dataset",
        str(dataset),
        "--json",
        "--workers",
        *(["1", "2"] if quick else ["1", "4", "8", "15"]),
    ]
    if quick:
        prof += ["--batch-size", "8", "--size", "64", "--batches", "2", "--repeat", "1"]
    else:
        prof += ["--device", "cuda"]
    out.append(Figure("profile", "per-stage profile", prof, limit_s=400))
    out.append(
        Figure(
            "device",
            "device side of device decode, per batch",
            [
                py,
                step,
                "--device-side",
                "--dataset",
                str(dataset),
                "--device",
                device,
                *(["--batch-size", "8", "--size", "64", "--reps", "2"] if quick else []),
            ],
        )
    )
    for w in cpu_workers:
        out.append(
            Figure(
                "feed",
                f"feed, CPU path, {w} workers",
                [py, step, "--feed", *common, *size, "--workers", str(w)],
                f">= {TARGET_IMG_S:,} img/s",
            )
        )
    for w in dev_workers:
        out.append(
            Figure(
                "feed",
                f"feed, device decode, {w} workers",
                [py, step, "--feed", "--decode", "device", *common, *size, "--workers", str(w)],
                f">= {TARGET_IMG_S:,} img/s",
            )
        )
    for model, extra in (("convnet", []), ("resnet50", ["--model", "resnet50", "--bf16", "--channels-last"])):
        if quick and model == "resnet50":
            extra = ["--model", "resnet50"]
        for decode, w in (("workers", cpu_step), ("device", dev_step)):
            out.append(
                Figure(
                    "step",
                    f"{model} step, {decode} decode, {w} workers",
                    [py, step, *common, *size, *extra, "--decode", decode, "--workers", str(w)],
                    f"<= {TARGET_RATIO[model]}x pre-staged",
                )
            )
    if corpora:
        from gpu_decoders import decoder_figures  # tools/ is on sys.path

        for name, argv, target, needs in decoder_figures(corpora, device=device, quick=quick, bench=Path(step)):
            out.append(Figure("decoders", name, argv, target, limit_s=150, needs_nvimgcodec=needs))
    return out


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def run(figure: Figure) -> Figure:
    """Run ``figure`` in a process of its own; its result (or what went wrong) in ``figure.result``."""
    from gpu_decoders import nvimgcodec_missing  # tools/ is on sys.path

    if figure.needs_nvimgcodec and nvimgcodec_missing():
        figure.result = {"status": "skipped: nvImageCodec is not installed (nvidia-nvimgcodec-cu12[nvjpeg])"}
        return figure
    t0 = time.perf_counter()
    try:
        done = subprocess.run(figure.argv, capture_output=True, text=True, timeout=figure.limit_s, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        figure.result = {"status": f"timed out after {figure.limit_s} s", "tail": str(e.stdout or "")[-2000:]}
        return figure
    wall = time.perf_counter() - t0
    parsed = _last_json(done.stdout)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        missing = next((name for text, name in _MISSING.items() if text in tail), None)
        figure.result = {
            "status": f"skipped: {missing} is not installed" if missing else f"failed (exit {done.returncode})",
            "tail": tail,
            "wall_s": wall,
        }
    elif figure.group == "tests":
        figure.result = {"status": "ok", "summary": done.stdout.strip().splitlines()[-1], "wall_s": wall}
    elif parsed is None:
        figure.result = {"status": "no JSON in the output", "tail": done.stdout[-2000:], "wall_s": wall}
    else:
        figure.result = {"status": "ok", **parsed, "wall_s": wall}
        if figure.group == "profile":
            from profile_loader import format_profile  # tools/ is on sys.path

            figure.result["table"] = format_profile(parsed)
    return figure


def verdict(figure: Figure) -> tuple[str, str]:
    """(result, met) as the report's table shows them."""
    r = figure.result
    if r.get("status") != "ok":
        return r.get("status", "not run"), "-"
    if figure.group == "tests":
        return r["summary"], "yes" if "failed" not in r["summary"] and "error" not in r["summary"] else "NO"
    by = f" ({', '.join(f'{k} {v:,}' for k, v in r['decoded_by'].items())})" if r.get("decoded_by") else ""
    by += f", worker share {r['worker_share']}" if "worker_share" in r else ""
    if figure.group == "feed" or "img_s" in r:
        return f"{r['img_s']:,.0f} img/s{by}", "yes" if r["img_s"] >= TARGET_IMG_S else "NO"
    if figure.group == "step" or "ratio" in r:
        ratio = r["ratio"]
        wait = f", waits {r['wait_ms']:.1f} ms/step for batches" if "wait_ms" in r else ""
        return (
            f"{r['loader_ms']:.1f} ms vs {r['prestaged_ms']:.1f} ms pre-staged = {ratio:.2f}x{wait}{by}",
            "yes" if ratio <= TARGET_RATIO[r.get("model", "convnet")] else "NO",
        )
    if figure.group == "device":
        return (
            f"decode {r['decode']['best_ms']:.1f} ms, crop/resize/flip {r['augment']['best_ms']:.1f} ms, "
            f"whole {r['whole']['best_ms']:.1f} ms per batch = {r['img_s_one_thread']:,.0f} img/s "
            f"for one decode thread",
            "-",
        )
    if "stage" in r:  # gpu_decoders.py --device-side
        parts = [
            f"{k[:-6]} {r[k]['best_ms']:.1f}/{r[k[:-6] + '_regions']['best_ms']:.1f}" for k in r if k.endswith("_whole")
        ]
        return (
            f"per batch: decode whole/regions ms {', '.join(parts)}; whole stage {r['stage']['best_ms']:.1f} ms "
            f"= {r['img_s_one_thread']:,.0f} img/s for one decode thread{by}",
            "-",
        )
    return "see the table below", "-"


def machine() -> list[str]:
    """What the report says of the host: CPU topology, GPU, versions."""
    lines = [f"- python {platform.python_version()}, {os.cpu_count()} logical CPUs"]
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=20).stdout
        keep = ("Model name", "Socket(s)", "Core(s) per socket", "Thread(s) per core", "CPU(s):")
        lines += [f"- lscpu: {line.strip()}" for line in lscpu.splitlines() if line.strip().startswith(keep)]
    except (OSError, subprocess.SubprocessError):
        lines.append("- lscpu: not available")
    try:
        import torch

        lines.append(f"- torch {torch.__version__} (CUDA {torch.version.cuda})")
        if torch.cuda.is_available():
            lines.append(f"- GPU: {torch.cuda.get_device_name()}")
        import torchvision  # noqa: F401 - only its version

        lines.append(f"- torchvision {torchvision.__version__}")
    except ImportError as e:
        lines.append(f"- {e}")
    return lines


def report(figs: list[Figure], header: list[str]) -> str:
    rows = ["| figure | command | result | target | met |", "|---|---|---|---|---|"]
    for f in figs:
        result, met = verdict(f)
        command = " ".join(Path(a).name if a.startswith(str(ROOT)) or a == sys.executable else a for a in f.argv[1:])
        rows.append(f"| {f.name} | `python {command}` | {result} | {f.target} | {met} |")
    tables = [f.result["table"] for f in figs if f.result.get("table")]
    return "\n".join(["# GPU figures (tools/gpu_figures.py)", "", *header, "", *rows, "", *tables, ""])


def chart(records: list[dict[str, Any]], path: Path, *, title: str = "") -> Path:
    """A PNG of the feed and step figures among ``records`` (gpu_figures.jsonl's lines): images per
    second into the GPU by path and workers against the 10,000 target, and each step's ratio to
    pre-staged batches against its target. Needs matplotlib (``pip install matplotlib``)."""
    import matplotlib  # deferred: only this drawing needs it

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    feed = [r for r in records if r.get("status") == "ok" and "img_s" in r]
    step = [r for r in records if r.get("status") == "ok" and "ratio" in r]
    if not feed and not step:
        raise ValueError(f"no feed or step figure with a result among {len(records)} records")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    names = [f"{_LABEL.get(r['decode'], r['decode'])}\n{r['workers']} workers" for r in feed]
    left.bar(
        names, [r["img_s"] for r in feed], color=["tab:orange" if r["decode"] == "device" else "tab:blue" for r in feed]
    )
    left.axhline(TARGET_IMG_S, color="black", linestyle="--", linewidth=1, label=f"target {TARGET_IMG_S:,}")
    left.set_ylabel("images/s into the GPU")
    left.set_title("feed: RandomResizedCrop 224, batch 256")
    left.legend(loc="upper left")
    names = [f"{r.get('model', 'convnet')}\n{_LABEL.get(r['decode'], r['decode'])}, {r['workers']} w" for r in step]
    right.bar(
        names, [r["ratio"] for r in step], color=["tab:orange" if r["decode"] == "device" else "tab:blue" for r in step]
    )
    for model, ratio in TARGET_RATIO.items():
        right.axhline(
            ratio,
            color="black",
            linestyle=":" if model == "convnet" else "--",
            linewidth=1,
            label=f"{model} target {ratio}x",
        )
    right.axhline(1.0, color="grey", linewidth=0.8)
    right.set_ylabel("step time / pre-staged step time")
    right.set_title("training step with the loader")
    right.legend(loc="upper right")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench-out")))
    p.add_argument("--groups", nargs="+", choices=GROUPS, default=list(GROUPS))
    p.add_argument("--device", default="cuda")
    p.add_argument("--images", type=int, default=1000)
    p.add_argument(
        "--copies",
        type=int,
        default=12,
        help="each image stored this many times: an epoch of many batches per worker (default: 12)",
    )
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help="where the JPEG dataset is made (default: OUT/data); outside $OUT it outlives a device call",
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes: a check of the tool (with --device cpu)")
    p.add_argument("--photos-dir", type=Path, default=None, help="decoders: also a folder of real photos (class dirs)")
    p.add_argument("--chart", type=Path, default=None, help="also draw the feed and step figures to this PNG")
    p.add_argument(
        "--redraw",
        type=Path,
        nargs="+",
        default=None,
        metavar="JSONL",
        help="run nothing: draw --chart from these gpu_figures.jsonl files",
    )
    p.add_argument("--title", default="", help="the chart's title (e.g. the GPU and the date)")
    args = p.parse_args(argv)
    if args.redraw:
        if args.chart is None:
            p.error("--redraw draws a chart: give --chart PATH")
        records = [r for path in args.redraw for r in _read_jsonl(path)]
        print(f"chart: {chart(records, args.chart, title=args.title)}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(TOOLS))
    from benchlib import corpus  # after the sys.path line above, for a caller that imports this module

    data_root = args.data or args.out / "data"
    dataset = corpus.step_dataset(data_root, 48 if args.quick else args.images, copies=1 if args.quick else args.copies)
    corpora = None
    if "decoders" in args.groups:
        from gpu_decoders import CAMERA_IMAGES

        camera = corpus.camera_dataset(data_root, 24 if args.quick else CAMERA_IMAGES)
        real = {"photos": corpus.folder_dataset(args.photos_dir, data_root / "photos-dir")} if args.photos_dir else {}
        corpora = {"imagenet": dataset, "camera": camera, **real}
    listed = figures(dataset, device=args.device, quick=args.quick, corpora=corpora)
    todo = [f for f in listed if f.group in args.groups]
    header = machine()
    if args.quick:
        header.append("- **--quick**: tiny sizes, a check of the tool; the targets do not apply to these figures")
    log = args.out / "gpu_figures.jsonl"
    with log.open("a") as out:
        for f in todo:
            run(f)
            print(f"{f.name}: {verdict(f)[0]}", flush=True)
            out.write(json.dumps({"figure": f.name, "argv": f.argv, **f.result}) + "\n")
            out.flush()
    (args.out / "gpu_figures.md").write_text(report(todo, header))
    print(f"report: {args.out / 'gpu_figures.md'}")
    if args.chart is not None:
        print(f"chart: {chart(_read_jsonl(log), args.chart, title=args.title)}")
    return (
        0
        if all(f.result.get("status") == "ok" or f.result.get("status", "").startswith("skipped") for f in todo)
        else 1
    )


if __name__ == "__main__":
    sys.exit(main())
