"""Writing from Python: shardify's ShardWriter vs webdataset's, and convert_items with 1 vs 2 workers.

Run by hand (not a test):  python tools/bench_write.py [--samples 100000] [--items 1500] [--repeat 3]

(a) One process writes ``--samples`` samples of a ``3x32x32`` uint8 array (``npy``) and a label
(``cls``), already in memory, with ``shardify.convert.ShardWriter`` and with
``webdataset.ShardWriter`` (256 MB shards both). (b) ``convert_items`` runs a CPU-bound ``fn``
(JPEG-encode a ``--side`` x ``--side`` RGB array) over ``--items`` items with 1 and 2 workers,
and, for the ceiling this machine allows, the same ``fn`` alone (no shardify) in 1 process and
in 2 forked processes of half the items each: two processes on a shared machine do not run
at twice the rate of one (caches, memory bandwidth, a VM's neighbours).
The runs of each pair alternate and the best of ``--repeat`` is kept, so that a loaded machine
slows both sides alike; the ratios are the figures to compare.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import resource
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from shardify.convert import ShardWriter, convert_items

SHARD_BYTES = 256 * 1000**2


def _samples(n: int) -> tuple[list[np.ndarray], list[int]]:
    rng = np.random.default_rng(0)
    block = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
    return list(block), [int(x) for x in rng.integers(0, 1000, n)]


def write_shardify(out: Path, arrays: list[np.ndarray], labels: list[int], *, fsync: bool) -> None:
    with ShardWriter(out, shard_size=SHARD_BYTES, fsync=fsync) as w:
        for a, y in zip(arrays, labels):
            w.write({"npy": a, "cls": y})


def write_webdataset(out: Path, arrays: list[np.ndarray], labels: list[int]) -> None:
    import webdataset as wds

    out.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(out / "train-%06d.tar"), maxsize=SHARD_BYTES, verbose=0) as sink:
        for i, (a, y) in enumerate(zip(arrays, labels)):
            sink.write({"__key__": f"{i:09d}", "npy": a, "cls": y})


_BASE: np.ndarray | None = None


def jpeg_sample(i: int) -> dict[str, object]:
    """CPU-bound fn: JPEG-encode a (shifted) natural-looking RGB array."""
    from PIL import Image

    global _BASE
    if _BASE is None:
        from shardify.convert.synth import natural_image

        _BASE = np.asarray(natural_image(SIDE, SIDE, seed=0).convert("RGB"))
    arr = np.roll(_BASE, i % SIDE, axis=1)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=90)
    return {"jpg": buf.getvalue(), "cls": i % 1000}


SIDE = 256


def _fn_alone(items: int, processes: int) -> None:
    """``jpeg_sample`` over ``range(items)``, split among ``processes`` forked processes."""
    import multiprocessing as mp

    if processes == 1:
        for i in range(items):
            jpeg_sample(i)
        return
    with mp.get_context("fork").Pool(processes) as pool:
        pool.map(_fn_range, [range(k, items, processes) for k in range(processes)])


def _fn_range(r: range) -> None:
    for i in r:
        jpeg_sample(i)


def _timed(fn: Callable[[], object], out: Path, cpu: dict[str, float] | None = None) -> float:
    """Wall seconds of ``fn()``; ``cpu`` gets the CPU seconds of this process and of its children."""
    shutil.rmtree(out, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    if cpu is not None:
        cpu["main"] = sum(getattr(after[0], f) - getattr(before[0], f) for f in ("ru_utime", "ru_stime"))
        cpu["workers"] = sum(getattr(after[1], f) - getattr(before[1], f) for f in ("ru_utime", "ru_stime"))
    shutil.rmtree(out, ignore_errors=True)
    return elapsed


def _ratio(rates: dict[str, float], a: str, b: str) -> float | None:
    return round(rates[a] / rates[b], 2) if a in rates and b in rates else None


def main() -> None:
    global SIDE
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=100_000)
    p.add_argument("--items", type=int, default=1500)
    p.add_argument("--side", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-fsync", action="store_true", help="shardify without fsync (webdataset never fsyncs)")
    p.add_argument("--parts", default="items,writer", help="which of (a) writer and (b) items to run")
    p.add_argument("--dir", default=None, help="where to write (default: a temporary folder)")
    args = p.parse_args()
    SIDE = args.side
    root = Path(args.dir or tempfile.mkdtemp(prefix="bench_write_"))
    fsync = not args.no_fsync
    load_start = os.getloadavg()[0]
    best: dict[str, float] = {}
    # (b) first: forking workers from a process that holds 100,000 arrays would time the fork
    cpu: dict[str, dict[str, float]] = {}
    parts = args.parts.split(",")
    for _ in range(args.repeat if "items" in parts else 0):
        for w in (1, 2):
            name = f"convert_items workers={w}"
            run = functools.partial(
                convert_items, range(args.items), jpeg_sample, root / "b", workers=w, progress=False, fsync=fsync
            )
            used: dict[str, float] = {}
            elapsed = _timed(run, root / "b", used)
            if elapsed < best.get(name, float("inf")):
                best[name], cpu[name] = elapsed, used
            name = f"fn alone processes={w}"
            best[name] = min(best.get(name, float("inf")), _timed(lambda w=w: _fn_alone(args.items, w), root / "b"))
    arrays, labels = _samples(args.samples if "writer" in parts else 0)
    for _ in range(args.repeat if "writer" in parts else 0):
        for name, fn in (
            ("shardify ShardWriter", lambda: write_shardify(root / "a", arrays, labels, fsync=fsync)),
            ("webdataset ShardWriter", lambda: write_webdataset(root / "a", arrays, labels)),
        ):
            best[name] = min(best.get(name, float("inf")), _timed(fn, root / "a"))
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)

    rates = {k: (args.samples if "ShardWriter" in k else args.items) / v for k, v in best.items()}
    result = {
        "samples": args.samples,
        "items": args.items,
        "side": args.side,
        "repeat": args.repeat,
        "fsync": fsync,
        "cpus": len(os.sched_getaffinity(0)),
        "load_avg_start_end": [load_start, os.getloadavg()[0]],
        "seconds": {k: round(v, 3) for k, v in best.items()},
        "samples_per_s": {k: round(v) for k, v in rates.items()},
        "shardify_vs_webdataset": _ratio(rates, "shardify ShardWriter", "webdataset ShardWriter"),
        "items_2_vs_1_workers": _ratio(rates, "convert_items workers=2", "convert_items workers=1"),
        "fn_alone_2_vs_1_processes": _ratio(rates, "fn alone processes=2", "fn alone processes=1"),
        "convert_items_cpu_ms_per_item": {
            k: {part: round(1000 * v / args.items, 3) for part, v in c.items()} for k, c in cpu.items()
        },
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
