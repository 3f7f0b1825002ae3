"""The ``shardify`` command: parse arguments, call the library, map errors to exit codes.

Exit codes: 0 done; 1 error (nothing marked finished); 2 bad usage; 3 done, but some
inputs were skipped as bad (listed in ``{split}.report.jsonl``) or ``verify`` found problems.
Importing this module does not import torch: only ``bench`` loads the reader.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from shardify import __version__
from shardify.errors import ShardifyError

__all__ = ["main", "entrypoint", "EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_SKIPPED"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_SKIPPED = 0, 1, 2, 3

_EXAMPLES = {
    "imagefolder": """example:
  shardify convert imagefolder ~/data/imagenet/train out/imagenet --split train
  shardify convert imagefolder ~/data/imagenet/val   out/imagenet --split validation

SRC/<class>/**/<image>: classes are the sorted folder names (torchvision's ImageFolder
labels); hidden files and folders are skipped, non-image files are counted and reported.""",
    "ids": """example:
  shardify convert ids data/ out/mydata --partition partition.json --labels labels.json

partition.json: {"train": ["id1", "id2"], "validation": ["id3"]}
labels.json:    {"id1": 0, "id2": 1, "id3": 0}     (ints, or names: indices by sorted name)
Each ID's files are data/<ID>.* (.pt, .npy, .jpg, .json, ...); all of them make one sample.""",
    "listing": """example:
  shardify convert listing train.jsonl out/mydata
  shardify convert listing meta.csv out/mydata --root /data/images

Rows: path (relative to the listing's folder or --root) and/or id, label, optional split,
other columns inline ("text" -> {key}.txt, "caption" -> {key}.caption.txt).""",
}


def _common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--split", default="train", help="split name (default: train; listing: for rows without a split)")
    g.add_argument("--shard-size", default="256MB", help="bound on shard size, with units: 64MB, 1GiB (default: 256MB)")
    g.add_argument("--samples-per-shard", type=int, default=10_000,
                   help="bound on samples per shard (default: 10000, so that a reader starting mid-shard "
                        "scans few headers; 0: none)")
    g.add_argument("--min-shards", type=int, default=32,
                   help="a smaller dataset gets smaller shards (down to 16 MB) so that it makes this many, "
                        "written by every core (default: 32; 1: never shrink)")
    g.add_argument("--seed", type=int, default=0, help="seed of the sample order (default: 0)")
    g.add_argument("--no-shuffle", action="store_true", help="keep the input order instead of a seeded shuffle")
    g.add_argument("--metadata", choices=("auto", "always"), default="auto",
                   help="per-sample {key}.json: auto, only when it holds what key, members and index do not "
                        "(default); always")
    g.add_argument("--overwrite", action="store_true", help="replace a split that is already finished in OUT")
    g = p.add_argument_group("checks")
    g.add_argument("--check", choices=("header", "full"), default="header",
                   help="header: format, size, mode and completeness (default); full: decode every image")
    g.add_argument("--strict", action="store_true", help="stop at the first bad input instead of skipping it")
    g.add_argument("--max-pixels", type=int, default=None,
                   help="decompression-bomb limit in pixels (default: Pillow's, about 89 M)")
    g.add_argument("--no-follow-symlinks", action="store_true", help="ignore symbolic links in the source tree")
    g.add_argument("--num-classes", type=int, default=None, help="int labels must be below this")
    g = p.add_argument_group("transcode")
    g.add_argument("--max-side", type=int, default=None,
                   help="downscale images whose longer side exceeds this and re-encode them as JPEG")
    g.add_argument("--quality", type=int, default=90, help="JPEG quality with --max-side (default: 90)")
    g = p.add_argument_group("run")
    g.add_argument("--workers", type=int, default=0, help="worker processes (default: one per core)")
    g.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: a process pool (default); ray: Ray tasks (pip install 'shardify[ray]')")
    g.add_argument("--ray-address", default=None,
                   help="Ray cluster to join (default: start a local Ray for the run)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g.add_argument("--no-fsync", action="store_true", help="do not fsync shards before renaming them (faster, less safe)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shardify", description="Pack datasets into tar shards; stream them into PyTorch.")
    parser.add_argument("--version", action="version", version=f"shardify {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    conv = sub.add_parser("convert", help="convert a dataset into shards", description="Convert a dataset into shards.")
    kinds = conv.add_subparsers(dest="kind", required=True, metavar="KIND")
    fmt = argparse.RawDescriptionHelpFormatter
    p = kinds.add_parser("imagefolder", help="SRC/<class>/<image> folders", epilog=_EXAMPLES["imagefolder"], formatter_class=fmt)
    p.add_argument("src", metavar="SRC")
    p.add_argument("out", metavar="OUT")
    _common(p)
    p = kinds.add_parser("ids", help="ID-labelled files SRC/<id>.*", epilog=_EXAMPLES["ids"], formatter_class=fmt)
    p.add_argument("src", metavar="SRC")
    p.add_argument("out", metavar="OUT")
    p.add_argument("--partition", required=True, help="JSON {split: [ids]}")
    p.add_argument("--labels", required=True, help="JSON {id: label}")
    _common(p)
    p = kinds.add_parser("listing", help="a CSV or JSONL listing", epilog=_EXAMPLES["listing"], formatter_class=fmt)
    p.add_argument("src", metavar="FILE")
    p.add_argument("out", metavar="OUT")
    p.add_argument("--root", default=None, help="folder the listing's paths are relative to (default: the listing's)")
    p.add_argument("--format", dest="fmt", choices=("csv", "jsonl"), default=None, help="default: from the extension")
    _common(p)
    p = sub.add_parser("info", help="describe a dataset: splits, samples, shards, bytes, classes")
    p.add_argument("dataset", metavar="DATASET")
    p.add_argument("--json", action="store_true", help="print JSON")
    p = sub.add_parser("verify", help="check checksums, counts and naming of every shard")
    p.add_argument("dataset", metavar="DATASET")
    p.add_argument("--split", action="append", default=None, help="only this split (repeatable)")
    p.add_argument("--decode", action="store_true", help="also decode every image and parse every label")
    p.add_argument("--json", action="store_true", help="print JSON")
    p = sub.add_parser("bench", help="measure reading speed of a dataset (decode + augment + batch)")
    p.add_argument("dataset", metavar="DATASET")
    p.add_argument("--split", default=None, help="default: the only split, or train")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers (default: 2)")
    p.add_argument("--epochs", type=int, default=5, help="epochs to stream (default: 5)")
    p.add_argument("--size", type=int, default=224, help="crop size of RandomResizedCrop (default: 224)")
    p.add_argument("--no-webdataset", action="store_true", help="skip the side-by-side webdataset run")
    p.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _options(args: argparse.Namespace) -> Any:
    from shardify.convert.options import ConvertOptions, parse_size

    return ConvertOptions(
        split=args.split, shard_size=parse_size(args.shard_size), samples_per_shard=args.samples_per_shard or None,
        min_shards=args.min_shards,
        shuffle=not args.no_shuffle, seed=args.seed, check=args.check, max_side=args.max_side,
        quality=args.quality, max_pixels=args.max_pixels, follow_symlinks=not args.no_follow_symlinks,
        num_classes=args.num_classes, strict=args.strict, overwrite=args.overwrite, workers=args.workers,
        fsync=not args.no_fsync, progress=not args.quiet, engine=args.engine, ray_address=args.ray_address,
        metadata=args.metadata)


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n}"


def _convert(args: argparse.Namespace) -> int:
    from shardify.convert import run

    options = _options(args)
    if args.kind == "imagefolder":
        result = run.convert_imagefolder(args.src, args.out, options=options)
    elif args.kind == "ids":
        result = run.convert_ids(args.src, args.out, partition=args.partition, labels=args.labels, options=options)
    else:
        result = run.convert_listing(args.src, args.out, root=args.root, fmt=args.fmt, options=options)
    for s in result.splits.values():
        reused = f", {s.reused_shards} reused" if s.reused_shards else ""
        ignored = sum(s.ignored.values())
        print(f"{s.split}: {s.samples} samples in {s.shards} shards ({_human(s.bytes)}{reused}) "
              f"in {s.seconds:.1f} s; {len(s.skipped)} skipped, {ignored} ignored", file=sys.stderr)
        for note in s.notes:
            print(f"  note: {note}", file=sys.stderr)
        for p in s.skipped[:10]:
            print(f"  skipped {p.path}: {p.reason}", file=sys.stderr)
        if len(s.skipped) > 10:
            print(f"  ... {len(s.skipped) - 10} more", file=sys.stderr)
        if s.skipped or ignored:
            print(f"  report: {args.out}/{s.split}.report.jsonl", file=sys.stderr)
    return EXIT_SKIPPED if result.num_skipped else EXIT_OK


def _info(args: argparse.Namespace) -> int:
    from shardify.convert.verify import dataset_info

    info = dataset_info(args.dataset)
    if args.json:
        print(json.dumps(info, indent=1))
        return EXIT_OK
    print(f"{info['path']} (format {info['format_version']})")
    for split, s in info["splits"].items():
        names = ", ".join(s["class_names"][:5]) + (", ..." if s["classes"] > 5 else "")
        print(f"  {split}: {s['samples']} samples, {s['shards']} shards, {_human(s['bytes'])}, "
              f"{s['classes']} classes{' (' + names + ')' if names else ''}; fields {', '.join(s['fields'])}")
        if s["skipped"]:
            print(f"    skipped at conversion: {s['skipped']}")
    return EXIT_OK


def _verify(args: argparse.Namespace) -> int:
    from shardify.convert.verify import verify_dataset

    report = verify_dataset(args.dataset, splits=args.split, decode=args.decode)
    if args.json:
        print(json.dumps({"ok": report.ok, "checked": report.checked, "problems": [str(p) for p in report.problems]}, indent=1))
    else:
        for split, c in report.checked.items():
            print(f"{split}: {c['shards']} shards, {c['samples']} samples checked")
        for p in report.problems:
            print(f"problem: {p}")
        print("ok" if report.ok else f"{len(report.problems)} problem(s)")
    return EXIT_OK if report.ok else EXIT_SKIPPED


def _bench(args: argparse.Namespace) -> int:
    from shardify.reader.bench import format_bench, run_bench

    result = run_bench(args.dataset, split=args.split, batch_size=args.batch_size, num_workers=args.workers,
                       epochs=args.epochs, image_size=args.size, compare_webdataset=not args.no_webdataset)
    print(json.dumps(result, indent=1, default=str) if args.json else format_bench(result))
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv``; return the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "convert":
            return _convert(args)
        if args.command == "info":
            return _info(args)
        if args.command == "verify":
            return _verify(args)
        return _bench(args)
    except ShardifyError as e:
        print(f"shardify: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except ValueError as e:  # option values the parser could not check (sizes, ranges)
        print(f"shardify: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("shardify: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


def entrypoint() -> None:
    """The console script."""
    sys.exit(main())
