"""Conversion benchmark: shardify vs GNU ``tar cf`` vs webdataset's ShardWriter, same files.

Run by hand (not a test):  python tools/bench_convert.py [--images 3000] [--data DIR]

Makes (once, cached in --data) an image folder of natural-looking ImageNet-size JPEGs,
warms the page cache, then times each writer on the same files, best of --repeat runs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shardify.convert.options import ConvertOptions
from shardify.convert.synth import IMAGENET_SIZES, jpeg_bytes, natural_image
from shardify.convert.write.run import convert_imagefolder


def _make_one(args: tuple[Path, int, int]) -> int:
    root, c, i = args
    path = root / f"n{c:08d}" / f"n{c:08d}_{i}.JPEG"
    if not path.exists():
        s = c * 100_003 + i
        w, h = IMAGENET_SIZES[s % len(IMAGENET_SIZES)]
        path.write_bytes(jpeg_bytes(natural_image(w, h, seed=s), quality=92))
    return path.stat().st_size


def make_data(root: Path, images: int, classes: int) -> int:
    for c in range(classes):
        (root / f"n{c:08d}").mkdir(parents=True, exist_ok=True)
    jobs = [(root, i % classes, i // classes) for i in range(images)]
    with mp.Pool() as pool:
        return sum(pool.map(_make_one, jobs, chunksize=32))


def warm(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            p.read_bytes()


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=3000)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "shardify-bench-imagefolder"))
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "shardify-bench-out"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=0, help="shardify workers (0: one per core)")
    args = ap.parse_args()

    data, out = Path(args.data), Path(args.out)
    t = time.perf_counter()
    nbytes = make_data(data, args.images, args.classes)
    print(
        f"data: {args.images} JPEGs, {nbytes / 1e6:.0f} MB ({nbytes / args.images / 1e3:.0f} KB avg) "
        f"in {data} (made/checked in {time.perf_counter() - t:.1f} s)",
        file=sys.stderr,
    )
    warm(data)

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

        classes = sorted(p.name for p in data.iterdir())
        pattern = str(fresh() / "wds-%06d.tar")
        with wds.ShardWriter(pattern, maxsize=256 * 1000**2, verbose=0) as sink:
            for label, c in enumerate(classes):
                for p in sorted((data / c).iterdir()):
                    sink.write(
                        {
                            "__key__": f"{c}__{p.stem}",
                            "jpg": p.read_bytes(),
                            "cls": label,
                            "json": {"path": f"{c}/{p.name}", "label": c},
                        }
                    )

    rows = [
        ("GNU tar cf", best(tar_cf, args.repeat)),
        ("shardify (fsync)", best(lambda: shardify(True), args.repeat)),
        ("shardify (--no-fsync)", best(lambda: shardify(False), args.repeat)),
        ("webdataset ShardWriter", best(shard_writer, args.repeat)),
    ]
    base = rows[0][1]
    print(f"{'writer':<24}{'wall s':>8}{'x tar':>8}{'MB/s':>8}{'img/s':>8}")
    for name, sec in rows:
        print(f"{name:<24}{sec:>8.2f}{sec / base:>8.2f}{nbytes / sec / 1e6:>8.0f}{args.images / sec:>8.0f}")
    print(json.dumps({name: round(sec, 3) for name, sec in rows}))


if __name__ == "__main__":
    main()
