"""The texts of one column of a JSON-lines or Parquet file, as items for a token conversion.

:class:`TextRows` is iterable again and again, in file order, with a length, as
:func:`~shardify.convert.pyapi.fromitems.run_items` needs for resuming. A row is never dropped
here: a JSONL row that is not an object, or lacks the column, comes through as a
:class:`MissingText` that the tokenizer's runner reports as a bad row. Parquet needs
``pyarrow`` (imported only when a Parquet file is read).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, NamedTuple

from shardify.convert.pyapi.jsonlitems import JsonlItems
from shardify.errors import InputError

__all__ = ["TextRows", "MissingText", "text_format"]

_FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet"}
_BATCH_ROWS = 4096
"""Parquet rows decoded at a time (one column only)."""


class MissingText(NamedTuple):
    """A row without the text column: why, for the report."""

    reason: str

    def __repr__(self) -> str:
        return "<no text>"


def text_format(path: str, fmt: str | None = None) -> str:
    """``jsonl`` or ``parquet``: ``fmt`` when given, else from the file's extension."""
    if fmt is None:
        fmt = _FORMATS.get(os.path.splitext(path)[1].lower())
        if fmt is None:
            raise InputError(
                f"cannot tell the format from the extension; expected one of {sorted(_FORMATS)} (or pass fmt)",
                path=path,
            )
    if fmt not in ("jsonl", "parquet"):
        raise ValueError(f"fmt={fmt!r} should be 'jsonl' or 'parquet'")
    return fmt


class TextRows:
    """The values of column ``column`` of a JSONL or Parquet file, in file order."""

    def __init__(self, path: str | os.PathLike[str], column: str = "text", fmt: str | None = None) -> None:
        self.path = os.fspath(path)
        self.column = column
        self.fmt = text_format(self.path, fmt)
        self._len: int | None = None

    def __iter__(self) -> Iterator[Any]:
        return self._jsonl() if self.fmt == "jsonl" else self._parquet()

    def __len__(self) -> int:
        if self._len is None:
            self._len = len(JsonlItems(self.path)) if self.fmt == "jsonl" else self._parquet_file().metadata.num_rows
        return self._len

    def _jsonl(self) -> Iterator[Any]:
        column = self.column
        for row in JsonlItems(self.path):
            if not isinstance(row, dict):
                yield MissingText(f"row is a JSON {type(row).__name__}, not an object with a {column!r} column")
            elif column not in row:
                yield MissingText(f"row has no column {column!r}")
            else:
                yield row[column]

    def _parquet_file(self) -> Any:
        try:
            import pyarrow.parquet as pq  # deferred: an optional dependency, needed for Parquet only
        except ImportError as e:
            raise InputError(
                "reading Parquet needs pyarrow: pip install pyarrow (or use a JSONL file)", path=self.path
            ) from e
        try:
            return pq.ParquetFile(self.path)
        except (OSError, ValueError) as e:  # pyarrow.ArrowInvalid is a ValueError
            raise InputError(f"cannot read as Parquet: {e}", path=self.path) from e

    def _parquet(self) -> Iterator[Any]:
        pf = self._parquet_file()
        names = pf.schema_arrow.names
        if self.column not in names:
            raise InputError(f"no column {self.column!r}; the file has {names[:20]}", path=self.path)
        try:
            for batch in pf.iter_batches(columns=[self.column], batch_size=_BATCH_ROWS):
                yield from batch.column(0).to_pylist()
        except (OSError, ValueError) as e:
            raise InputError(f"cannot read as Parquet: {e}", path=self.path) from e
