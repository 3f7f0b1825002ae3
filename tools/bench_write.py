"""Writing shards: shardify next to webdataset and GNU tar, and convert_items' workers and limits.

Run by hand (not a test):
    python tools/bench_write.py [--parts items,writer] [--samples 100000] [--items 1500] [--repeat 3]
    python tools/bench_write.py --parts folder [--images 3000] [--data DIR]
    python tools/bench_write.py --parts limits [--limit-items 20000]

Parts (``--parts``, comma-separated), each run ``--repeat`` times with the sides alternating
and the best kept, so that a loaded machine slows both sides alike; the ratios are the figures
to compare:

- ``writer``: one process writes ``--samples`` samples of a ``3x32x32`` uint8 array (``npy``)
  and a label (``cls``), already in memory (``benchlib.corpus.arrays``), with
  ``shardify.convert.ShardWriter`` and with ``webdataset.ShardWriter`` (256 MB shards both).
- ``items``: ``convert_items`` runs a CPU-bound ``fn`` (JPEG-encode a ``--side`` x ``--side``
  RGB array) over ``--items`` items with 1 and 2 workers, and, for the ceiling this machine
  allows, the same ``fn`` alone (no shardify) in 1 process and in 2 forked processes of half
  the items each: two processes on a shared machine do not run at twice the rate of one.
- ``folder``: an image folder of ``--images`` photo-like ImageNet-size JPEGs in 10 classes
  (``benchlib.corpus.photos``, quality 92, made once under ``--data``, page cache warmed)
  converted by shardify (fsync and not), packed by ``tar cf`` and by webdataset's ShardWriter.
- ``limits``: ``convert_items`` over ``--limit-items`` items of a 3x32x32 array and a label,
  2 workers, no fsync, with and without ``item_timeout``/``max_worker_memory`` (supervised
  workers against the plain process pool): what the limits cost per item.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from benchlib import corpus, memory, timing

from shardify.convert import ShardWriter, convert_items

SHARD_BYTES = 256 * 1000**2
SIDE = 256
_BASE: np.ndarray | None = None


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
    own0, all0 = memory.cpu_s()
    t = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - t
    own1, all1 = memory.cpu_s()
    if cpu is not None:
        cpu["main"], cpu["workers"] = own1 - own0, (all1 - own1) - (all0 - own0)
    shutil.rmtree(out, ignore_errors=True)
    return elapsed


def _ratio(rates: dict[str, float], a: str, b: str) -> float | None:
    return round(rates[a] / rates[b], 2) if a in rates and b in rates else None


def python_writers(args: argparse.Namespace, root: Path, parts: list[str], fsync: bool) -> dict[str, object]:
    """The ``items`` and ``writer`` parts: seconds, rates and ratios."""
    best: dict[str, float] = {}
    # items first: forking workers from a process that holds 100,000 arrays would time the fork
    cpu: dict[str, dict[str, float]] = {}
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
    arrays, labels = corpus.arrays(args.samples if "writer" in parts else 0)
    for _ in range(args.repeat if "writer" in parts else 0):
        for name, fn in (
            ("shardify ShardWriter", lambda: write_shardify(root / "a", arrays, labels, fsync=fsync)),
            ("webdataset ShardWriter", lambda: write_webdataset(root / "a", arrays, labels)),
        ):
            best[name] = min(best.get(name, float("inf")), _timed(fn, root / "a"))
    rates = {k: (args.samples if "ShardWriter" in k else args.items) / v for k, v in best.items()}
    return {
        "samples": args.samples,
        "items": args.items,
        "side": args.side,
        "seconds": {k: round(v, 3) for k, v in best.items()},
        "samples_per_s": {k: round(v) for k, v in rates.items()},
        "shardify_vs_webdataset": _ratio(rates, "shardify ShardWriter", "webdataset ShardWriter"),
        "items_2_vs_1_workers": _ratio(rates, "convert_items workers=2", "convert_items workers=1"),
        "fn_alone_2_vs_1_processes": _ratio(rates, "fn alone processes=2", "fn alone processes=1"),
        "convert_items_cpu_ms_per_item": {
            k: {part: round(1000 * v / args.items, 3) for part, v in c.items()} for k, c in cpu.items()
        },
    }


def image_folder(args: argparse.Namespace, out: Path) -> dict[str, object]:
    """The ``folder`` part: one image folder packed by tar, shardify and webdataset; a table on stderr."""
    from shardify.convert.options import ConvertOptions
    from shardify.convert.write.run import convert_imagefolder

    data = corpus.photos(args.data / f"folder-{args.images}-q92", args.images, classes=10, quality=92)
    corpus.warm(data)
    files = sorted(p for p in data.rglob("*.JPEG"))
    nbytes = sum(p.stat().st_size for p in files)
    print(f"data: {len(files)} JPEGs, {nbytes / 1e6:.0f} MB in {data}", file=sys.stderr)

    def fresh() -> Path:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        return out

    def tar_cf() -> None:
        subprocess.run(["tar", "cf", str(fresh() / "all.tar"), "-C", str(data), "."], check=True)

    def shardify(fsync: bool) -> None:
        opts = ConvertOptions(workers=args.workers, progress=False, fsync=fsync)
        convert_imagefolder(data, fresh() / "ds", options=opts)

    def shard_writer() -> None:
        import webdataset as wds

        pattern = str(fresh() / "wds-%06d.tar")
        with wds.ShardWriter(pattern, maxsize=SHARD_BYTES, verbose=0) as sink:
            for label, c in enumerate(sorted(p.name for p in data.iterdir())):
                for p in sorted((data / c).iterdir()):
                    sink.write(
                        {
                            "__key__": f"{c}__{p.stem}",
                            "jpg": p.read_bytes(),
                            "cls": label,
                            "json": {"path": f"{c}/{p.name}", "label": c},
                        }
                    )

    sides = [
        ("GNU tar cf", tar_cf),
        ("shardify (fsync)", lambda: shardify(True)),
        ("shardify (--no-fsync)", lambda: shardify(False)),
        ("webdataset ShardWriter", shard_writer),
    ]
    rows = [(name, timing.best_of(fn, args.repeat)) for name, fn in sides]
    shutil.rmtree(out, ignore_errors=True)
    base = rows[0][1]
    table = [
        (name, f"{sec:.2f}", f"{sec / base:.2f}", f"{nbytes / sec / 1e6:.0f}", f"{len(files) / sec:.0f}")
        for name, sec in rows
    ]
    print(timing.markdown_table(["writer", "wall s", "x tar", "MB/s", "img/s"], table), file=sys.stderr)
    return {"images": len(files), "folder_seconds": {name: round(sec, 3) for name, sec in rows}}


def _array_item(i: int) -> dict[str, object]:
    return {"npy": np.full((3, 32, 32), i % 251, dtype=np.uint8), "cls": i % 10}


def limits(args: argparse.Namespace, root: Path) -> dict[str, object]:
    """The ``limits`` part: convert_items with and without supervised workers."""
    n = args.limit_items
    sides = (("plain", {}), ("limits", {"item_timeout": 60.0, "max_worker_memory": "1GiB"}))
    times: dict[str, list[float]] = {name: [] for name, _ in sides}
    for _ in range(args.repeat):
        for name, extra in sides:
            run = functools.partial(
                convert_items, range(n), _array_item, root / "c", workers=2, progress=False, fsync=False, **extra
            )
            times[name].append(_timed(run, root / "c"))
    for name, got in times.items():
        print(f"limits {name:7s} best {min(got):.2f} s = {n / min(got):,.0f} items/s", file=sys.stderr)
    return {"limit_items": n, "limits_seconds": {k: [round(t, 3) for t in v] for k, v in times.items()}}


def main() -> None:
    global SIDE
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="items,writer", help="comma-separated: writer, items, folder, limits")
    p.add_argument("--samples", type=int, default=100_000, help="writer: samples to write")
    p.add_argument("--items", type=int, default=1500, help="items: items to encode")
    p.add_argument("--side", type=int, default=256, help="items: side of the JPEG to encode")
    p.add_argument("--images", type=int, default=3000, help="folder: JPEGs in the image folder")
    p.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "shardify-bench-imagefolder")
    p.add_argument("--workers", type=int, default=0, help="folder: shardify's workers (0: one per core)")
    p.add_argument("--limit-items", type=int, default=20_000, help="limits: items to convert")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-fsync", action="store_true", help="shardify without fsync (webdataset never fsyncs)")
    p.add_argument("--dir", default=None, help="where to write (default: a temporary folder)")
    args = p.parse_args()
    SIDE = args.side
    parts = args.parts.split(",")
    root = Path(args.dir or tempfile.mkdtemp(prefix="bench_write_"))
    fsync = not args.no_fsync
    load_start = os.getloadavg()[0]
    result: dict[str, object] = {"parts": parts, "repeat": args.repeat, "fsync": fsync}
    if "items" in parts or "writer" in parts:
        result.update(python_writers(args, root, parts, fsync))
    if "folder" in parts:
        result.update(image_folder(args, root / "folder"))
    if "limits" in parts:
        result.update(limits(args, root))
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)
    result["cpus"] = len(os.sched_getaffinity(0))
    result["load_avg_start_end"] = [load_start, os.getloadavg()[0]]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
