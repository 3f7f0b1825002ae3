"""Reading a shard forward, sample after sample: gzip shards (no seeks) and damaged ones.

A :class:`Cursor` is a position in one shard's sample stream; reading a range skips to its
start by reading through the samples before it (the shard file object reopens the shard when
a range lies behind the cursor). A gzip shard read to its last sample is read to its trailer
too, so a CRC mismatch is damage of that shard. Under ``skip_damaged`` the samples before
the damage are read as usual and every later position comes back :class:`Lost`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import BinaryIO

from shardify.errors import ShardFormatError
from shardify.reader.io.items import READ_ERRORS, Item, Lost, damage
from shardify.tario import DEFAULT_MAX_MEMBER, KeepMember, iter_members, iter_samples

__all__ = ["Cursor", "read_forward"]


class Cursor:
    """A forward-only position in one shard's sample stream (gzip, or a damaged tar)."""

    def __init__(
        self,
        shard: int,
        url: str,
        opener: Callable[[str], tuple[BinaryIO, bool]],
        *,
        keep: KeepMember | None = None,
        max_member: int = DEFAULT_MAX_MEMBER,
    ) -> None:
        self.shard = shard
        self.url = url
        self.index = 0
        self.error: ShardFormatError | None = None
        self._f: BinaryIO | None = None
        try:
            self._f, _ = opener(url)
            members = iter_members(self._f, shard=url, keep=keep, max_member=max_member)
            self._samples: Iterator[dict[str, object]] = iter_samples(members, shard=url)
        except (ShardFormatError, *READ_ERRORS) as e:  # a fetch that failed is damage too
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        self.error = damage(self.url, e)
        self.close()

    def next(self) -> dict[str, object] | None:
        """The sample at ``self.index`` (advancing), or None once the shard ended or broke."""
        if self.error is not None:
            return None
        try:
            sample = next(self._samples)
        except StopIteration:
            self.error = ShardFormatError(f"ended after {self.index} samples", shard=self.url)
            self.close()
            return None
        except (ShardFormatError, *READ_ERRORS) as e:
            self._fail(e)
            return None
        self.index += 1
        return sample

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def read_forward(cur: Cursor, start: int, stop: int, *, skip_damaged: bool) -> Iterator[Item]:
    """Positions ``start..stop-1`` of the cursor's shard (the cursor at or before ``start``)."""
    while cur.index < start and cur.error is None:
        cur.next()
    for i in range(start, stop):
        sample = cur.next() if cur.index == i else None
        if sample is not None:
            yield sample
            continue
        if cur.error is None:
            cur.error = ShardFormatError(f"no sample at position {i}", shard=cur.url)
        if not skip_damaged:
            raise cur.error
        yield Lost(cur.url, i, str(cur.error))
