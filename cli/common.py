"""What every command of the ``shardify`` CLI shares: exit codes, the usage error, sizes and counts for people."""

from __future__ import annotations

import argparse
import os
from typing import Any

from shardify.errors import SplitRequiredError

__all__ = [
    "EXIT_OK",
    "EXIT_ERROR",
    "EXIT_USAGE",
    "EXIT_SKIPPED",
    "UsageError",
    "human",
    "count",
    "FORMATTER",
    "split_source",
    "engine_args",
]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_SKIPPED = 0, 1, 2, 3
"""0 done; 1 error (nothing marked finished); 2 bad usage; 3 done, but some inputs were skipped
(listed in ``{split}.report.jsonl``) or ``verify`` found problems."""

FORMATTER = argparse.RawDescriptionHelpFormatter
"""Every parser's formatter: examples in epilogs keep their lines."""


class UsageError(Exception):
    """Options that parse but do not go together; ``main`` prints it and exits with ``EXIT_USAGE``."""


def human(n: float) -> str:
    """``n`` bytes for people, in powers of 1000: ``512 B``, ``1.5 MB``."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n}"


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: ``1 shard``, ``2 shards``, ``0 samples``."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def split_source(dataset: str | os.PathLike[str], split: str | None) -> Any:
    """The reader's :class:`~shardify.reader.io.sources.Source` of ``split``, else of the only
    split, else of ``train`` when there is one (``--split``'s default for reading commands)."""
    from shardify.reader.io.sources import resolve_source  # deferred: the reader loads torch

    try:
        return resolve_source(dataset, split=split)
    except SplitRequiredError as e:
        if split is not None or "train" not in e.splits:
            raise
        return resolve_source(dataset, split="train")


def engine_args(group: Any) -> None:
    """The options every ``convert`` kind ends its "run" group with: where the work runs
    (``--engine``, ``--ray-address``), ``--quiet`` and ``--no-fsync``."""
    group.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local: a process pool (default); ray: Ray tasks (pip install 'shardify[ray]')",
    )
    group.add_argument(
        "--ray-address", default=None, help="Ray cluster to join (default: start a local Ray for the run)"
    )
    group.add_argument("--quiet", action="store_true", help="no progress bar")
    group.add_argument(
        "--no-fsync", action="store_true", help="do not fsync shards before renaming them (faster, less safe)"
    )
