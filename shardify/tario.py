"""Reading shards: the tar reader's public names in one place.

The parser lives in three modules by role: :mod:`shardify.tarheader` (one header block into
its fields, the member rules), :mod:`shardify.tarmembers` (members from a byte stream,
grouped into samples) and :mod:`shardify.tarlayout` (where each sample lies, from a
header-only scan). Import from here or from them.
"""

from __future__ import annotations

from shardify.tarlayout import ShardLayout, scan_layout, scan_sample_offsets, scan_window
from shardify.tarmembers import (
    DAMAGE_AFTER,
    DEFAULT_MAX_MEMBER,
    BadMemberHandler,
    KeepMember,
    Member,
    iter_members,
    iter_samples,
    read_to_end,
    skip_bytes,
)

__all__ = [
    "Member",
    "BadMemberHandler",
    "iter_members",
    "iter_samples",
    "DAMAGE_AFTER",
    "scan_sample_offsets",
    "scan_layout",
    "scan_window",
    "ShardLayout",
    "skip_bytes",
    "DEFAULT_MAX_MEMBER",
    "KeepMember",
    "read_to_end",
]
