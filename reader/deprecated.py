"""The keywords ``ShardedDataset`` took before its options were grouped, kept for one release.

Each old keyword maps to one field of one group (:mod:`shardify.reader.options`): passing it
warns (``DeprecationWarning``, naming the new form) and builds that group; passing an old
keyword together with its group is an error, since it is unclear which should win. Delete
this module, and the ``**deprecated`` of ``ShardedDataset.__init__``, in the release after.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from shardify.reader.options import GROUPS

__all__ = ["OLD_KEYWORDS", "apply_old_keywords"]

OLD_KEYWORDS: dict[str, tuple[str, str]] = {
    "shuffle_buffer": ("shuffling", "buffer"),
    "shuffle_block": ("shuffling", "block"),
    "collate_fn": ("batching", "collate_fn"),
    "bucket_length": ("batching", "bucket_length"),
    "bucket_buffer": ("batching", "bucket_buffer"),
    "samples_per_epoch": ("sampling", "samples_per_epoch"),
    "mark_repeats": ("sampling", "mark_repeats"),
    "allow_pickle": ("decoding", "allow_pickle"),
    "max_member_bytes": ("decoding", "max_member_bytes"),
    "on_error": ("errors", "on_error"),
    "verify": ("errors", "verify"),
    "cache_dir": ("cache", "dir"),
    "cache_limit_bytes": ("cache", "limit_bytes"),
}
"""Old keyword -> (group keyword, field of the group)."""


def apply_old_keywords(
    old: Mapping[str, Any],
    groups: Mapping[str, Any],
    *,
    owner: str = "ShardedDataset",
    stacklevel: int = 3,
    known: Sequence[str] = (),
) -> dict[str, Any]:
    """``groups`` (group keyword -> the object given, or None) with the old keywords in ``old``
    folded into new group objects. Raises ``TypeError`` for an unknown keyword (with the closest
    of ``known``, the owner's keywords, and the old ones) or for an old keyword given with its
    group; warns once, listing the new form of every old keyword used."""
    unknown = sorted(set(old) - set(OLD_KEYWORDS))
    if unknown:
        close = difflib.get_close_matches(unknown[0], [*known, *OLD_KEYWORDS], n=1, cutoff=0.6)
        raise TypeError(
            f"{owner}() got an unexpected keyword argument {unknown[0]!r}"
            + (f"; did you mean {close[0]}=?" if close else "")
        )
    out = dict(groups)
    fields: dict[str, dict[str, Any]] = {}
    for name, value in old.items():
        group, field = OLD_KEYWORDS[name]
        if groups.get(group) is not None:
            raise TypeError(
                f"{owner}(): pass {name}=... or {group}={GROUPS[group].__name__}(...), not both "
                f"(move it into the group: {group}={GROUPS[group].__name__}({field}=...))"
            )
        fields.setdefault(group, {})[field] = value
    for group, values in fields.items():
        out[group] = GROUPS[group](**values)
    if old:
        new = ", ".join(
            f"{name}= -> {OLD_KEYWORDS[name][0]}={GROUPS[OLD_KEYWORDS[name][0]].__name__}({OLD_KEYWORDS[name][1]}=...)"
            for name in old
        )
        warnings.warn(
            f"{owner}: these keywords are deprecated and will be removed in the next release; "
            f"pass their groups instead: {new}",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
    return out
