"""``Bad``: the marker a skipped sample becomes under ``on_error="skip"``, replaced before collate."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Bad"]


@dataclass(frozen=True, slots=True)
class Bad:
    """A sample that was skipped: unreadable (``lost``) or failing to decode or transform."""

    shard: str
    key: str | None
    reason: str
    lost: bool
