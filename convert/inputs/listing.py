"""Scan a CSV or JSONL listing: one row per sample, for data that is not one file per sample.

Columns: ``path`` (a file, relative to the listing's folder or ``root``) and/or ``id``
(the key's source when given), ``label`` (int or name; optional for the whole listing),
``split`` (optional; default the ``split`` option), and any other column as an inline
field: ``text`` becomes ``{key}.txt``, another string column ``c`` becomes ``{key}.c.txt``,
and a non-string JSON value becomes ``{key}.c.json``. Empty CSV cells are absent fields.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from shardify.convert.inputs import listing_pool
from shardify.convert.inputs.inputs import Ignored, Scan, SpecTable
from shardify.convert.inputs.labels import LabelSpace, label_space
from shardify.convert.inputs.listing_rows import TwoPasses, inline_ext, read_rows, scan_rows
from shardify.errors import InputError, KeyRuleError

__all__ = ["scan_listing", "scan_rows", "inline_ext"]


def scan_listing(
    listing: str | os.PathLike[str],
    *,
    root: str | os.PathLike[str] | None = None,
    default_split: str = "train",
    fmt: str | None = None,
    num_classes: int | None = None,
    workers: int = 0,
) -> dict[str, Scan]:
    """One Scan per split named in the listing (or ``default_split``), in order of first use.

    A big JSONL listing (:data:`POOL_MIN_BYTES`) is read by ``workers`` forked processes
    (0: one per core), a part of its lines each (:mod:`~shardify.convert.inputs.listing_pool`);
    the scan is the same with any number."""
    path = Path(listing)
    if fmt is None:
        fmt = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}.get(path.suffix.lower())
        if fmt is None:
            raise InputError("listing should end in .csv or .jsonl (or pass --format)", path=str(path))
    if fmt not in ("csv", "jsonl"):
        raise InputError(f"format {fmt!r} should be 'csv' or 'jsonl'", path=str(path))
    base = Path(root) if root is not None else path.parent
    # Int labels (or none), the usual case, take one streaming pass: a label's index is the
    # int itself. Label names are indexed in sorted order, so they take two: the first
    # finds the label space (over every split), the second makes the samples. A listing
    # that turns out not to fit one pass, or holds an error, is read again in two passes,
    # so that what it gives (or which error) never depends on the path taken.
    space = LabelSpace(classes=(), by_int=True, num_classes=num_classes)
    by_split: dict[str, tuple[SpecTable, list[Ignored]]] | None
    try:
        by_split = _samples(
            path, fmt, base=base, default_split=default_split, space=space, has_labels=None, workers=workers
        )
    except (TwoPasses, InputError, KeyRuleError):
        by_split = None  # (outside the handler, so that the traceback frees what the pass made)
    if by_split is None:
        seen = {"labels": False}

        def labels() -> Iterator[object]:
            for _, row in read_rows(path, fmt):
                if "label" in row:
                    seen["labels"] = True
                    yield row["label"]

        space = label_space(labels(), source=str(path), num_classes=num_classes)
        by_split = _samples(
            path, fmt, base=base, default_split=default_split, space=space, has_labels=seen["labels"], workers=workers
        )
    return {
        split: Scan(root=str(base), source="listing", samples=samples, classes=list(space.classes), problems=problems)
        for split, (samples, problems) in by_split.items()
    }


def _samples(
    path: Path,
    fmt: str,
    *,
    base: Path,
    default_split: str,
    space: LabelSpace,
    has_labels: bool | None,
    workers: int = 1,
) -> dict[str, tuple[SpecTable, list[Ignored]]]:
    """The samples and skipped rows of each split. ``has_labels`` None: the one-pass scan,
    with int labels, labelled or not as the first row is (else :class:`TwoPasses`)."""
    if listing_pool.pooled(path, fmt, workers):
        by_split = listing_pool.scan_parts(
            path, base=base, default_split=default_split, space=space, has_labels=has_labels, workers=workers
        )
        if by_split is not None:
            return by_split
    by_split = {}
    for split, n, sample in scan_rows(
        read_rows(path, fmt),
        path=path,
        base=base,
        default_split=default_split,
        space=space,
        has_labels=has_labels,
        one_pass=has_labels is None,
    ):
        entry = by_split.get(split)
        if entry is None:
            entry = by_split[split] = (SpecTable(), [])
        if type(sample) is str:
            entry[1].append(Ignored(f"{path.name}:{n}", sample))
        else:
            entry[0].append(sample)  # type: ignore[arg-type]
    return by_split
