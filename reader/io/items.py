"""What a shard reader yields: a sample dict, or a :class:`Lost` position of a damaged shard.

Shared by the whole-shard reader (:mod:`~shardify.reader.io.stream`), the chunked layout's
slicer (:mod:`~shardify.reader.io.chunked`) and the stages after them.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from shardify.errors import ShardFormatError

__all__ = ["Lost", "Item", "damage", "READ_ERRORS"]

READ_ERRORS = (OSError, EOFError, zlib.error)
"""What reading a shard's bytes may raise besides ShardFormatError (all damage of that shard)."""


@dataclass(frozen=True, slots=True)
class Lost:
    """Position ``index`` of shard ``shard`` could not be read; ``reason`` says why."""

    shard: str
    index: int
    reason: str


Item = dict[str, object] | Lost
"""A sample dict (``__key__``, ``__shard__``, ``__offset__``, ext -> bytes) or a :class:`Lost`."""


def damage(url: str, e: BaseException) -> ShardFormatError:
    """``e`` as the ShardFormatError that names ``url`` (itself if it is one already)."""
    if isinstance(e, ShardFormatError):
        return e
    return ShardFormatError(f"cannot read: {type(e).__name__}: {e}", shard=url)
