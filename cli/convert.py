"""``shardify convert KIND SRC OUT``: the writer side's command (imagefolder, ids, listing, python, tokens).

Parses the options of each input kind into :class:`~shardify.convert.options.ConvertOptions`
(or :class:`~shardify.convert.pyapi.fromitems.ItemsOptions`), calls :mod:`shardify.convert`, and
prints the summary of each split. Importing this module does not import torch.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from shardify.cli import convert_tokens
from shardify.cli.common import EXIT_OK, EXIT_SKIPPED, FORMATTER, UsageError, count, engine_args, human
from shardify.errors import InputError

__all__ = ["add_parser", "run", "convert_options"]

_EXAMPLES = {
    "convert": """examples:
  shardify convert imagefolder ~/data/imagenet/train out/imagenet --split train
  shardify convert ids data/ out/mydata --partition partition.json --labels labels.json
  shardify convert listing train.jsonl out/mydata
  shardify convert python mymodule:make_sample items.jsonl out/tokens
  shardify convert tokens corpus.jsonl out/corpus --tokenizer tokenizer.json --eos 0

`shardify convert KIND --help` shows each kind's options and examples.""",
    "imagefolder": """example:
  shardify convert imagefolder ~/data/imagenet/train out/imagenet --split train
  shardify convert imagefolder ~/data/imagenet/val   out/imagenet --split validation

SRC/<class>/**/<image>: classes are the sorted folder names (torchvision's ImageFolder
labels); hidden files and folders are skipped, non-image files are counted and reported.""",
    "ids": """example:
  shardify convert ids data/ out/mydata --partition partition.json --labels labels.json

partition.json: {"train": ["id1", "id2"], "validation": ["id3"]}  (the splits: no --split here)
labels.json:    {"id1": 0, "id2": 1, "id3": 0}     (ints, or names: indices by sorted name)
Each ID's files are data/<ID>.* (.pt, .npy, .jpg, .json, ...); all of them make one sample.
With --pt-to-npy, data/<ID>.pt (one tensor each) is stored as field "npy"; read it with
ShardedDataset(out, split="train", batch_size=..., fields=("npy", "cls")).""",
    "listing": """example:
  shardify convert listing train.jsonl out/mydata
  shardify convert listing meta.csv out/mydata --root /data/images

Rows: path (relative to the listing's folder or --root) and/or id, label, optional split,
other columns inline ("text" -> {key}.txt, "caption" -> {key}.caption.txt).""",
    "python": """example:
  shardify convert python mymodule:make_sample items.jsonl out/tokens --workers 8

Each JSONL row is an item; FUNCTION(item) returns a sample dict ({"npy": array, "cls": 3,
"txt": "...", "meta.json": {...}}, optional "__key__") or None to filter the item out.
MODULE is imported as by python -m (the current folder is on the path). An item whose
function raises is skipped and listed in OUT/<split>.report.jsonl (--strict: stop).""",
}


def _common(p: argparse.ArgumentParser, *, split: bool = True) -> None:
    """The options of imagefolder, ids and listing; ``split=False`` (ids, whose splits come from
    --partition) leaves --split out of the help, and ``run`` refuses it naming --partition."""
    g = p.add_argument_group("output")
    g.add_argument(
        "--split",
        default=None,
        help="split name (default: train; listing: for rows without a split)" if split else argparse.SUPPRESS,
    )
    g.add_argument("--shard-size", default="256MB", help="bound on shard size, with units: 64MB, 1GiB (default: 256MB)")
    g.add_argument(
        "--samples-per-shard",
        type=int,
        default=10_000,
        help="bound on samples per shard (default: 10000, so that a reader starting mid-shard "
        "scans few headers; 0: none)",
    )
    g.add_argument(
        "--min-shards",
        type=int,
        default=32,
        help="a smaller dataset gets smaller shards (down to 16 MB) so that it makes this many, "
        "written by every core (default: 32; 1: never shrink)",
    )
    g.add_argument("--seed", type=int, default=0, help="seed of the sample order (default: 0)")
    g.add_argument("--no-shuffle", action="store_true", help="keep the input order instead of a seeded shuffle")
    g.add_argument(
        "--metadata",
        choices=("auto", "always"),
        default="auto",
        help="per-sample {key}.json: auto, only when it holds what key, members and index do not (default); always",
    )
    g.add_argument(
        "--chunk",
        type=int,
        default=None,
        metavar="N",
        help="store N consecutive samples per tar member per field (compact for small samples; "
        "only shardify reads such shards sample by sample, see docs/format.md); default: one "
        "sample per tar sample",
    )
    g.add_argument("--overwrite", action="store_true", help="replace a split that is already finished in OUT")
    g.add_argument(
        "--allow-empty",
        action="store_true",
        help="finish a split even if every input was skipped (default: that is an error, exit 1)",
    )
    g = p.add_argument_group("checks")
    g.add_argument(
        "--check",
        choices=("header", "full"),
        default="header",
        help="header: format, size, mode and completeness (default); full: decode every image",
    )
    g.add_argument("--strict", action="store_true", help="stop at the first bad input instead of skipping it")
    g.add_argument(
        "--max-pixels",
        type=int,
        default=None,
        help="decompression-bomb limit in pixels (default: Pillow's, about 89 M)",
    )
    g.add_argument(
        "--max-image-bytes",
        default="1GiB",
        help="image files larger than this are reported as too large, unread (default: 1GiB)",
    )
    g.add_argument("--no-follow-symlinks", action="store_true", help="ignore symbolic links in the source tree")
    g.add_argument("--num-classes", type=int, default=None, help="int labels must be below this")
    g = p.add_argument_group("transcode")
    g.add_argument(
        "--max-side",
        type=int,
        default=None,
        help="downscale images whose longer side exceeds this and re-encode them as JPEG",
    )
    g.add_argument(
        "--image-format",
        choices=("keep", "jpg", "png"),
        default="keep",
        help="keep: each image in its own format (default); jpg: re-encode the others as JPEG "
        "(lossy, at --quality); png: re-encode the others as PNG (lossless, larger). "
        "One image field for readers that take a single extension (Hugging Face datasets)",
    )
    g.add_argument(
        "--quality", type=int, default=90, help="JPEG quality with --max-side and --image-format jpg (default: 90)"
    )
    g.add_argument(
        "--raw-pixels",
        type=int,
        default=None,
        metavar="S",
        help="store every image pre-decoded (RGB pixels as .ppm), resized so that its --raw-side "
        "is at most S pixels: the reader crops without decoding (FFCV's RAW mode; S 256-320 "
        "for ImageNet-style training)",
    )
    g.add_argument(
        "--raw-side",
        choices=("shorter", "longer"),
        default="shorter",
        help="the side --raw-pixels bounds: shorter (as torchvision's Resize(S); default) or longer",
    )
    g = p.add_argument_group("run")
    g.add_argument("--workers", type=int, default=0, help="worker processes (default: one per core)")
    engine_args(g)


def _python_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--split", default="train", help="split name (default: train)")
    g.add_argument("--shard-size", default="256MB", help="bound on shard size, with units: 64MB, 1GiB (default: 256MB)")
    g.add_argument("--samples-per-shard", type=int, default=None, help="bound on samples per shard (default: none)")
    g.add_argument("--shuffle", action="store_true", help="write the items in a seeded shuffle (default: file order)")
    g.add_argument("--seed", type=int, default=0, help="seed of --shuffle (default: 0)")
    g.add_argument("--classes", default=None, help="comma-separated names of the cls labels, or @FILE (one per line)")
    g.add_argument("--quality", type=int, default=95, help="JPEG/WebP quality of images given as arrays (default: 95)")
    g.add_argument(
        "--chunk",
        type=int,
        default=None,
        metavar="N",
        help="store N consecutive samples per tar member per field (compact for small samples; "
        "only shardify reads such shards sample by sample, see docs/format.md); default: one "
        "sample per tar sample",
    )
    g.add_argument("--overwrite", action="store_true", help="replace a split that is already finished in OUT")
    g.add_argument("--strict", action="store_true", help="stop at the first item whose function raises")
    g = p.add_argument_group("run")
    g.add_argument("--workers", type=int, default=0, help="worker processes (default: one per core)")
    g.add_argument("--chunk-size", type=int, default=32, help="items per worker task (default: 32)")
    g.add_argument(
        "--item-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop and report an item whose function runs longer (its worker is replaced)",
    )
    g.add_argument(
        "--max-worker-memory",
        default=None,
        metavar="SIZE",
        help="stop and report an item on which a worker's memory grows past SIZE (512MiB, 2GB)",
    )
    engine_args(g)


def _convert_python(args: argparse.Namespace) -> Any:
    from shardify.convert.options import parse_size  # deferred: the writer loads Pillow and numpy
    from shardify.convert.pyapi.fromitems import (
        ItemsOptions,
        JsonlItems,
        convert_items,
        load_function,
    )  # deferred: the writer loads Pillow and numpy
    from shardify.convert.pyapi.values import ValueOptions  # deferred: the writer loads Pillow and numpy
    from shardify.convert.write.run import ConvertResult  # deferred: the writer loads Pillow and numpy

    classes: tuple[str, ...] = ()
    if args.classes:
        if args.classes.startswith("@"):
            try:
                with open(args.classes[1:], encoding="utf-8") as f:
                    classes = tuple(line.strip() for line in f if line.strip())
            except OSError as e:
                raise InputError(f"cannot read class names: {e.strerror or e}", path=args.classes[1:]) from e
        else:
            classes = tuple(c.strip() for c in args.classes.split(","))
    options = ItemsOptions(
        split=args.split,
        shard_size=parse_size(args.shard_size),
        samples_per_shard=args.samples_per_shard,
        classes=classes,
        values=ValueOptions(quality=args.quality),
        overwrite=args.overwrite,
        fsync=not args.no_fsync,
        shuffle=args.shuffle,
        seed=args.seed,
        workers=args.workers,
        strict=args.strict,
        engine=args.engine,
        ray_address=args.ray_address,
        chunk_size=args.chunk_size,
        progress=not args.quiet,
        chunk=args.chunk,
        item_timeout=args.item_timeout,
        max_worker_memory=args.max_worker_memory,
    )
    summary = convert_items(JsonlItems(args.src), load_function(args.function), args.out, options=options)
    return ConvertResult(out_dir=args.out, splits={summary.split: summary})


def convert_options(args: argparse.Namespace) -> Any:
    """The :class:`~shardify.convert.options.ConvertOptions` of ``convert imagefolder/ids/listing``'s arguments."""
    from shardify.convert.options import ConvertOptions, parse_size  # deferred: the writer loads Pillow and numpy

    return ConvertOptions(
        split=args.split or "train",
        shard_size=parse_size(args.shard_size),
        samples_per_shard=args.samples_per_shard or None,
        min_shards=args.min_shards,
        shuffle=not args.no_shuffle,
        seed=args.seed,
        check=args.check,
        max_side=args.max_side,
        quality=args.quality,
        max_pixels=args.max_pixels,
        max_image_bytes=parse_size(args.max_image_bytes),
        follow_symlinks=not args.no_follow_symlinks,
        num_classes=args.num_classes,
        strict=args.strict,
        overwrite=args.overwrite,
        workers=args.workers,
        fsync=not args.no_fsync,
        progress=not args.quiet,
        engine=args.engine,
        ray_address=args.ray_address,
        allow_empty=args.allow_empty,
        image_format=args.image_format,
        metadata=args.metadata,
        raw_pixels=args.raw_pixels,
        raw_side=args.raw_side,
        chunk=args.chunk,
    )


def run(args: argparse.Namespace) -> int:
    """Convert; print each split's summary on stderr. ``EXIT_SKIPPED`` when inputs were skipped."""
    from shardify.convert.write import run as convert_run  # deferred: the writer loads Pillow and numpy

    if args.kind == "ids" and args.split is not None:
        raise UsageError("convert ids takes its splits from --partition; --split is not used there")
    if args.kind == "python":
        result = _convert_python(args)
    elif args.kind == "tokens":
        result = convert_tokens.convert(args)
    else:
        options = convert_options(args)
        if args.kind == "imagefolder":
            result = convert_run.convert_imagefolder(args.src, args.out, options=options)
        elif args.kind == "ids":
            result = convert_run.convert_ids(
                args.src,
                args.out,
                partition=args.partition,
                labels=args.labels,
                options=options,
                pt_to_npy=args.pt_to_npy,
            )
        else:
            result = convert_run.convert_listing(args.src, args.out, root=args.root, fmt=args.fmt, options=options)
    for s in result.splits.values():
        reused = f", {s.reused_shards} reused" if s.reused_shards else ""
        ignored = sum(s.ignored.values())
        print(
            f"{s.split}: {count(s.samples, 'sample')} in {count(s.shards, 'shard')} ({human(s.bytes)}{reused}) "
            f"in {s.seconds:.1f} s; {len(s.skipped)} skipped, {ignored} ignored",
            file=sys.stderr,
        )
        for note in s.notes:
            print(f"  note: {note}", file=sys.stderr)
        for n in s.noted[:3]:
            print(f"  note: {n.path}: {n.reason}", file=sys.stderr)
        if len(s.noted) > 3:
            print(f"  ... {count(len(s.noted) - 3, 'more input')} with decoder warnings", file=sys.stderr)
        for p in s.skipped[:10]:
            print(f"  skipped {p.path}: {p.reason}", file=sys.stderr)
        if len(s.skipped) > 10:
            print(f"  ... {len(s.skipped) - 10} more", file=sys.stderr)
        if s.skipped or ignored or s.noted:
            print(f"  report: {args.out}/{s.split}.report.jsonl", file=sys.stderr)
    return EXIT_SKIPPED if result.num_skipped else EXIT_OK


def add_parser(sub: Any) -> None:
    """Add ``convert`` and its kinds to the subcommands ``sub``."""
    conv = sub.add_parser(
        "convert",
        help="convert a dataset into shards",
        description="Convert a dataset into shards.",
        epilog=_EXAMPLES["convert"],
        formatter_class=FORMATTER,
    )
    conv.set_defaults(run=run)
    kinds = conv.add_subparsers(dest="kind", required=True, metavar="KIND")
    p = kinds.add_parser(
        "imagefolder", help="SRC/<class>/<image> folders", epilog=_EXAMPLES["imagefolder"], formatter_class=FORMATTER
    )
    p.add_argument("src", metavar="SRC")
    p.add_argument("out", metavar="OUT")
    _common(p)
    p = kinds.add_parser("ids", help="ID-labelled files SRC/<id>.*", epilog=_EXAMPLES["ids"], formatter_class=FORMATTER)
    p.add_argument("src", metavar="SRC")
    p.add_argument("out", metavar="OUT")
    p.add_argument("--partition", required=True, help="JSON {split: [ids]}")
    p.add_argument("--labels", required=True, help="JSON {id: label}")
    p.add_argument(
        "--pt-to-npy",
        action="store_true",
        help="store each .pt/.pth tensor file as .npy (field 'npy'): decoded ~80x faster than torch.load; "
        "loaded with weights_only=True, a file holding anything but one tensor is skipped",
    )
    _common(p, split=False)
    p = kinds.add_parser(
        "listing", help="a CSV or JSONL listing", epilog=_EXAMPLES["listing"], formatter_class=FORMATTER
    )
    p.add_argument("src", metavar="FILE")
    p.add_argument("out", metavar="OUT")
    p.add_argument("--root", default=None, help="folder the listing's paths are relative to (default: the listing's)")
    p.add_argument("--format", dest="fmt", choices=("csv", "jsonl"), default=None, help="default: from the extension")
    _common(p)
    p = kinds.add_parser(
        "python",
        help="FUNCTION(item) for each row of a JSONL file",
        epilog=_EXAMPLES["python"],
        formatter_class=FORMATTER,
    )
    p.add_argument("function", metavar="MODULE:FUNCTION")
    p.add_argument("src", metavar="ITEMS.jsonl")
    p.add_argument("out", metavar="OUT")
    _python_args(p)
    convert_tokens.add_parser(kinds)
