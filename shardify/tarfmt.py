"""Tar layout of a shard: names, fixed header fields, block arithmetic.

A shard is an uncompressed POSIX ustar archive. Every member is a regular file whose
header has fixed fields (mode 0644, uid/gid 0, empty user/group names, mtime 0), so the
same samples always give the same bytes. Member names fit the 100-byte name field, so no
PAX or GNU extension headers are written. The archive ends with two zero blocks.
"""

from __future__ import annotations

import re

from shardify.errors import KeyRuleError, ShardFormatError

__all__ = [
    "index_name",
    "report_name",
    "is_temp_name",
    "BLOCK",
    "END_OF_ARCHIVE",
    "MAX_MEMBER_SIZE",
    "MTIME",
    "OFFSET_STRIDE",
    "VERSION_CHARS",
    "shard_name",
    "parse_shard_name",
    "shard_of_split",
    "check_version_token",
    "padded_size",
    "member_size",
    "ustar_header",
    "padding",
]

BLOCK = 512
END_OF_ARCHIVE = bytes(2 * BLOCK)
OFFSET_STRIDE = 32
"""A split index lists, for each shard, the byte offset of samples 0, 32, 64, ... (its
``offsets``), so a reader can seek to a sample and scan at most 32 samples' headers."""
MTIME = 0
"""Fixed modification time of every member (seconds since the epoch)."""
MAX_MEMBER_SIZE = 8**11 - 1
"""Largest member a ustar size field holds (just under 8 GiB)."""

_SHARD_RE = re.compile(r"(?P<split>[A-Za-z0-9][A-Za-z0-9_-]*)-(?P<index>\d{6,})\.tar\Z")
_SPLIT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*\Z")
VERSION_CHARS = 12
"""Hex digits of a dataset version token (the start of the conversion's plan fingerprint)."""
_VERSION_RE = re.compile(rf"[0-9a-f]{{{VERSION_CHARS}}}\Z")
_TAIL_RE = re.compile(rf"(?:(?P<version>[0-9a-f]{{{VERSION_CHARS}}})-)?(?P<index>\d{{6,}})\.tar\Z")


def check_split_name(split: str) -> str:
    """Return ``split`` if usable in shard file names, else raise KeyRuleError."""
    if not isinstance(split, str) or not _SPLIT_RE.match(split) or len(split) > 64:
        raise KeyRuleError(f"split name {split!r} should be 1..64 characters of [A-Za-z0-9_-]")
    return split


def check_version_token(version: str) -> str:
    """Return ``version`` if it is a version token (12 lowercase hex digits), else raise KeyRuleError."""
    if not isinstance(version, str) or not _VERSION_RE.match(version):
        raise KeyRuleError(f"version {version!r} should be {VERSION_CHARS} lowercase hex digits")
    return version


def shard_name(split: str, index: int, version: str | None = None) -> str:
    """The file name of shard ``index`` of ``split``: ``{split}-{version}-{index:06d}.tar``
    (format 2), or ``{split}-{index:06d}.tar`` without a version (format 1)."""
    if index < 0:
        raise ValueError(f"{index=} should be >= 0")
    if version is None:
        return f"{check_split_name(split)}-{index:06d}.tar"
    return f"{check_split_name(split)}-{check_version_token(version)}-{index:06d}.tar"


def parse_shard_name(name: str) -> tuple[str, int]:
    """Inverse of :func:`shard_name`; raises ShardFormatError for other names."""
    m = _SHARD_RE.match(name)
    if not m:
        raise ShardFormatError("name is not '{split}-{index:06d}.tar'", shard=name)
    return m.group("split"), int(m.group("index"))


def shard_of_split(name: str, split: str) -> tuple[str | None, int] | None:
    """``(version, index)`` when ``name`` is a shard file name of ``split`` (version None for
    format 1 names), else None."""
    if not name.startswith(f"{split}-"):
        return None
    m = _TAIL_RE.match(name, len(split) + 1)
    return (m.group("version"), int(m.group("index"))) if m else None


def padded_size(size: int) -> int:
    """Bytes a member's data takes in the archive, rounded up to whole blocks."""
    return (size + BLOCK - 1) // BLOCK * BLOCK


def member_size(size: int) -> int:
    """Bytes a member of ``size`` data bytes takes in the archive, header included."""
    return BLOCK + (size + BLOCK - 1) // BLOCK * BLOCK  # padded_size inlined: called per sample


def padding(size: int) -> bytes:
    """The zero bytes that follow ``size`` bytes of data to fill the last block."""
    return bytes(-size % BLOCK)


_HEADER_TEMPLATE = bytearray(BLOCK)
_HEADER_TEMPLATE[100:108] = b"0000644\x00"
_HEADER_TEMPLATE[108:116] = b"0000000\x00"
_HEADER_TEMPLATE[116:124] = b"0000000\x00"
_HEADER_TEMPLATE[136:148] = b"%011o\x00" % MTIME
_HEADER_TEMPLATE[148:156] = b" " * 8
_HEADER_TEMPLATE[156:157] = b"0"
_HEADER_TEMPLATE[257:263] = b"ustar\x00"
_HEADER_TEMPLATE[263:265] = b"00"
_TEMPLATE_SUM = sum(_HEADER_TEMPLATE)
"""Checksum of the template (name and size fields empty, checksum field as spaces)."""


def ustar_header(name: str, size: int) -> bytes:
    """The 512-byte ustar header of a regular file ``name`` holding ``size`` bytes."""
    raw = name.encode("ascii")
    if not raw or len(raw) > 100:
        raise KeyRuleError(f"member name {name!r} should be 1..100 ASCII bytes")
    if not 0 <= size <= MAX_MEMBER_SIZE:
        raise ShardFormatError(f"member of {size} bytes does not fit a ustar header", shard="-", key=name)
    size_field = b"%011o\x00" % size
    header = bytearray(_HEADER_TEMPLATE)
    header[0 : len(raw)] = raw
    header[124:136] = size_field
    header[148:156] = b"%06o\x00 " % (_TEMPLATE_SUM + sum(raw) + sum(size_field))  # = sum(header), 2% of the work
    return bytes(header)


def index_name(split: str, version: str | None = None) -> str:
    """File name of a split's index, relative to the dataset directory: ``{split}-{version}.json``
    for a version, ``{split}.json`` for the copy wids opens (and format 1)."""
    return f"{split}-{version}.json" if version else f"{split}.json"


def report_name(split: str) -> str:
    """File name of a split's report of skipped inputs (JSON lines)."""
    return f"{split}.report.jsonl"


def is_temp_name(name: str) -> bool:
    """Whether ``name`` is a temporary file of an unfinished write (never part of a dataset):
    ``.{name}.{random}.tmp`` (:func:`write_bytes_atomic`), ``.{shard}.tmp`` (a shard being
    written) or ``{name}.tmp-upload`` (an atomic write to object storage)."""
    return (name.startswith(".") and name.endswith(".tmp")) or name.endswith(".tmp-upload")
