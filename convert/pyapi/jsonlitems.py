"""Items for ``convert_items`` from outside Python: the rows of a JSON-lines file
(:class:`JsonlItems`) and the function named ``MODULE:NAME`` (:func:`load_function`), as the
command line's ``shardify convert python`` takes them."""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

from shardify.errors import InputError

__all__ = ["JsonlItems", "load_function"]

_scan = json.JSONDecoder().raw_decode


def _parse_line(line: bytes, number: int) -> Any:
    """The JSON value of one UTF-8 line (a BOM allowed on the first): ``json.loads`` without
    its per-call encoding detection, which costs as much as parsing a short row."""
    text = line.decode("utf-8-sig" if number == 1 else "utf-8")
    start = len(text) - len(text.lstrip())  # raw_decode takes no leading whitespace
    value, end = _scan(text, start)
    if end != len(text) and not text[end:].isspace():
        raise json.JSONDecodeError("Extra data", text, end)
    return value


class JsonlItems:
    """The rows of a JSON-lines file as items: iterable again and again, with a length.

    Blank lines are skipped; a line that is not JSON raises InputError naming the file and line.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._len: int | None = None

    def __iter__(self) -> Iterator[Any]:
        try:
            with open(self.path, "rb") as f:
                for number, line in enumerate(f, 1):
                    if line.isspace():  # blank (what strip() tells, without copying the line)
                        continue
                    try:
                        yield _parse_line(line, number)
                    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
                        raise InputError(f"line {number} is not JSON: {e}", path=self.path) from e
        except OSError as e:
            raise InputError(f"cannot read: {e.strerror or e}", path=self.path) from e

    def __len__(self) -> int:
        if self._len is None:
            try:
                with open(self.path, "rb") as f:
                    self._len = sum(1 for line in f if not line.isspace())
            except OSError as e:
                raise InputError(f"cannot read: {e.strerror or e}", path=self.path) from e
        return self._len


def load_function(spec: str) -> Callable[[Any], Mapping[str, object] | None]:
    """The function named ``MODULE:NAME`` (``NAME`` may be dotted); the current folder is importable."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"function {spec!r} should be MODULE:FUNCTION, e.g. mymodule:make_sample")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - ImportError, or the module's own error while importing
        raise InputError(f"cannot import module {module!r}: {type(e).__name__}: {e}", path=spec) from e
    for part in name.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise InputError(f"module {module!r} has no {name!r}", path=spec) from e
    if not callable(obj):
        raise InputError(f"{name!r} is a {type(obj).__name__}, not a function", path=spec)
    return cast(Callable[[Any], Mapping[str, object] | None], obj)
