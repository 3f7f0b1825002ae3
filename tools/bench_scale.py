"""Converter scale benchmark: peak memory and time per stage at ImageNet's count of inputs.

Run by hand (not a test):
    python tools/bench_scale.py [--rows 1300000 [10000000 ...]] [--data DIR] [--tree] [--write]

Makes (once, cached in --data) a JSONL listing of ``--rows`` rows, each an ID, an int label
and a short text (the shape of ImageNet with captions), and with ``--tree`` an image folder
of as many tiny JPEG files (1,000 classes): ``benchlib.corpus.listing`` and ``listing_tree``.
Each stage runs in a fresh child process, so the peak resident memory printed (``ru_maxrss``)
is that stage's own: ``scan`` (read the
listing), ``plan`` (keys, order, shards), for the driver and for the biggest of the worker
processes each stage forked, with the CPU time each stage used in all its processes (CPU
over wall time near 2 means both cores worked). Several ``--rows`` give each size in turn,
then the ratio of the driver's peaks to the first size's. ``--write`` then runs the whole
``shardify convert`` and prints the peak of its main process and of its biggest worker,
the time, and the bytes on disk per sample.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import memory


def _stage(kind: str, src: str, workers: int, out: mp.Queue[dict[str, float]]) -> None:
    """Scan then plan in this (fresh) process; report time, CPU time and peak memory after
    each, and of the worker processes scan and plan started (the biggest one so far)."""
    from shardify.convert.inputs.imagefolder import scan_imagefolder
    from shardify.convert.inputs.listing import scan_listing
    from shardify.convert.options import ConvertOptions
    from shardify.convert.write.plan import plan_split

    base = memory.peak_mib()
    t0, c0 = time.perf_counter(), memory.cpu_s()
    scan = scan_listing(src, workers=workers)["train"] if kind == "listing" else scan_imagefolder(src, workers=workers)
    t1, c1 = time.perf_counter(), memory.cpu_s()
    scan_peak, scan_kids = memory.peak_mib(), memory.peak_mib(children=True)
    plan = plan_split(scan, ConvertOptions(progress=False, workers=workers))
    t2, c2 = time.perf_counter(), memory.cpu_s()
    out.put(
        {
            "samples": float(len(scan.samples)),
            "shards": float(plan.num_shards),
            "base_mb": base,
            "scan_kids_mb": scan_kids,
            "kids_mb": memory.peak_mib(children=True),
            "scan_cpu_s": c1[1] - c0[1],
            "plan_cpu_s": c2[1] - c1[1],
            "scan_driver_cpu_s": c1[0] - c0[0],
            "plan_driver_cpu_s": c2[0] - c1[0],
            "scan_s": t1 - t0,
            "scan_peak_mb": scan_peak,
            "plan_s": t2 - t1,
            "plan_peak_mb": memory.peak_mib(),
        }
    )


def measure_stages(kind: str, src: Path, workers: int) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    q: mp.Queue[dict[str, float]] = ctx.Queue()
    p = ctx.Process(target=_stage, args=(kind, str(src), workers, q))
    p.start()
    result = q.get()
    p.join()
    return result


def measure_convert(kind: str, src: Path, workers: int) -> dict[str, float]:
    """The whole CLI in a child; peak of its main process and of the biggest descendant."""
    out = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    probe = (
        "import resource, sys, runpy\n"
        "sys.argv = ['shardify'] + sys.argv[1:]\n"
        "from shardify.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
        "print('PEAK', me, kids, file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            probe,
            "convert",
            kind,
            str(src),
            str(out / "ds"),
            "--quiet",
            "--workers",
            str(workers),
            "--no-fsync",
        ],
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - t0
    if proc.returncode not in (0, 3):
        raise SystemExit(proc.stderr)
    line = [x for x in proc.stderr.splitlines() if x.startswith("PEAK")][-1]
    me, kids = (int(v) / 1024 for v in line.split()[1:])
    index = json.loads((out / "ds" / "train.json").read_text())
    samples = sum(s["nsamples"] for s in index["shardlist"])
    nbytes = sum(s["filesize"] for s in index["shardlist"])
    shutil.rmtree(out)
    return {
        "convert_s": elapsed,
        "main_peak_mb": me,
        "worker_peak_mb": kids,
        "samples": samples,
        "bytes_per_sample": nbytes / max(samples, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--rows",
        type=int,
        nargs="+",
        default=[1_300_000],
        help="rows of the listing (files of the tree); several: each in turn, and the ratios",
    )
    ap.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "shardify-bench-scale")
    ap.add_argument("--tree", action="store_true", help="also an image folder of --rows tiny JPEGs")
    ap.add_argument("--write", action="store_true", help="also run the whole conversion (slow)")
    ap.add_argument("--workers", type=int, default=2, help="processes for the scan and the conversion")
    ap.add_argument("--no-listing", action="store_true", help="with --tree: measure the image folder only")
    args = ap.parse_args()
    args.data.mkdir(parents=True, exist_ok=True)
    first: dict[str, dict[str, float]] = {}
    for rows in args.rows:
        for kind, r in run_size(args, rows):
            if kind in first:
                f = first[kind]
                print(
                    f"{kind}: {rows} vs {int(f['samples'])} samples: driver peak {_ratio(r, f, 'scan_peak_mb')} "
                    f"after the scan, {_ratio(r, f, 'plan_peak_mb')} after the plan; workers' peak "
                    f"{_ratio(r, f, 'kids_mb')}; scan+plan time {_ratio(r, f, 'scan_s', 'plan_s')}"
                )
            else:
                first[kind] = r


def _ratio(now: dict[str, float], then: dict[str, float], *keys: str) -> str:
    a, b = sum(now[k] for k in keys), sum(then[k] for k in keys)
    return f"x{a / b:.2f}" if b else "x?"


def run_size(args: argparse.Namespace, rows: int) -> list[tuple[str, dict[str, float]]]:
    # Deferred: each stage is a spawned process that imports this module again, and its peak
    # memory must be the stage's, not numpy's and PIL's (which the corpus makers import).
    from benchlib import corpus

    listing = args.data / f"listing-{rows}.jsonl"
    t0 = time.perf_counter()
    corpus.listing(listing, rows)
    print(f"listing: {listing} ({listing.stat().st_size / 1e6:.0f} MB, made in {time.perf_counter() - t0:.1f} s)")
    kinds = [] if args.no_listing and args.tree else [("listing", listing)]
    if args.tree:
        tree = args.data / f"tree-{rows}"
        t0 = time.perf_counter()
        corpus.listing_tree(tree, rows)
        print(f"tree: {tree} (made in {time.perf_counter() - t0:.1f} s)")
        kinds.append(("imagefolder", tree))
    results = []
    for kind, src in kinds:
        r = measure_stages(kind, src, args.workers)
        results.append((kind, r))
        print(
            f"{kind}: {int(r['samples'])} samples, {int(r['shards'])} shards; "
            f"scan {r['scan_s']:.1f} s ({r['scan_cpu_s']:.1f} s CPU, "
            f"{r['scan_driver_cpu_s']:.1f} s of it the driver's; "
            f"driver peak {r['scan_peak_mb']:.0f} MB, "
            f"workers' peak {r['scan_kids_mb']:.0f} MB), "
            f"plan {r['plan_s']:.1f} s ({r['plan_cpu_s']:.1f} s CPU, "
            f"{r['plan_driver_cpu_s']:.1f} s of it the driver's; "
            f"driver peak {r['plan_peak_mb']:.0f} MB, "
            f"workers' peak {r['kids_mb']:.0f} MB); scan+plan {r['scan_s'] + r['plan_s']:.1f} s; "
            f"interpreter alone {r['base_mb']:.0f} MB"
        )
        if args.write:
            c = measure_convert(kind, src, args.workers)
            print(
                f"{kind} convert (--workers {args.workers}): {c['convert_s']:.1f} s, main process peak "
                f"{c['main_peak_mb']:.0f} MB, biggest worker peak {c['worker_peak_mb']:.0f} MB, "
                f"{c['bytes_per_sample']:.0f} bytes per sample on disk"
            )
    return results


if __name__ == "__main__":
    main()
