"""One sample's tar bytes, as a ranged read fetched them, parsed in one pass when they are plain.

A ranged read (:mod:`~shardify.reader.io.ranged`) holds the exact bytes of one sample, already
checked against the index's digest. What shardify writes is the plain case: ustar headers of
regular files, no extension headers, one key, each field once, each member's data padded to
the block and the last one ending the bytes. :func:`plain_sample` parses that case with the
same header parser and rules as the member walk (:mod:`shardify.tarmembers`), without a file
object or generators; anything else it hands back (None), and the full walk decides, with its
errors and messages.
"""

from __future__ import annotations

import io

from shardify.errors import KeyRuleError, ShardFormatError
from shardify.keys import split_member_name
from shardify.tarfmt import BLOCK
from shardify.tarheader import checksum_ok, header_fields, member_problem
from shardify.tario import KeepMember, iter_members, iter_samples

__all__ = ["plain_sample", "parse_sample"]

_PLAIN = (b"0", b"\x00")
"""Regular-file type flags of the plain case."""


def plain_sample(
    data: bytes, *, url: str, offset: int, keep: KeepMember | None, max_member: int
) -> dict[str, object] | None:
    """The sample dict of ``data`` (found at byte ``offset`` of the shard ``url``) when it is
    the plain case (see the module); None when it is not."""
    end, at = len(data), 0
    sample: dict[str, object] = {}
    key: str | None = None
    fields: set[str] = set()
    while at < end:
        if at + BLOCK > end:
            return None
        header = data[at : at + BLOCK]
        try:
            raw_name, size, typeflag, stored = header_fields(header)
            name = raw_name.decode("ascii")
            k, field = split_member_name(name)
        except (ValueError, KeyRuleError):  # (UnicodeDecodeError is a ValueError)
            return None
        if typeflag not in _PLAIN or size < 0 or not checksum_ok(header, stored):
            return None
        if member_problem(name, typeflag, size, max_member) is not None or field in fields:
            return None
        if key is None:
            key = k
            sample = {"__key__": k, "__shard__": url, "__offset__": offset}
        elif k != key:
            return None
        fields.add(field)
        start = at + BLOCK
        stop = start + size
        if stop > end:
            return None
        if keep is None or keep(name):
            sample[field] = data[start:stop]
        at = stop + (-size % BLOCK)
    return sample if key is not None and at == end else None


def parse_sample(data: bytes, *, url: str, offset: int, keep: KeepMember | None, max_member: int) -> dict[str, object]:
    """The sample dict of one sample's tar bytes ``data`` (found at byte ``offset`` of the
    shard ``url``): exactly one sample, or :class:`ShardFormatError`. The plain case is parsed
    in one pass (:func:`~shardify.reader.io.sampleparse.plain_sample`), anything else by the
    member walk."""
    plain = plain_sample(data, url=url, offset=offset, keep=keep, max_member=max_member)
    if plain is not None:
        return plain
    members = iter_members(io.BytesIO(data), shard=url, keep=keep, max_member=max_member)
    found = list(iter_samples(members, shard=url))
    if len(found) != 1:
        raise ShardFormatError(
            f"bytes {offset}-{offset + len(data) - 1} hold {len(found)} samples, the index says one",
            shard=url,
            key=str(found[0]["__key__"]) if found else None,
        )
    sample = found[0]
    sample["__offset__"] = offset
    return sample
