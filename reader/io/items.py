"""What a shard reader yields: a sample dict, or a :class:`Lost` position of a damaged shard.

Shared by the whole-shard reader (:mod:`~shardify.reader.io.stream`), the chunked layout's
slicer (:mod:`~shardify.reader.io.chunked`) and the stages after them.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from shardify.errors import KeyRuleError, SampleChecksumError, ShardFormatError
from shardify.keys import split_member_name

__all__ = ["Lost", "Item", "damage", "READ_ERRORS", "sample_key", "changed_sample"]

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


def sample_key(data: bytes | memoryview) -> str | None:
    """The sample key in the name field of the tar header that ``data`` starts with (None when
    it cannot be read: the bytes that do not match may be any)."""
    try:
        return split_member_name(bytes(data[:100]).split(b"\0", 1)[0].decode("utf-8"))[0]
    except (UnicodeDecodeError, KeyRuleError):
        return None


def changed_sample(
    index: int, start: int, stop: int, *, url: str, key: str | None, remote: bool
) -> SampleChecksumError:
    """The error for sample ``index`` (bytes ``start..stop-1`` of shard ``url``) whose bytes do
    not match the index's checksum: read from a server (``remote``) or from a shard file."""
    if remote:
        why = "corrupt or replaced on the server"
    else:
        why = "changed or corrupt since it was written; `shardify verify` checks every sample"
    return SampleChecksumError(
        f"sample {index} (bytes {start}-{stop - 1}) does not match the index's checksum ({why})", shard=url, key=key
    )
