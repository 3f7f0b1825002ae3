"""The ``shardify`` command: parse arguments, call the library, map errors to exit codes.

Exit codes: 0 done; 1 error (nothing marked finished); 2 bad usage; 3 done, but some
inputs were skipped as bad (listed in ``{split}.report.jsonl``) or ``verify`` found problems.
Importing this module does not import torch: only ``bench`` and ``show`` load the reader.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from shardify import __version__
from shardify.errors import ShardifyError, SplitRequiredError

__all__ = ["main", "entrypoint", "EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_SKIPPED"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_SKIPPED = 0, 1, 2, 3

_EXAMPLES = {
    "shardify": """examples:
  shardify convert imagefolder ~/data/imagenet/train out/imagenet --split train
  shardify info out/imagenet
  shardify verify out/imagenet
  shardify bench out/imagenet --split train
  shardify show out/imagenet --split validation -o sheet.png

`shardify COMMAND --help` shows each command's options and examples.""",
    "convert": """examples:
  shardify convert imagefolder ~/data/imagenet/train out/imagenet --split train
  shardify convert ids data/ out/mydata --partition partition.json --labels labels.json
  shardify convert listing train.jsonl out/mydata
  shardify convert python mymodule:make_sample items.jsonl out/tokens

`shardify convert KIND --help` shows each kind's options and examples.""",
    "info": """examples:
  shardify info out/imagenet
  shardify info out/imagenet --json | jq '.splits.train.samples'""",
    "verify": """examples:
  shardify verify out/imagenet
  shardify verify out/imagenet --split validation --decode

Exit code 3 when a problem is found (each one printed with its shard and key).""",
    "bench": """examples:
  shardify bench out/imagenet --split train --workers 8 --batch-size 256
  shardify bench out/imagenet --no-webdataset --epochs 3 --json

A split without images is measured for reading only (the output says what is not measured).""",
    "gc": """examples:
  shardify gc out/imagenet --dry-run
  shardify gc out/imagenet

Run it when no reader still uses an earlier version (a reader whose version is gone raises
DatasetVersionError naming both versions; it never reads wrong samples).""",
    "show": """examples:
  shardify show out/imagenet --split validation -o sheet.png
  shardify show out/imagenet --split train --augment --views 4 -n 16 -o train-views.png

Each cell: the stored image with its key and label (class name and index); with --augment,
then the training transform's output for epochs 0, 1, ... side by side. A split without
images prints a text summary of its samples instead.""",
    "imagefolder": """example:
  shardify convert imagefolder ~/data/imagenet/train out/imagenet --split train
  shardify convert imagefolder ~/data/imagenet/val   out/imagenet --split validation

SRC/<class>/**/<image>: classes are the sorted folder names (torchvision's ImageFolder
labels); hidden files and folders are skipped, non-image files are counted and reported.""",
    "ids": """example:
  shardify convert ids data/ out/mydata --partition partition.json --labels labels.json

partition.json: {"train": ["id1", "id2"], "validation": ["id3"]}
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


def _common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--split", default=None,
                   help="split name (default: train; listing: for rows without a split; ids: not used)")
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
    g.add_argument("--allow-empty", action="store_true",
                   help="finish a split even if every input was skipped (default: that is an error, exit 1)")
    g = p.add_argument_group("checks")
    g.add_argument("--check", choices=("header", "full"), default="header",
                   help="header: format, size, mode and completeness (default); full: decode every image")
    g.add_argument("--strict", action="store_true", help="stop at the first bad input instead of skipping it")
    g.add_argument("--max-pixels", type=int, default=None,
                   help="decompression-bomb limit in pixels (default: Pillow's, about 89 M)")
    g.add_argument("--max-image-bytes", default="1GiB",
                   help="image files larger than this are reported as too large, unread (default: 1GiB)")
    g.add_argument("--no-follow-symlinks", action="store_true", help="ignore symbolic links in the source tree")
    g.add_argument("--num-classes", type=int, default=None, help="int labels must be below this")
    g = p.add_argument_group("transcode")
    g.add_argument("--max-side", type=int, default=None,
                   help="downscale images whose longer side exceeds this and re-encode them as JPEG")
    g.add_argument("--image-format", choices=("keep", "jpg", "png"), default="keep",
                   help="keep: each image in its own format (default); jpg: re-encode the others as JPEG "
                        "(lossy, at --quality); png: re-encode the others as PNG (lossless, larger). "
                        "One image field for readers that take a single extension (Hugging Face datasets)")
    g.add_argument("--quality", type=int, default=90, help="JPEG quality with --max-side and --image-format jpg (default: 90)")
    g = p.add_argument_group("run")
    g.add_argument("--workers", type=int, default=0, help="worker processes (default: one per core)")
    g.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: a process pool (default); ray: Ray tasks (pip install 'shardify[ray]')")
    g.add_argument("--ray-address", default=None,
                   help="Ray cluster to join (default: start a local Ray for the run)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g.add_argument("--no-fsync", action="store_true", help="do not fsync shards before renaming them (faster, less safe)")


def _python_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--split", default="train", help="split name (default: train)")
    g.add_argument("--shard-size", default="256MB", help="bound on shard size, with units: 64MB, 1GiB (default: 256MB)")
    g.add_argument("--samples-per-shard", type=int, default=None, help="bound on samples per shard (default: none)")
    g.add_argument("--shuffle", action="store_true", help="write the items in a seeded shuffle (default: file order)")
    g.add_argument("--seed", type=int, default=0, help="seed of --shuffle (default: 0)")
    g.add_argument("--classes", default=None, help="comma-separated names of the cls labels, or @FILE (one per line)")
    g.add_argument("--quality", type=int, default=95, help="JPEG/WebP quality of images given as arrays (default: 95)")
    g.add_argument("--overwrite", action="store_true", help="replace a split that is already finished in OUT")
    g.add_argument("--strict", action="store_true", help="stop at the first item whose function raises")
    g = p.add_argument_group("run")
    g.add_argument("--workers", type=int, default=0, help="worker processes (default: one per core)")
    g.add_argument("--chunk-size", type=int, default=32, help="items per worker task (default: 32)")
    g.add_argument("--item-timeout", type=float, default=None, metavar="SECONDS",
                   help="stop and report an item whose function runs longer (its worker is replaced)")
    g.add_argument("--max-worker-memory", default=None, metavar="SIZE",
                   help="stop and report an item on which a worker's memory grows past SIZE (512MiB, 2GB)")
    g.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: a process pool (default); ray: Ray tasks (pip install 'shardify[ray]')")
    g.add_argument("--ray-address", default=None, help="Ray cluster to join (default: start a local Ray for the run)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g.add_argument("--no-fsync", action="store_true", help="do not fsync shards before renaming them (faster, less safe)")


def _convert_python(args: argparse.Namespace) -> Any:
    from shardify.convert.pyapi.items import ItemsOptions, JsonlItems, convert_items, load_function
    from shardify.convert.options import parse_size
    from shardify.convert.write.run import ConvertResult
    from shardify.convert.pyapi.values import ValueOptions
    from shardify.errors import InputError

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
        split=args.split, shard_size=parse_size(args.shard_size), samples_per_shard=args.samples_per_shard,
        classes=classes, values=ValueOptions(quality=args.quality), overwrite=args.overwrite, fsync=not args.no_fsync,
        shuffle=args.shuffle, seed=args.seed, workers=args.workers, strict=args.strict, engine=args.engine,
        ray_address=args.ray_address, chunk_size=args.chunk_size, progress=not args.quiet,
        item_timeout=args.item_timeout, max_worker_memory=args.max_worker_memory)
    summary = convert_items(JsonlItems(args.src), load_function(args.function), args.out, options=options)
    return ConvertResult(out_dir=args.out, splits={summary.split: summary})


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="shardify", description="Pack datasets into tar shards; stream them into PyTorch.",
                                     epilog=_EXAMPLES["shardify"], formatter_class=fmt)
    parser.add_argument("--version", action="version", version=f"shardify {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    conv = sub.add_parser("convert", help="convert a dataset into shards", description="Convert a dataset into shards.",
                          epilog=_EXAMPLES["convert"], formatter_class=fmt)
    kinds = conv.add_subparsers(dest="kind", required=True, metavar="KIND")
    p = kinds.add_parser("imagefolder", help="SRC/<class>/<image> folders", epilog=_EXAMPLES["imagefolder"], formatter_class=fmt)
    p.add_argument("src", metavar="SRC")
    p.add_argument("out", metavar="OUT")
    _common(p)
    p = kinds.add_parser("ids", help="ID-labelled files SRC/<id>.*", epilog=_EXAMPLES["ids"], formatter_class=fmt)
    p.add_argument("src", metavar="SRC")
    p.add_argument("out", metavar="OUT")
    p.add_argument("--partition", required=True, help="JSON {split: [ids]}")
    p.add_argument("--labels", required=True, help="JSON {id: label}")
    p.add_argument("--pt-to-npy", action="store_true",
                   help="store each .pt/.pth tensor file as .npy (field 'npy'): decoded ~80x faster than torch.load; "
                        "loaded with weights_only=True, a file holding anything but one tensor is skipped")
    _common(p)
    p = kinds.add_parser("listing", help="a CSV or JSONL listing", epilog=_EXAMPLES["listing"], formatter_class=fmt)
    p.add_argument("src", metavar="FILE")
    p.add_argument("out", metavar="OUT")
    p.add_argument("--root", default=None, help="folder the listing's paths are relative to (default: the listing's)")
    p.add_argument("--format", dest="fmt", choices=("csv", "jsonl"), default=None, help="default: from the extension")
    _common(p)
    p = kinds.add_parser("python", help="FUNCTION(item) for each row of a JSONL file", epilog=_EXAMPLES["python"],
                         formatter_class=fmt)
    p.add_argument("function", metavar="MODULE:FUNCTION")
    p.add_argument("src", metavar="ITEMS.jsonl")
    p.add_argument("out", metavar="OUT")
    _python_args(p)
    p = sub.add_parser("info", help="describe a dataset: splits, samples, shards, bytes, classes",
                       epilog=_EXAMPLES["info"], formatter_class=fmt)
    p.add_argument("dataset", metavar="DATASET")
    p.add_argument("--json", action="store_true", help="print JSON")
    p = sub.add_parser("verify", help="check checksums, counts and naming of every shard",
                       epilog=_EXAMPLES["verify"], formatter_class=fmt)
    p.add_argument("dataset", metavar="DATASET")
    p.add_argument("--split", action="append", default=None, help="only this split (repeatable)")
    p.add_argument("--decode", action="store_true", help="also decode every image and parse every label")
    p.add_argument("--json", action="store_true", help="print JSON")
    p = sub.add_parser("gc", help="remove earlier versions of a dataset's splits, once no reader uses them",
                       description="Remove the files of earlier versions of each split (kept by `convert "
                                   "--overwrite` for readers that opened them) and leftovers of killed runs. "
                                   "A reader still on a removed version raises DatasetVersionError.",
                       epilog=_EXAMPLES["gc"], formatter_class=fmt)
    p.add_argument("dataset", metavar="OUT")
    p.add_argument("--dry-run", action="store_true", help="list what would be removed")
    p = sub.add_parser("bench", help="measure reading speed of a dataset (decode + augment + batch)",
                       epilog=_EXAMPLES["bench"], formatter_class=fmt)
    p.add_argument("dataset", metavar="DATASET")
    p.add_argument("--split", default=None, help="default: the only split, or train")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers (default: 2)")
    p.add_argument("--epochs", type=int, default=5, help="epochs to stream (default: 5)")
    p.add_argument("--size", type=int, default=224, help="crop size of RandomResizedCrop (default: 224)")
    p.add_argument("--no-webdataset", action="store_true", help="skip the side-by-side webdataset run")
    p.add_argument("--fast-decode", action="store_true",
                   help="decode JPEGs with libjpeg-turbo's fast IDCT and upsampling in (a) and (b) "
                        "(the fast-vs-exact ratio and pixel difference are always reported)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p = sub.add_parser("show", help="draw samples of a dataset into a PNG contact sheet (labels, keys, augmentation)",
                       epilog=_EXAMPLES["show"], formatter_class=fmt)
    p.add_argument("dataset", metavar="DATASET")
    p.add_argument("--split", default=None, help="default: the only split, or train")
    p.add_argument("-n", type=int, default=64, help="samples to show, spread over the split (default: 64)")
    p.add_argument("-o", "--output", default="sheet.png", help="PNG to write (default: sheet.png)")
    p.add_argument("--augment", action="store_true",
                   help="also show the training transform's views (RandomResizedCrop --size + flip)")
    p.add_argument("--views", type=int, default=4, help="augmented views per sample with --augment (default: 4)")
    p.add_argument("--size", type=int, default=224, help="crop size of the augmentation (default: 224)")
    p.add_argument("--tile", type=int, default=128, help="pixels per image in the sheet (default: 128)")
    p.add_argument("--seed", type=int, default=0, help="seed of the augmentation, as in training (default: 0)")
    return parser


def _options(args: argparse.Namespace) -> Any:
    from shardify.convert.options import ConvertOptions, parse_size

    return ConvertOptions(
        split=args.split or "train", shard_size=parse_size(args.shard_size), samples_per_shard=args.samples_per_shard or None,
        min_shards=args.min_shards,
        shuffle=not args.no_shuffle, seed=args.seed, check=args.check, max_side=args.max_side,
        quality=args.quality, max_pixels=args.max_pixels, max_image_bytes=parse_size(args.max_image_bytes),
        follow_symlinks=not args.no_follow_symlinks,
        num_classes=args.num_classes, strict=args.strict, overwrite=args.overwrite, workers=args.workers,
        fsync=not args.no_fsync, progress=not args.quiet, engine=args.engine, ray_address=args.ray_address,
        allow_empty=args.allow_empty, image_format=args.image_format, metadata=args.metadata)


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n}"


def _convert(args: argparse.Namespace) -> int:
    from shardify.convert.write import run

    if args.kind == "ids" and args.split is not None:
        print("shardify: error: convert ids takes its splits from --partition; --split is not used there",
              file=sys.stderr)
        return EXIT_USAGE
    options = _options(args) if args.kind != "python" else None
    if args.kind == "python":
        result = _convert_python(args)
    elif args.kind == "imagefolder":
        result = run.convert_imagefolder(args.src, args.out, options=options)
    elif args.kind == "ids":
        result = run.convert_ids(args.src, args.out, partition=args.partition, labels=args.labels, options=options,
                                 pt_to_npy=args.pt_to_npy)
    else:
        result = run.convert_listing(args.src, args.out, root=args.root, fmt=args.fmt, options=options)
    for s in result.splits.values():
        reused = f", {s.reused_shards} reused" if s.reused_shards else ""
        ignored = sum(s.ignored.values())
        print(f"{s.split}: {s.samples} samples in {s.shards} shards ({_human(s.bytes)}{reused}) "
              f"in {s.seconds:.1f} s; {len(s.skipped)} skipped, {ignored} ignored", file=sys.stderr)
        for note in s.notes:
            print(f"  note: {note}", file=sys.stderr)
        for n in s.noted[:3]:
            print(f"  note: {n.path}: {n.reason}", file=sys.stderr)
        if len(s.noted) > 3:
            print(f"  ... {len(s.noted) - 3} more inputs with decoder warnings", file=sys.stderr)
        for p in s.skipped[:10]:
            print(f"  skipped {p.path}: {p.reason}", file=sys.stderr)
        if len(s.skipped) > 10:
            print(f"  ... {len(s.skipped) - 10} more", file=sys.stderr)
        if s.skipped or ignored or s.noted:
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
        print(f"  {split}: {s['samples']} samples, {s['shards']} shards, {_human(s['bytes'])}, "
              f"{_labels_text(s)}; fields {', '.join(s['fields'])}")
        if s["skipped"]:
            print(f"    skipped at conversion: {s['skipped']}")
    return EXIT_OK


def _labels_text(s: dict[str, Any]) -> str:
    """``10 classes (cat, dog, ...)``, or for int labels ``10 int labels: 0..9``."""
    if s["classes"]:
        names = ", ".join(s["class_names"][:5]) + (", ..." if s["classes"] > 5 else "")
        return f"{s['classes']} classes ({names})"
    labels = s.get("labels")
    if not labels:
        return "no labels" if "cls" not in s["fields"] else "int labels (not recorded by this converter version)"
    counts = labels.get("counts") or {}
    seen = [int(k) for k in counts]
    if seen and seen == list(range(seen[0], seen[-1] + 1)):
        shown = f"{seen[0]}..{seen[-1]}"
    elif seen:
        shown = ", ".join(map(str, seen[:8])) + (", ..." if len(seen) > 8 else "")
    else:
        shown = f"{labels['min']}..{labels['max']}, not all present"
    return f"{labels['distinct']} int labels: {shown}"


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


def _gc(args: argparse.Namespace) -> int:
    from shardify.convert.write.versions import collect_garbage

    result = collect_garbage(args.dataset, dry_run=args.dry_run)
    for name in result.removed:
        print(f"{'would remove' if args.dry_run else 'removed'} {name}")
    for split, version in result.kept_in_progress.items():
        print(f"kept {split} version {version}: an unfinished conversion (rerun it to finish)")
    print(f"{'would remove' if args.dry_run else 'removed'} {len(result.removed)} files ({_human(result.bytes)})")
    return EXIT_OK


def _bench(args: argparse.Namespace) -> int:
    from shardify.reader.bench import format_bench, run_bench

    result = run_bench(args.dataset, split=args.split, batch_size=args.batch_size, num_workers=args.workers,
                       epochs=args.epochs, image_size=args.size, compare_webdataset=not args.no_webdataset,
                       fast_decode=args.fast_decode)
    print(json.dumps(result, indent=1, default=str) if args.json else format_bench(result))
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    from shardify.reader.bench import bench_source
    from shardify.reader.sample import transforms as T
    from shardify.reader.show import contact_sheet

    source = bench_source(args.dataset, args.split)
    transform = T.imagenet_train(args.size) if args.augment else None
    sheet = contact_sheet(source, n=args.n, transform=transform, views=args.views, tile=args.tile, seed=args.seed)
    print(sheet.text)
    if sheet.image is None:
        print("shardify: no images in this split: printed a text summary, wrote no picture", file=sys.stderr)
        return EXIT_OK
    sheet.save(args.output)
    print(f"wrote {args.output} ({sheet.image.width}x{sheet.image.height})")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv``; return the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    commands = {"convert": _convert, "info": _info, "verify": _verify, "gc": _gc, "bench": _bench, "show": _show}
    try:
        code = commands[args.command](args)
        sys.stdout.flush()  # here, so a closed pipe is met inside the try
        return code
    except BrokenPipeError:  # `shardify info --json | head`: the reader left; stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush cannot fail again
        return 128 + 13  # what a tool killed by SIGPIPE returns
    except SplitRequiredError as e:
        print(f"shardify: error: {e.where}: it has several splits ({', '.join(e.splits)}); choose one with --split",
              file=sys.stderr)
        return EXIT_USAGE
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
