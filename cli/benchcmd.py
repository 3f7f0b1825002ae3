"""``shardify bench DATASET``: how fast the reader reads a dataset on this machine (see :mod:`shardify.cli.bench`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from shardify.cli.common import EXIT_OK, FORMATTER

__all__ = ["add_parser", "run_bench_command"]

_EXAMPLES = """examples:
  shardify bench out/imagenet --split train --workers 8 --batch-size 256
  shardify bench out/imagenet --no-webdataset --epochs 3 --json

A split without images is measured for reading only (the output says what is not measured)."""


def run_bench_command(args: argparse.Namespace) -> int:
    """Measure; print the table (or JSON). A progress bar on stderr when it is a terminal."""
    from shardify.cli.bench import format_bench, run_bench  # deferred: the reader loads torch

    result = run_bench(
        args.dataset,
        split=args.split,
        batch_size=args.batch_size,
        num_workers=args.workers,
        epochs=args.epochs,
        image_size=args.size,
        compare_webdataset=not args.no_webdataset,
        fast_decode=args.fast_decode,
        progress=not args.quiet,
    )
    print(json.dumps(result, indent=1, default=str) if args.json else format_bench(result))
    return EXIT_OK


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="measure reading speed of a dataset (decode + augment + batch)",
        epilog=_EXAMPLES,
        formatter_class=FORMATTER,
    )
    p.add_argument("dataset", metavar="DATASET")
    p.add_argument("--split", default=None, help="default: the only split, or train")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers (default: 2)")
    p.add_argument("--epochs", type=int, default=5, help="epochs to stream (default: 5)")
    p.add_argument("--size", type=int, default=224, help="crop size of RandomResizedCrop (default: 224)")
    p.add_argument("--no-webdataset", action="store_true", help="skip the side-by-side webdataset run")
    p.add_argument(
        "--fast-decode",
        action="store_true",
        help="decode JPEGs with libjpeg-turbo's fast IDCT and upsampling in (a) and (b) "
        "(the fast-vs-exact ratio and pixel difference are always reported)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar (none either when stderr is not a terminal)")
    p.set_defaults(run=run_bench_command)
