"""Scan a big JSONL listing in worker processes, a part of its lines each, in order.

The file is cut into parts of about :data:`PART_BYTES` at line ends (after a ``\\n``, so a
part holds whole lines as text mode reads them); each forked worker reads its part, makes
its rows' samples (:func:`~shardify.convert.inputs.listing.scan_rows`, the rule of the
one-process scan) and returns them as :class:`SpecTable` records with the skipped rows
by line within the part; the driver appends them in file order, numbering lines on. The
one-pass rule's "labelled or not as the first row is" is read from the first row before
the parts start. Any error in a part (bad JSON, a bad split name, text that is not UTF-8)
sends the whole listing to the one-process scan, so the error raised, its line and its
wording are the same with any number of workers. CSV listings are read in one process
(a quoted cell may hold a newline, so a part cannot start at any line end).
"""

from __future__ import annotations

import io
import os
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from shardify.convert.executor import LocalExecutor
from shardify.convert.inputs.inputs import Ignored, SpecTable
from shardify.convert.inputs.labels import LabelSpace
from shardify.convert.inputs.listing_rows import json_rows, read_rows, scan_rows
from shardify.convert.options import worker_count
from shardify.errors import InputError, KeyRuleError

__all__ = ["pooled", "scan_parts", "POOL_MIN_BYTES", "PART_BYTES"]

POOL_MIN_BYTES = 16 << 20
"""JSONL listings smaller than this (about 200,000 rows) are read in one process."""
PART_BYTES = 2 << 20
"""Bytes of listing per worker task (a part ends at the first line end after this)."""

_Part = tuple[
    int,
    list[str],
    list[tuple[str, list[tuple[bytes, np.ndarray]], int, "Counter[int] | None"]],
    list[tuple[str, int, str]],
]
"""A part's ``(lines, splits in order of first use, [(split, record spans, payload bytes,
label counts)], [(split, line, reason)])``."""
_Job = tuple[Path, Path, str, LabelSpace, bool, bool]
"""``(listing, base, default split, label space, has labels, one pass)``, inherited through fork."""


class _PartFailed(Exception):
    """A part met an error: the one-process scan finds it again and raises it as it words it."""


def pooled(path: Path, fmt: str, workers: int) -> bool:
    """Whether the listing is read in parts by worker processes."""
    if fmt != "jsonl" or sys.platform != "linux" or worker_count(workers) < 2:
        return False
    try:
        return path.stat().st_size >= POOL_MIN_BYTES
    except OSError:
        return False  # the one-process scan says why it cannot be read


def scan_parts(
    path: Path, *, base: Path, default_split: str, space: LabelSpace, has_labels: bool | None, workers: int
) -> dict[str, tuple[SpecTable, list[Ignored]]] | None:
    """What the one-process scan gives, read in parts by ``workers`` processes; None: the
    listing has an error (or no row), for the one-process scan to raise."""
    one_pass = has_labels is None
    if one_pass:
        rows = read_rows(path, "jsonl")
        try:
            first = next(rows, None)
        except (InputError, KeyRuleError):
            return None
        finally:
            rows.close()
        if first is None:
            return None
        has_labels = "label" in first[1]
    bounds = _part_bounds(path)
    by_split: dict[str, tuple[SpecTable, list[Ignored]]] = {}
    lines_before = 0
    count = min(worker_count(workers), len(bounds))
    executor = LocalExecutor(workers=count, window=2 * count + 1, method="fork", what=f"scanning {path}")
    job = (path, base, default_split, space, bool(has_labels), one_pass)
    try:
        with executor:
            for _, (lines, splits, samples, problems) in executor.map(_scan_part, bounds, args=(job,)):
                for split in splits:
                    if split not in by_split:
                        by_split[split] = (SpecTable(), [])
                for split, spans, payload, labels in samples:
                    table = by_split[split][0]
                    for data, ends in spans:
                        table.extend_records(data, ends, payload, labels)
                        payload, labels = 0, Counter()
                for split, n, reason in problems:
                    by_split[split][1].append(Ignored(f"{path.name}:{lines_before + n}", reason))
                lines_before += lines
    except _PartFailed:
        return None
    return by_split


def _part_bounds(path: Path) -> list[tuple[int, int]]:
    """``(start, end)`` byte ranges of the listing, each ending after a ``\\n`` (or at its end)."""
    size = path.stat().st_size
    bounds: list[tuple[int, int]] = []
    with open(path, "rb") as f:
        lo = 0
        while lo < size:
            hi = lo + PART_BYTES
            if hi >= size:
                hi = size
            else:
                f.seek(hi - 1)
                f.readline()
                hi = f.tell()
            bounds.append((lo, hi))
            lo = hi
    return bounds


def _scan_part(job: _Job, bounds: tuple[int, int]) -> _Part:
    """The samples and skipped rows of bytes ``lo..hi`` of the listing (in a worker)."""
    path, base, default_split, space, has_labels, one_pass = job
    lo, hi = bounds
    counted = [0]

    def lines(text: io.TextIOBase) -> Iterator[str]:
        for line in text:
            counted[0] += 1
            yield line

    tables: dict[str, SpecTable] = {}
    splits: list[str] = []
    problems: list[tuple[str, int, str]] = []
    try:
        with open(path, "rb") as f:
            raw = os.pread(f.fileno(), hi - lo, lo)
        text = io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8")
        for split, n, sample in scan_rows(
            json_rows(lines(text), path),
            path=path,
            base=base,
            default_split=default_split,
            space=space,
            has_labels=has_labels,
            one_pass=one_pass,
        ):
            table = tables.get(split)
            if table is None:
                table = tables[split] = SpecTable(spill_bytes=1 << 62)  # a part's: a few MB
                splits.append(split)
            if type(sample) is str:
                problems.append((split, n, sample))
            else:
                table.append(sample)  # type: ignore[arg-type]
    except (InputError, KeyRuleError, OSError, UnicodeDecodeError) as e:
        raise _PartFailed(f"{path}: bytes {lo}..{hi}: {e}") from None
    samples = [
        (split, [(bytes(data), ends) for data, ends in table.spans()], table.payload_bytes, table.label_counts)
        for split, table in tables.items()
        if len(table)
    ]
    return counted[0], splits, samples, problems
