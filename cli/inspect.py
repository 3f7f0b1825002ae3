"""``shardify info``, ``verify``, ``keys`` and ``show``: look at a finished dataset without training on it."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from shardify.cli.common import EXIT_OK, EXIT_SKIPPED, FORMATTER, count, human, split_source

__all__ = [
    "add_parsers",
    "run_info",
    "run_verify",
    "run_keys",
    "run_show",
    "labels_text",
    "field_bytes_text",
    "CHUNK_ADVICE_SHARE",
]

_EXAMPLES = {
    "info": """examples:
  shardify info out/imagenet
  shardify info out/imagenet --json | jq '.splits.train.samples'

Bytes per sample by field come from the headers of a few shards of each split (--sample-shards;
local datasets only unless given), tar headers and padding apart: what one member per field
costs, and what a layout storing a field of many samples in one member would save.""",
    "verify": """examples:
  shardify verify out/imagenet
  shardify verify out/imagenet --split validation --decode

Exit code 3 when a problem is found (each one printed with its shard and key).""",
    "keys": """examples:
  shardify keys out/imagenet --split validation
  shardify keys out/imagenet --split train | wc -l

One key per line, in stored order (shard order, then tar order): the order of an unshuffled
epoch. Only tar headers are read (and chunked shards' key lists); no sample is decoded.""",
    "show": """examples:
  shardify show out/imagenet --split validation -o sheet.png
  shardify show out/imagenet --split train --augment --views 4 -n 16 -o train-views.png

Each cell: the stored image with its key and label (class name and index); with --augment,
then the training transform's output for epochs 0, 1, ... side by side. A split without
images prints a text summary of its samples instead.""",
}

CHUNK_ADVICE_SHARE = 0.10
"""``info`` advises ``--chunk N`` when tar headers and padding are at least this share of the
shard bytes. Chunking saves most of that share (about 1 KB per member of a small sample) but
gives up reading the shards sample by sample with other tools than shardify; under a tenth
(samples above about 15 KB: 78 KB JPEGs pay 3.4%) the saving does not pay for that."""

_SAMPLE_SHARDS = 2
"""Shards per split whose headers ``info`` reads for the bytes per field, by default."""


def run_info(args: argparse.Namespace) -> int:
    from shardify.convert.verify import dataset_info  # deferred: the writer loads Pillow and numpy

    shards = args.sample_shards
    if shards is None:  # remote shards would be downloaded for it: only when asked
        text = str(args.dataset)
        shards = 0 if "://" in text and not text.startswith("file://") else _SAMPLE_SHARDS
    info = dataset_info(args.dataset, sample_shards=shards)
    if args.json:
        print(json.dumps(info, indent=1))
        return EXIT_OK
    print(f"{info['path']} (format {info['format_version']})")
    for split, s in info["splits"].items():
        print(
            f"  {split}: {count(s['samples'], 'sample')}, {count(s['shards'], 'shard')}, {human(s['bytes'])}, "
            f"{labels_text(s)}; fields {', '.join(s['fields'])}"
        )
        if s.get("chunk"):
            print(f"    chunked: {s['chunk']} samples a chunk (format 3; other readers see one sample per chunk)")
        if s.get("tokens"):
            t = s["tokens"]
            print(
                f"    tokens: {t['num_tokens']:,} in {count(s['samples'], 'document')} ({t['dtype']}, "
                f"vocabulary {t['vocab_size']}, end-of-document id {t['eos']}), field {t['field']}"
            )
        if s.get("raw_pixels"):
            raw = s["raw_pixels"]
            print(
                f"    images pre-decoded: field {raw['field']} ({raw['format']} v{raw['version']}), "
                f"{raw['side']} side at most {raw['size']} pixels"
            )
        if s["skipped"]:
            print(f"    skipped at conversion: {s['skipped']}")
        if "field_bytes" in s:
            print(field_bytes_text(s["field_bytes"], indent="    "))
        elif "field_bytes_error" in s:
            print(f"    bytes per field: not measured: {s['field_bytes_error']} (shardify verify checks every shard)")
        elif args.sample_shards is None:
            print("    bytes per field: not measured for a remote dataset (--sample-shards N reads N shards' headers)")
    return EXIT_OK


def labels_text(s: dict[str, Any]) -> str:
    """``10 classes (cat, dog, ...)``, or for int labels ``10 int labels: 0..9``."""
    if s["classes"]:
        names = ", ".join(s["class_names"][:5]) + (", ..." if s["classes"] > 5 else "")
        return f"{s['classes']} classes ({names})"
    labels = s.get("labels")
    if not labels:
        return "no labels" if "cls" not in s["fields"] else _unsummarised_labels(s.get("converter") or {})
    counts = labels.get("counts") or {}
    seen = [int(k) for k in counts]
    if seen and seen == list(range(seen[0], seen[-1] + 1)):
        shown = f"{seen[0]}..{seen[-1]}"
    elif seen:
        shown = ", ".join(map(str, seen[:8])) + (", ..." if len(seen) > 8 else "")
    else:
        shown = f"{labels['min']}..{labels['max']}, not all present"
    return f"{labels['distinct']} int labels: {shown}"


def _unsummarised_labels(converter: dict[str, Any]) -> str:
    """A ``cls`` field whose values the split index does not summarise: why, from who wrote it."""
    if str(converter.get("source", "")).startswith("python"):  # ShardWriter, convert_items: any value
        return "a cls field (written from Python: its values are not summarised in the index)"
    return f"int labels (not recorded by converter version {converter.get('version', 'unknown')})"


def _bytes(n: float) -> str:
    return f"{n:.0f} B" if n < 1000 else human(n)


def field_bytes_text(fb: dict[str, Any], *, indent: str = "") -> str:
    """The table of :func:`~shardify.convert.fieldsizes.field_bytes` (as JSON): one row per field."""
    fields = fb["fields"]
    rows = [("field", "data", "tar headers", "padding", "in samples")]
    for name, f in fields.items():
        rows.append((name, _bytes(f["data"]), _bytes(f["headers"]), _bytes(f["padding"]), f"{100 * f['present']:.0f}%"))
    data = sum(f["data"] for f in fields.values())
    framing = sum(f["headers"] + f["padding"] for f in fields.values())
    rows.append(
        (
            "all",
            _bytes(data),
            _bytes(sum(f["headers"] for f in fields.values())),
            _bytes(sum(f["padding"] for f in fields.values())),
            "",
        )
    )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"{indent}bytes per sample by field, from the {fb['source']}:"]
    lines += [
        (
            indent + "  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
        ).rstrip()
        for r in rows
    ]
    total = data + framing
    if total:
        share = framing / total
        if fb.get("chunk"):
            hint = "already one member per field per chunk"
        elif share >= CHUNK_ADVICE_SHARE:
            hint = "one member per field for many samples, --chunk N, would save most of it"
        else:
            hint = (
                f"under {100 * CHUNK_ADVICE_SHARE:.0f}%: --chunk would save little, and other readers than "
                "shardify see one sample per chunk; keep one member per sample"
            )
        lines.append(
            f"{indent}  tar headers and padding: {100 * framing / total:.1f}% of the shard bytes "
            f"({_bytes(framing)} per sample; {hint})"
        )
    return "\n".join(lines)


def run_verify(args: argparse.Namespace) -> int:
    from shardify.convert.verify import verify_dataset  # deferred: the writer loads Pillow and numpy

    report = verify_dataset(
        args.dataset,
        splits=args.split,
        decode=args.decode,
        progress=not args.quiet,
        allow_locations=tuple(args.allow_location or ()),
    )
    if args.json:
        print(
            json.dumps(
                {"ok": report.ok, "checked": report.checked, "problems": [str(p) for p in report.problems]}, indent=1
            )
        )
    else:
        for split, c in report.checked.items():
            print(f"{split}: {count(c['shards'], 'shard')}, {count(c['samples'], 'sample')} checked")
        for p in report.problems:
            print(f"problem: {p}")
        print("ok" if report.ok else count(len(report.problems), "problem"))
    return EXIT_OK if report.ok else EXIT_SKIPPED


def run_keys(args: argparse.Namespace) -> int:
    from shardify.reader.splitkeys import split_keys  # deferred: the reader imports torch

    out = sys.stdout
    for key in split_keys(split_source(args.dataset, args.split)):
        out.write(key + "\n")
    return EXIT_OK


def run_show(args: argparse.Namespace) -> int:
    from shardify.reader.sample import transforms as T  # deferred: the reader loads torch
    from shardify.reader.show import contact_sheet  # deferred: the reader loads torch

    source = split_source(args.dataset, args.split)
    transform = T.imagenet_train(args.size) if args.augment else None
    sheet = contact_sheet(source, n=args.n, transform=transform, views=args.views, tile=args.tile, seed=args.seed)
    print(sheet.text)
    if sheet.image is None:
        print("shardify: no images in this split: printed a text summary, wrote no picture", file=sys.stderr)
        return EXIT_OK
    sheet.save(args.output)
    print(f"wrote {args.output} ({sheet.image.width}x{sheet.image.height})")
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    """Add ``info``, ``verify``, ``keys`` and ``show`` to the subcommands ``sub``."""
    p = sub.add_parser(
        "info",
        help="describe a dataset: splits, samples, shards, bytes per field, classes",
        epilog=_EXAMPLES["info"],
        formatter_class=FORMATTER,
    )
    p.add_argument("dataset", metavar="DATASET")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--sample-shards",
        type=int,
        default=None,
        metavar="N",
        help=f"read the headers of N shards per split for bytes per field (default: {_SAMPLE_SHARDS}, "
        "0 for a remote dataset; 0: skip)",
    )
    p.set_defaults(run=run_info)
    p = sub.add_parser(
        "verify",
        help="check checksums, counts and naming of every shard",
        epilog=_EXAMPLES["verify"],
        formatter_class=FORMATTER,
    )
    p.add_argument("dataset", metavar="DATASET")
    p.add_argument("--split", action="append", default=None, help="only this split (repeatable)")
    p.add_argument("--decode", action="store_true", help="also decode every image and parse every label")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar (none either when stderr is not a terminal)")
    p.add_argument(
        "--allow-location",
        action="append",
        default=None,
        metavar="PREFIX",
        help="also read files under this path or URL prefix, outside the dataset's folder (repeatable; "
        "by default a manifest or index that names one is a problem)",
    )
    p.set_defaults(run=run_verify)
    p = sub.add_parser(
        "keys",
        help="list a split's sample keys, one per line, in stored order",
        epilog=_EXAMPLES["keys"],
        formatter_class=FORMATTER,
    )
    p.add_argument("dataset", metavar="DATASET")
    p.add_argument("--split", default=None, help="default: the only split, or train")
    p.set_defaults(run=run_keys)
    p = sub.add_parser(
        "show",
        help="draw samples of a dataset into a PNG contact sheet (labels, keys, augmentation)",
        epilog=_EXAMPLES["show"],
        formatter_class=FORMATTER,
    )
    p.add_argument("dataset", metavar="DATASET")
    p.add_argument("--split", default=None, help="default: the only split, or train")
    p.add_argument("-n", type=int, default=64, help="samples to show, spread over the split (default: 64)")
    p.add_argument("-o", "--output", default="sheet.png", help="PNG to write (default: sheet.png)")
    p.add_argument(
        "--augment",
        action="store_true",
        help="also show the training transform's views (RandomResizedCrop --size + flip)",
    )
    p.add_argument("--views", type=int, default=4, help="augmented views per sample with --augment (default: 4)")
    p.add_argument("--size", type=int, default=224, help="crop size of the augmentation (default: 224)")
    p.add_argument("--tile", type=int, default=128, help="pixels per image in the sheet (default: 128)")
    p.add_argument("--seed", type=int, default=0, help="seed of the augmentation, as in training (default: 0)")
    p.set_defaults(run=run_show)
