"""The keywords ``ShardedDataset`` took before its options were grouped, kept for one release.

Each old keyword maps to one field of one group (:mod:`shardify.reader.options`): passing it
warns (``DeprecationWarning``, naming the new form) and sets that field of the group. Two old
groups were folded into others: ``shuffling=ShuffleOptions(buffer=, block=)`` is
``sampling=SamplingOptions(shuffle_buffer=, shuffle_block=)`` and ``errors=ErrorOptions(...)``
is ``decoding=DecodeOptions(...)``. An old keyword (or old group) given together with its new
group is folded into it; it is an error only when the group sets that field too, since it is
unclear which should win. Delete this module, and the ``**deprecated`` of
``ShardedDataset.__init__``, in the release after.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, cast

from shardify.reader.options import GROUPS, ErrorOptions, ShuffleOptions
from shardify.suggest import unexpected_keyword

__all__ = ["OLD_KEYWORDS", "OLD_GROUPS", "apply_old_keywords"]

OLD_KEYWORDS: dict[str, tuple[str, str]] = {
    "shuffle_buffer": ("sampling", "shuffle_buffer"),
    "shuffle_block": ("sampling", "shuffle_block"),
    "collate_fn": ("batching", "collate_fn"),
    "bucket_length": ("batching", "bucket_length"),
    "bucket_buffer": ("batching", "bucket_buffer"),
    "drop_last": ("batching", "drop_last"),
    "samples_per_epoch": ("sampling", "samples_per_epoch"),
    "mark_repeats": ("sampling", "mark_repeats"),
    "allow_pickle": ("decoding", "allow_pickle"),
    "max_member_bytes": ("decoding", "max_member_bytes"),
    "on_error": ("decoding", "on_error"),
    "verify": ("decoding", "verify"),
    "cache_dir": ("cache", "dir"),
    "cache_limit_bytes": ("cache", "limit_bytes"),
}
"""Old keyword -> (group keyword, field of the group)."""

OLD_GROUPS: dict[str, tuple[type, str, dict[str, str]]] = {
    "shuffling": (ShuffleOptions, "sampling", {"buffer": "shuffle_buffer", "block": "shuffle_block"}),
    "errors": (ErrorOptions, "decoding", {"on_error": "on_error", "verify": "verify"}),
}
"""Old group keyword -> (its class, the group keyword it was folded into, its field -> that group's field)."""


def _old_fields(old: Mapping[str, Any], owner: str) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """``({group: {field: value}}, the new form of each old keyword)`` of the old keywords in ``old``."""
    fields: dict[str, dict[str, Any]] = {}
    notes = []
    for name, value in old.items():
        if name in OLD_GROUPS:
            cls, group, renames = OLD_GROUPS[name]
            if value is None:
                continue
            if not isinstance(value, cls):
                raise TypeError(f"{owner}(): {name}= should be a {cls.__name__}, got {type(value).__name__}")
            defaults = cls()
            for old_field, new_field in renames.items():
                if getattr(value, old_field) != getattr(defaults, old_field):
                    fields.setdefault(group, {})[new_field] = getattr(value, old_field)
            new = ", ".join(f"{f}=..." for f in renames.values())
            notes.append(f"{name}={cls.__name__}(...) -> {group}={GROUPS[group].__name__}({new})")
        else:
            group, field = OLD_KEYWORDS[name]
            fields.setdefault(group, {})[field] = value
            notes.append(f"{name}= -> {group}={GROUPS[group].__name__}({field}=...)")
    return fields, notes


def apply_old_keywords(
    old: Mapping[str, Any],
    groups: Mapping[str, Any],
    *,
    owner: str = "ShardedDataset",
    stacklevel: int = 3,
    known: Sequence[str] = (),
) -> dict[str, Any]:
    """``groups`` (group keyword -> the object given, or None) with the old keywords and old
    groups in ``old`` folded into their groups. Raises ``TypeError`` for an unknown keyword (with
    the closest of ``known``, the owner's keywords, and the old ones), for an old group of the
    wrong type, or for an old keyword whose field its group sets too; warns once, listing the
    new form of every old keyword used."""
    unknown = sorted(set(old) - set(OLD_KEYWORDS) - set(OLD_GROUPS))
    if unknown:
        raise TypeError(unexpected_keyword(owner, unknown[0], [*known, *OLD_KEYWORDS, *OLD_GROUPS]))
    out = dict(groups)
    fields, notes = _old_fields(old, owner)
    for group, values in fields.items():
        cls, given = GROUPS[group], groups.get(group)
        if given is None:
            out[group] = cls(**values)
            continue
        if not isinstance(given, cls):
            raise TypeError(f"{owner}(): {group}= should be a {cls.__name__}, got {type(given).__name__}")
        defaults = cls()
        for field in values:
            if getattr(given, field) != getattr(defaults, field):
                name = next((k for k, (g, f) in OLD_KEYWORDS.items() if (g, f) == (group, field) and k in old), None)
                name = name or next(k for k, (_, g, r) in OLD_GROUPS.items() if g == group and field in r.values())
                raise TypeError(
                    f"{owner}(): pass {name}=... or {group}={cls.__name__}(...), not both "
                    f"(move it into the group: {group}={cls.__name__}({field}=...))"
                )
        out[group] = dataclasses.replace(cast(Any, given), **values)
    if notes:
        warnings.warn(
            f"{owner}: these keywords are deprecated and will be removed in the next release; "
            f"pass their groups instead: {', '.join(notes)}",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
    return out
