"""Labels given as ints or as names: one rule for the ``ids`` and ``listing`` inputs.

All ints (or decimal strings, as a CSV gives them): the label is the int, no class names.
All names: classes are the sorted distinct names, label ``i`` is ``classes[i]``. A mix is
an error naming the file.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from shardify.convert.inputs.inputs import Scan
from shardify.errors import InputError

__all__ = ["LabelSpace", "label_space", "is_int_label", "int_labels", "MAX_LABEL_COUNTS"]

MAX_LABEL_COUNTS = 1000
"""Distinct int labels up to which the split index records a count per label."""

_INT_RE = re.compile(r"-?\d+\Z")


@dataclass(frozen=True)
class LabelSpace:
    """How raw label values map to (index, recorded name)."""

    classes: tuple[str, ...]
    by_int: bool
    num_classes: int | None

    def resolve(self, raw: object) -> tuple[int, str | int]:
        """``(index, name)`` for a raw label; raises ValueError with the reason."""
        if self.by_int:
            if not isinstance(raw, (int, str)):  # (label_space admits no other kind)
                raise ValueError(f"label {raw!r} should be an int")
            value = int(raw)
            if value < 0 or (self.num_classes is not None and value >= self.num_classes):
                limit = f"0..{self.num_classes - 1}" if self.num_classes is not None else ">= 0"
                raise ValueError(f"label {value} out of range ({limit})")
            return value, value
        name = str(raw)
        return self._index[name], name

    @property
    def _index(self) -> dict[str, int]:
        cached = self.__dict__.get("_index_cache")
        if cached is None:
            cached = {c: i for i, c in enumerate(self.classes)}
            object.__setattr__(self, "_index_cache", cached)
        return cached


def is_int_label(value: object) -> bool:
    """Whether a raw label is an int: an int (not a bool) or a decimal string."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, str) and bool(_INT_RE.match(value.strip())))


def label_space(values: Iterable[object], *, source: str, num_classes: int | None) -> LabelSpace:
    """The label space of all raw label values (of every split, so indices agree)."""
    distinct = set()
    kinds = set()
    for v in values:
        if v is None or v == "":
            continue
        if is_int_label(v):
            kinds.add("int")
        elif isinstance(v, str):
            kinds.add("name")
            distinct.add(v)
        else:
            raise InputError(f"label {v!r} should be an int or a string", path=source)
    if kinds == {"int", "name"}:
        raise InputError("labels mix ints and names; use one kind", path=source)
    if kinds == {"name"}:
        classes = tuple(sorted(distinct))
        if num_classes is not None and len(classes) > num_classes:
            raise InputError(f"{len(classes)} label names, more than --num-classes {num_classes}", path=source)
        return LabelSpace(classes=classes, by_int=False, num_classes=num_classes)
    return LabelSpace(classes=(), by_int=True, num_classes=num_classes)


def int_labels(scan: Scan) -> dict[str, Any]:
    """What the split index records about int labels (a split without class names), so
    ``shardify info`` can show the labels seen: ``{"labels": {"distinct", "min", "max",
    "counts"}}`` (``counts`` per label up to :data:`MAX_LABEL_COUNTS` distinct labels),
    or ``{}`` when the split has class names or no labels."""
    if scan.classes:
        return {}
    counts = getattr(scan.samples, "label_counts", None)  # a SpecTable's, counted as it filled
    if counts is None:
        counts = Counter(s.label for s in scan.samples if s.label is not None)
    if not counts:
        return {}
    out: dict[str, Any] = {"distinct": len(counts), "min": min(counts), "max": max(counts)}
    if len(counts) <= MAX_LABEL_COUNTS:
        out["counts"] = {str(k): v for k, v in sorted(counts.items())}
    return {"labels": out}
