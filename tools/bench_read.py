"""Reading benchmark, run by hand: ``python tools/bench_read.py [--images 2000] [--out bench-out]``;
``--remote``: reading over HTTP with added latency, and bytes per simulated node (tools/bench_remote.py).

Makes (once, under ``--out``) an ImageFolder of natural-looking ImageNet-size JPEGs, converts
it with shardify's converter, warms the page cache, then prints :func:`run_bench`'s table:
single-process decode+augment, our loader, webdataset side by side, time to first batch,
memory over epochs and shuffle quality.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchlib import corpus

from shardify.cli.bench import format_bench, run_bench


def build(out: Path, images: int, per_shard: int, *, sidecars: bool = False) -> Path:
    """The converted dataset under ``out`` (made if missing): 20 classes of ``images / 20``;
    ``sidecars``: with per-shard sidecars and a compact index, as a split over the threshold."""
    dataset = out / f"imagenet-{images}{'-sidecars' if sidecars else ''}"
    if (dataset / "manifest.json").exists():
        return dataset
    classes = 20
    src = corpus.photos(out / f"imagefolder-{images}", images, classes=classes)
    from shardify.convert.options import ConvertOptions
    from shardify.convert.write import finish
    from shardify.convert.write.run import convert_imagefolder

    options = ConvertOptions(samples_per_shard=per_shard, shard_size=None, workers=2, progress=False, fsync=False)
    threshold = finish.SIDECAR_ABOVE_SAMPLES
    finish.SIDECAR_ABOVE_SAMPLES = 0 if sidecars else threshold
    try:
        convert_imagefolder(src, dataset, options=options)
    finally:
        finish.SIDECAR_ABOVE_SAMPLES = threshold
    return dataset


def warm(dataset: Path) -> int:
    """Read every shard once so the page cache holds them; returns the bytes read."""
    total = 0
    for shard in sorted(dataset.glob("*.tar")):
        with open(shard, "rb") as f:
            while chunk := f.read(1 << 24):
                total += len(chunk)
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--per-shard", type=int, default=125)
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--dataset", type=Path, help="benchmark this converted dataset instead")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--single-limit", type=int, default=None, help="images timed in one process (all)")
    parser.add_argument("--no-webdataset", action="store_true")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    parser.add_argument("--remote", action="store_true", help="remote figures instead (tools/bench_remote.py)")
    parser.add_argument("--delays", type=float, nargs="*", default=[0, 20, 50], help="added ms per request")
    parser.add_argument("--nodes", type=int, nargs="*", default=[2, 4, 8], help="simulated node counts")
    parser.add_argument("--tiny", type=int, default=20000, help="tiny samples for the remote read rate")
    parser.add_argument("--requests", type=int, default=64, help="ranged requests in flight per worker")
    parser.add_argument("--tiny-block", type=int, default=64, help="shuffle block of the tiny samples")
    parser.add_argument(
        "--sidecars",
        action="store_true",
        help="node traffic of the photos converted with sidecars and a compact index (what splits over "
        "100,000 samples get), read through the compact index",
    )
    args = parser.parse_args(argv)
    if args.remote:
        return remote(args)
    dataset = args.dataset or build(args.out, args.images, args.per_shard)
    print(f"warmed {warm(dataset) / 2**20:.0f} MiB of shards", file=sys.stderr)
    result = run_bench(
        dataset,
        batch_size=args.batch_size,
        num_workers=args.workers,
        epochs=args.epochs,
        single_limit=args.single_limit,
        compare_webdataset=not args.no_webdataset,
    )
    print(format_bench(result))
    if args.json:
        print(json.dumps(result, indent=1))
    return 0


def remote(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(Path(__file__).parent))
    import bench_remote

    dataset = args.dataset or build(args.out, args.images, args.per_shard)
    warm(dataset)
    for what, ds, block, photos in (
        ("photos", dataset, 4, True),
        ("tiny", bench_remote.tiny_dataset(args.out, args.tiny), args.tiny_block, False),
    ):
        for row in bench_remote.read_rate(
            ds, delays_ms=args.delays, photos=photos, requests=args.requests, block=block
        ):
            print(json.dumps({"samples": what, "block": block, "requests": args.requests, **row}))
    if args.nodes:
        indexes = [("json-index", dataset)]
        if args.sidecars:
            indexes.append(("compact-index", build(args.out, args.images, args.per_shard, sidecars=True)))
        for index, ds in indexes:
            for row in bench_remote.node_traffic(ds, nodes=args.nodes, work=args.out / f"nodes-{index}"):
                print(json.dumps({"index": index, **row}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
