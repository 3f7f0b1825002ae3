"""A CSV or JSONL listing's rows and the sample each row makes: the rule both scans share.

The one-process scan (:mod:`~shardify.convert.inputs.listing`) and the parts read in worker
processes (:mod:`~shardify.convert.inputs.listing_pool`) both take their rows and samples
from here, so that a row gives the same sample, or the same reason to skip it, either way.
"""

from __future__ import annotations

import csv
import functools
import json
import json.scanner
import re
import stat
from collections.abc import Generator, Iterable, Iterator
from pathlib import Path

from shardify.convert.inputs.ids import stored_ext
from shardify.convert.inputs.inputs import IMAGE_EXTS, SampleSpec, SourceFile
from shardify.convert.inputs.labels import LabelSpace, is_int_label
from shardify.errors import InputError, KeyRuleError
from shardify.keys import check_ext
from shardify.tarfmt import check_split_name

__all__ = ["scan_rows", "inline_ext", "read_rows", "json_rows", "TwoPasses"]

_RESERVED = {"path", "id", "label", "split"}
_COLUMN_RE = re.compile(r"[a-z0-9][a-z0-9_-]*\Z")
# (typeshed types the scanner's context as a make_scanner; it takes any JSONDecoder)
_scan_json = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]
"""JSON's own scanner: ``(value, end)`` for the value at an index, StopIteration if none."""


def inline_ext(column: str, value: object) -> str:
    """The member extension of inline column ``column`` holding ``value``."""
    return _inline_ext(column, isinstance(value, str))


@functools.lru_cache(maxsize=1024)
def _inline_ext(column: str, is_text: bool) -> str:
    if not _COLUMN_RE.match(column):
        raise KeyRuleError(f"column {column!r} cannot name a field: use [a-z0-9_-], starting with a letter or digit")
    if is_text:
        return "txt" if column == "text" else f"{column}.txt"
    return f"{column}.json"


def _rows(path: Path, fmt: str) -> Iterator[tuple[int, dict[str, object]]]:
    if fmt == "csv":
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None:
                raise InputError("CSV listing has no header row", path=str(path))
            for n, row in enumerate(reader, start=2):
                if None in row:
                    raise InputError(f"line {n}: more cells than header columns", path=str(path))
                yield n, {k: v for k, v in row.items() if v not in (None, "")}
        return
    with open(path, encoding="utf-8") as f:
        yield from json_rows(f, path)


def json_rows(lines: Iterable[str], path: Path) -> Iterator[tuple[int, dict[str, object]]]:
    """The rows of JSON lines (numbered from 1), as :func:`json.loads` reads each line."""
    for n, line in enumerate(lines, start=1):
        # The scanner alone (a third of json.loads's time per row) when the line is one
        # object and its newline; anything else goes through json.loads for its rules
        # and its error message.
        try:
            row, end = _scan_json(line, 0)
        except (StopIteration, ValueError):
            end = -1
        if end != len(line) - (line[-1:] == "\n") or type(row) is not dict:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise InputError(f"line {n}: not valid JSON: {e}", path=str(path)) from e
            if not isinstance(row, dict):
                raise InputError(f"line {n}: expected a JSON object", path=str(path))
        yield n, {k: v for k, v in row.items() if v is not None} if None in row.values() else row


class TwoPasses(Exception):
    """The one-pass scan met a label that is not an int, or a label after unlabelled rows."""


def scan_rows(
    rows: Iterable[tuple[int, dict[str, object]]],
    *,
    path: Path,
    base: Path,
    default_split: str,
    space: LabelSpace,
    has_labels: bool | None,
    one_pass: bool,
) -> Iterator[tuple[str, int, SampleSpec | str]]:
    """``(split, line, sample)`` of each row, or ``(split, line, reason)`` for a row skipped.
    ``one_pass``: only int labels, and labelled or not as ``has_labels`` (None: as the first
    row is), else :class:`TwoPasses`. A bad split name raises InputError."""
    seen: set[str] = set()
    for n, row in rows:
        if one_pass:
            if has_labels is None:
                has_labels = "label" in row
            label = row.get("label")
            if label is not None and not (has_labels and (label == "" or is_int_label(label))):
                raise TwoPasses
        split = str(row.get("split", default_split))
        if split not in seen:
            try:
                check_split_name(split)
            except KeyRuleError as e:
                raise InputError(str(e), path=str(path)) from e
            seen.add(split)
        try:
            yield split, n, _sample(row, base=base, space=space, has_labels=bool(has_labels))
        except ValueError as e:
            yield split, n, str(e)


def read_rows(path: Path, fmt: str) -> Generator[tuple[int, dict[str, object]], None, None]:
    """The rows of the listing, with read errors as InputError naming it."""
    try:
        yield from _rows(path, fmt)
    except OSError as e:
        raise InputError(f"cannot read listing: {e.strerror}", path=str(path)) from e
    except UnicodeDecodeError as e:
        raise InputError(f"listing is not UTF-8: {e}", path=str(path)) from e


def _sample(row: dict[str, object], *, base: Path, space: object, has_labels: bool) -> SampleSpec:
    """One sample from a row; ValueError (or KeyRuleError) gives the reason to skip it."""
    rel = row.get("path")
    ident = row.get("id")
    if rel is None and ident is None:
        raise ValueError("row has neither 'path' nor 'id'")
    files: tuple[SourceFile, ...] = ()
    if rel is not None:
        rel = str(rel)
        full = base / rel
        try:
            st = full.stat()
        except OSError as e:
            raise ValueError(f"{rel}: cannot stat: {e.strerror}") from e
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{rel}: not a regular file")
        dot, slash = rel.rfind("."), rel.rfind("/")
        ext = stored_ext(rel[dot + 1 :]) if dot > slash + 1 else "bin"
        check_ext(ext)
        files = (SourceFile(ext=ext, path=rel, size=st.st_size, mtime_ns=st.st_mtime_ns, is_image=ext in IMAGE_EXTS),)
        name = rel[:dot] if dot > slash + 1 else rel
        identity = rel
    if ident is not None:
        name = identity = str(ident)
    label: int | None = None
    label_name: str | int | None = None
    if has_labels:
        if "label" not in row:
            raise ValueError("no label")
        label, label_name = space.resolve(row["label"])  # type: ignore[attr-defined]
    inline = []
    for column, value in row.items():
        if column in _RESERVED:
            continue
        if isinstance(value, str):
            inline.append((_inline_ext(column, True), value.encode("utf-8")))
        else:
            inline.append((_inline_ext(column, False), json.dumps(value, sort_keys=True).encode()))
    if files:  # inline columns never share an extension: a file's may be one of theirs
        exts = [f.ext for f in files] + [e for e, _ in inline]
        if len(set(exts)) != len(exts):
            raise ValueError(f"two fields would be stored under the same extension: {sorted(exts)}")
    return SampleSpec(name, identity, label, label_name, files, tuple(inline))  # positional: 3x faster
