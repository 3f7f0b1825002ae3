"""Pre-decoded images against JPEGs: bytes on disk and images/s per core, run by hand.

    python tools/bench_raw.py                       # 600 images, S = 256 and 320, 5 rounds
    python tools/bench_raw.py --images 1000 --sizes 256 --rounds 7 --out /tmp/bench-raw

Makes (once, under ``--out``) an ImageFolder of natural-looking ImageNet-size JPEGs (the
corpus ``tools/bench_read.py`` uses, ``benchlib.corpus.photos``) and
converts it as is and with ``--raw-pixels S`` for each S. Then, one core (one process, torch
on one thread, warm page cache), it times (CPU time of the process, and wall-clock) one epoch of ``ShardedDataset``
(read, crop, resize,
flip, collate into uint8 batches of 64) with ``imagenet_train(224)`` (RandomResizedCrop 224 +
flip) and with ``imagenet_eval(224)`` on every split, rounds alternating between the splits,
so a machine shared with other jobs slows all of them alike: compare the ratios within a
round. The rate per core is images per CPU second of the process (other jobs on a shared
machine steal wall-clock time, far less CPU time). Prints the bytes on disk, each split's images/s (best and median
over rounds) and the
raw/JPEG ratio of each round.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from benchlib import corpus

from shardify.convert.options import ConvertOptions
from shardify.convert.write.run import convert_imagefolder
from shardify.manifest import Manifest
from shardify.reader import BatchOptions, ShardedDataset
from shardify.reader import transforms as T

__all__ = ["main"]

PRESETS = {"train": lambda: T.imagenet_train(224), "eval": lambda: T.imagenet_eval(224)}


def build(out: Path, images: int, sizes: list[int]) -> dict[str, tuple[Path, float]]:
    """``{name: (dataset, seconds to convert)}``: ``jpeg`` and ``raw-S`` for each S (made if missing)."""
    src = corpus.photos(out / f"imagefolder-{images}", images, classes=20)
    made: dict[str, tuple[Path, float]] = {}
    for name, raw in [("jpeg", None), *((f"raw-{s}", s) for s in sizes)]:
        dataset = out / f"{name}-{images}"
        t0 = time.perf_counter()
        if not (dataset / "manifest.json").exists():
            options = ConvertOptions(
                samples_per_shard=125, shard_size=None, workers=1, progress=False, fsync=False, raw_pixels=raw
            )
            convert_imagefolder(src, dataset, options=options)
        made[name] = (dataset, time.perf_counter() - t0)
    return made


def disk_bytes(dataset: Path) -> int:
    """Bytes of the split's shards."""
    ref = Manifest.load(dataset).splits["train"]
    return ref.bytes


def epoch_rate(dataset: Path, preset: str, epoch: int) -> tuple[float, float]:
    """(images per CPU second, images per wall second) of one epoch read in this process (no
    workers, torch on one thread): the first is the rate per core, which other jobs on a
    shared machine disturb far less than the second."""
    ds = ShardedDataset(
        dataset,
        batch_size=64,
        shuffle=preset == "train",
        seed=0,
        transform=PRESETS[preset](),
        batching=BatchOptions(drop_last=False),
    )
    ds.set_epoch(epoch)
    n = 0
    cpu, wall = time.process_time(), time.perf_counter()
    for images, _ in ds:
        n += images.shape[0]
    return n / (time.process_time() - cpu), n / (time.perf_counter() - wall)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 320], help="values of --raw-pixels S")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--presets", nargs="+", choices=sorted(PRESETS), default=["train", "eval"])
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    made = build(args.out, args.images, args.sizes)
    base = disk_bytes(made["jpeg"][0])
    print(f"{args.images} ImageNet-size JPEGs (synthetic photo-like), one core, batches of 64")
    for name, (dataset, seconds) in made.items():
        b = disk_bytes(dataset)
        print(
            f"  {name:8s} {b / 1e6:8.1f} MB on disk ({b / args.images / 1e3:6.1f} KB/image, {b / base:4.2f}x JPEG)"
            + (f", converted in {seconds:.1f} s" if seconds > 0.5 else "")
        )
    for dataset, _ in made.values():
        corpus.warm(dataset)
        epoch_rate(dataset, args.presets[0], epoch=0)  # a warm-up pass: imports, caches
    for preset in args.presets:
        rates: dict[str, list[tuple[float, float]]] = {name: [] for name in made}
        for r in range(args.rounds):
            for name, (dataset, _) in made.items():
                rates[name].append(epoch_rate(dataset, preset, epoch=r))
        print(f"{preset} ({PRESETS[preset]()!r}), images/s per core (CPU time); wall-clock in brackets:")
        for name, values in rates.items():
            cpu, wall = [v[0] for v in values], [v[1] for v in values]
            line = (
                f"  {name:8s} median {statistics.median(cpu):6.0f} (best {max(cpu):6.0f}) "
                f"[wall median {statistics.median(wall):6.0f}]"
            )
            if name != "jpeg":
                ratios = [a[0] / b[0] for a, b in zip(values, rates["jpeg"])]
                walls = [a[1] / b[1] for a, b in zip(values, rates["jpeg"])]
                line += (
                    f"; x JPEG per round: {', '.join(f'{x:.2f}' for x in ratios)} (median "
                    f"{statistics.median(ratios):.2f}) [wall median {statistics.median(walls):.2f}]"
                )
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
