"""What names a conversion's output: one fingerprint rule, one format-version rule.

Every way into the writer (the planned path of the command line, ``ShardWriter``,
``convert_items``) fingerprints its output the same way: SHA-256 of the JSON (sorted keys) of
the format version, this release and what that way knows of its output before writing
(options, classes, the plan's source; then the plan's samples or ``fn``'s code, fed to the
hash after). The split's version token is the fingerprint's first hex digits (planned path)
or a token chained from it (:func:`~shardify.convert.write.versions.begin_version`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from shardify import CHUNKED_FORMAT_VERSION, FORMAT_VERSION, __version__

__all__ = ["fingerprint", "format_version", "converter_info"]


def fingerprint(**identity: object) -> Any:
    """A SHA-256 hash object fed with the rule's header and ``identity``; callers may feed it
    more (the plan's samples, ``fn``'s bytecode) before taking ``hexdigest()``."""
    header = {"format_version": FORMAT_VERSION, "converter": __version__, **identity}
    return hashlib.sha256(json.dumps(header, sort_keys=True).encode())


def format_version(chunk: int | None) -> int:
    """The format version of a split index: the chunked layout's when ``chunk`` is set."""
    return FORMAT_VERSION if chunk is None else CHUNKED_FORMAT_VERSION


def converter_info(source: str, shaping: dict[str, Any], *, chunk: int | None, **extra: Any) -> dict[str, Any]:
    """The split index's ``converter`` section: who wrote it, from what, with which shaping options."""
    return {
        "name": "shardify",
        "version": __version__,
        "format_version": format_version(chunk),
        "source": source,
        "options": shaping,
        **extra,
    }
