"""``shardify gc OUT``: remove earlier versions of a dataset's splits once no reader uses them."""

from __future__ import annotations

import argparse
from typing import Any

from shardify.cli.common import EXIT_OK, FORMATTER, count, human

__all__ = ["add_parser", "run_gc"]

_EXAMPLES = """examples:
  shardify gc out/imagenet --dry-run
  shardify gc out/imagenet

Run it when no reader still uses an earlier version (a reader whose version is gone raises
DatasetVersionError naming both versions; it never reads wrong samples)."""


def run_gc(args: argparse.Namespace) -> int:
    """Remove (or with ``--dry-run`` list) what :func:`collect_garbage` finds."""
    from shardify.convert.write.versions import collect_garbage  # deferred: the writer loads Pillow and numpy

    result = collect_garbage(args.dataset, dry_run=args.dry_run)
    for name in result.removed:
        print(f"{'would remove' if args.dry_run else 'removed'} {name}")
    for split, version in result.kept_in_progress.items():
        print(f"kept {split} version {version}: an unfinished conversion (rerun it to finish)")
    print(
        f"{'would remove' if args.dry_run else 'removed'} {count(len(result.removed), 'file')} ({human(result.bytes)})"
    )
    return EXIT_OK


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "gc",
        help="remove earlier versions of a dataset's splits, once no reader uses them",
        description="Remove the files of earlier versions of each split (kept by `convert "
        "--overwrite` for readers that opened them) and leftovers of killed runs. "
        "A reader still on a removed version raises DatasetVersionError.",
        epilog=_EXAMPLES,
        formatter_class=FORMATTER,
    )
    p.add_argument("dataset", metavar="OUT")
    p.add_argument("--dry-run", action="store_true", help="list what would be removed")
    p.set_defaults(run=run_gc)
