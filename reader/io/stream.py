"""Reading a range ``[start, stop)`` of a shard's samples, as encoded bytes, without decoding.

Plain tar shards are scanned once per process for where each sample's fields lie
(:func:`shardify.tario.scan_layout`, headers only, checked as strictly as reading them);
then each field of a sample is one read at its offset, with no header parsed again. Gzip
shards cannot seek, so a cursor streams forward and skips samples by reading through them
(reopening when a range lies behind it).

With ``skip_damaged``, a truncated or garbage shard does not raise: the samples before the
damage are read as usual and every later position comes back as a :class:`Lost` marker, so
a range always yields exactly ``stop - start`` items. The sample just before the damage is
kept when all its members were read before it (the damage is not in one of its own
members; see :func:`shardify.tario.iter_samples`).

With ``checksums``, each shard's SHA-256 is checked against the manifest's before its first
sample is used (once per shard and process); a mismatch raises, or with ``skip_damaged``
loses every position of the shard.

A shard that cannot be opened (deleted, never there, a directory, no permission) is damage
like any other: a :class:`ShardFormatError` naming it, or with ``skip_damaged`` its positions
come back :class:`Lost`. Only the ``fields`` asked for are read into memory; the others are
passed over (not read on a plain tar, read through in chunks on gzip). A gzip shard read to
its last sample is read to its trailer too, so a CRC mismatch is damage of that shard.

Chunked shards (``chunks``, :mod:`shardify.chunk`) are read by the same machinery in units of
chunks, and :class:`~shardify.reader.io.chunked.ChunkSlicer` slices the samples out.
"""

from __future__ import annotations

import functools
import zlib
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import BinaryIO

from shardify.chunk import KEYS_EXT, chunk_count
from shardify.errors import KeyRuleError, ShardFormatError
from shardify.keys import split_member_name
from shardify.manifest import file_sha256
from shardify.reader.io.chunked import ChunkSlicer
from shardify.reader.io.items import Item, Lost, damage
from shardify.reader.io.ranged import RangeFetcher, parse_sample
from shardify.reader.io.sources import is_gzip, open_shard, open_tar
from shardify.remote import is_remote
from shardify.tarfmt import OFFSET_STRIDE
from shardify.tario import (
    DEFAULT_MAX_MEMBER,
    KeepMember,
    ShardLayout,
    iter_members,
    iter_samples,
    scan_layout,
    scan_window,
)

__all__ = ["Lost", "Item", "ShardReader"]

_MAX_CACHED_SHARDS = 1024
_MAX_CACHED_WINDOWS = 16384
_ReadErrors = (OSError, EOFError, zlib.error)


def _read_sample(
    f: BinaryIO, layout: ShardLayout, i: int, url: str, fields: Collection[str] | None
) -> dict[str, object]:
    """Sample ``i`` of the shard open as ``f``: one read per field in ``fields`` (None: every
    field), where the layout says."""
    key = layout.key(i)
    sample: dict[str, object] = {"__key__": key, "__shard__": url, "__offset__": layout.offsets[i]}
    for field, at, size in layout.fields(i):
        if fields is not None and field not in fields:
            continue
        f.seek(at)
        data = f.read(size)
        if len(data) != size:  # the file shrank since it was scanned
            raise ShardFormatError(
                f"truncated: field {field!r} needs {size} bytes at byte {at}, only {len(data)} left", shard=url, key=key
            )
        sample[field] = data
    return sample


class _Cursor:
    """A forward-only position in one shard's sample stream (gzip, or a damaged tar)."""

    def __init__(
        self,
        shard: int,
        url: str,
        opener: Callable[[str], tuple[BinaryIO, bool]] = open_tar,
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
        except (ShardFormatError, *_ReadErrors) as e:  # a fetch that failed is damage too
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
        except (ShardFormatError, *_ReadErrors) as e:
            self._fail(e)
            return None
        self.index += 1
        return sample

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


class ShardReader:
    """Reads sample ranges of ``urls`` (expected to hold ``sizes`` samples each) for one process;
    ``opener`` opens a shard (``Source.open_tar`` carries the fetch options of remote shards);
    ``checksums``: each shard's expected hex SHA-256, checked before it is read (None: no check);
    ``fields``: the fields (extensions) a sample dict gets, the others are never read into
    memory (None: all); ``max_member``: largest member a shard may hold, in bytes;
    ``offsets``: per shard, the byte offsets of samples 0, OFFSET_STRIDE, ... from the split
    index (empty: not known), and ``filesizes``, the index's size of each shard. With them, a
    short range is read after scanning only the headers of the windows of ``OFFSET_STRIDE``
    samples it falls in, used only when the file has the index's size and each window ends
    where the next begins; otherwise, and for a long range, the whole shard is scanned. The
    offsets are trusted as the index's sample counts are: ``verify`` (the reader's checksums)
    proves the shard's bytes are those the index was written for, ``shardify verify`` checks
    the offsets themselves. ``chunks``: per shard, its samples per chunk (None: a per-sample
    shard); ``sizes`` stay sample counts, ``offsets`` are then those of chunks. ``ranged``:
    reads the shards it covers in checked byte ranges (:mod:`shardify.reader.io.ranged`);
    :meth:`plan` tells it the reads to come."""

    def __init__(
        self,
        urls: Sequence[str],
        sizes: Sequence[int],
        *,
        skip_damaged: bool,
        opener: Callable[[str], tuple[BinaryIO, bool]] = open_tar,
        checksums: Sequence[str] | None = None,
        fields: Collection[str] | None = None,
        max_member: int = DEFAULT_MAX_MEMBER,
        offsets: Sequence[Sequence[int]] | None = None,
        filesizes: Sequence[int | None] | None = None,
        chunks: Sequence[int | None] | None = None,
        ranged: RangeFetcher | None = None,
    ) -> None:
        self._opener = opener
        self._urls = list(urls)
        self._sizes = list(sizes)
        """Samples per shard, or for a chunked shard chunks: the units its tar samples are."""
        self._chunks = list(chunks) if chunks is not None and any(chunks) else None
        if self._chunks is not None:
            if len(self._chunks) != len(self._urls):
                raise ValueError(f"{len(self._chunks)=} should be {len(self._urls)}, one per shard")
            self._slicer = ChunkSlicer(self, list(sizes), self._chunks)
            self._sizes = [n if c is None else chunk_count(n, c) for n, c in zip(sizes, self._chunks)]
            if fields is not None:
                fields = {*fields, KEYS_EXT}
        self._skip = skip_damaged
        if checksums is not None and len(checksums) != len(self._urls):
            raise ValueError(f"{len(checksums)=} should be {len(self._urls)}, one per shard")
        self._checksums = list(checksums) if checksums is not None else None
        self._fields = frozenset(fields) if fields is not None else None
        self._keep = None if self._fields is None else functools.partial(_keep_member, self._fields)
        self._max_member = max_member
        self._verified: dict[int, ShardFormatError | None] = {}
        self._layouts: OrderedDict[int, ShardLayout | None] = OrderedDict()
        if offsets is not None and len(offsets) != len(self._urls):
            raise ValueError(f"{len(offsets)=} should be {len(self._urls)}, one per shard")
        self._offsets = [tuple(o) for o in offsets] if offsets is not None else None
        self._filesizes = list(filesizes) if filesizes is not None else [None] * len(self._urls)
        self._windows: OrderedDict[tuple[int, int], ShardLayout | None] = OrderedDict()
        self._file: tuple[int, BinaryIO] | None = None
        self._cursor: _Cursor | None = None
        self._ranged = ranged

    def plan(self, runs: Iterable[tuple[int, int, int]]) -> None:
        """The ``(shard, start, stop)`` reads to come, in order: ranged shards fetch ahead."""
        if self._ranged is not None:
            self._ranged.plan(runs)

    def read(self, shard: int, start: int, stop: int) -> Iterator[Item]:
        """Yield the ``stop - start`` items at positions ``start..stop-1`` of shard ``shard``."""
        if self._chunks is not None and self._chunks[shard] is not None:
            return self._slicer.read(shard, start, stop)
        return self._read_units(shard, start, stop)

    def _read_units(self, shard: int, start: int, stop: int) -> Iterator[Item]:
        """Tar samples ``start..stop-1`` of ``shard`` (chunks, in a chunked shard)."""
        url = self._urls[shard]
        if self._ranged is not None and self._ranged.covers(shard):  # every range checked on arrival
            yield from self._read_ranged(self._ranged, shard, start, stop)
            return
        mismatch = self._verify(shard)
        if mismatch is not None:
            if not self._skip:
                raise mismatch
            for i in range(start, stop):
                yield Lost(url, i, str(mismatch))
            return
        if not is_gzip(url) and self._windowed(shard, start, stop):
            yield from self._read_windows(shard, start, stop)
            return
        layout = None if is_gzip(url) else self._scan(shard)
        if layout is None:
            yield from self._read_forward(shard, start, stop)
        else:
            yield from self._read_seek(shard, start, stop, layout)

    def _unit_members(self, shard: int, i: int) -> tuple[str, int, list[tuple[str, int, int]]] | None:
        """``(key, offset, [(field, at, size), ...])`` of tar sample ``i`` of a seekable shard, from
        the index's window or a whole scan (for reading parts of members); None when the shard
        is read forward (gzip, or damaged under ``skip_damaged``)."""
        if is_gzip(self._urls[shard]):
            return None
        if self._offsets is not None and self._offsets[shard] and shard not in self._layouts:
            w = i // OFFSET_STRIDE
            window = self._window(shard, w)
            if window is not None:
                j = i - w * OFFSET_STRIDE
                return window.key(j), int(window.offsets[j]), list(window.fields(j))
        layout = self._scan(shard)
        if layout is None:
            return None
        return layout.key(i), int(layout.offsets[i]), list(layout.fields(i))

    def _windowed(self, shard: int, start: int, stop: int) -> bool:
        """Whether to read ``start..stop-1`` through windows: the index gave offsets, the range
        is short (a block, not a shard), and the whole shard is not scanned already."""
        if self._offsets is None or not self._offsets[shard] or shard in self._layouts:
            return False
        return stop - start <= max(2 * OFFSET_STRIDE, self._sizes[shard] // 4)

    def _read_windows(self, shard: int, start: int, stop: int) -> Iterator[Item]:
        index = start
        while index < stop:
            w = index // OFFSET_STRIDE
            layout = self._window(shard, w)
            if layout is None:  # not as the index says: scan the whole shard, which says why
                full = self._scan(shard)
                if full is None:
                    yield from self._read_forward(shard, index, stop)
                else:
                    yield from self._read_seek(shard, index, stop, full)
                return
            base = w * OFFSET_STRIDE
            end = min(stop, base + len(layout))
            yield from self._read_seek(shard, index, end, layout, base=base)
            index = end

    def _window(self, shard: int, w: int) -> ShardLayout | None:
        """The layout of window ``w`` of ``shard`` (samples ``w * OFFSET_STRIDE`` on), cached;
        None when the shard does not match its index there."""
        key = (shard, w)
        if key in self._windows:
            self._windows.move_to_end(key)
            return self._windows[key]
        offsets = self._offsets[shard]  # type: ignore[index]
        count = min(OFFSET_STRIDE, self._sizes[shard] - w * OFFSET_STRIDE)
        found: ShardLayout | None = None
        if w < len(offsets) and count > 0:
            try:
                f = self._open(shard)
            except (ShardFormatError, *_ReadErrors):
                f = None  # the full scan reports it
            if f is not None:
                found = scan_window(
                    f,
                    start=offsets[w],
                    count=count,
                    next_start=offsets[w + 1] if w + 1 < len(offsets) else None,
                    filesize=self._filesizes[shard],
                    max_member=self._max_member,
                )
        self._windows[key] = found
        if len(self._windows) > _MAX_CACHED_WINDOWS:
            self._windows.popitem(last=False)
        return found

    def close(self) -> None:
        if self._file is not None:
            self._file[1].close()
            self._file = None
        if self._cursor is not None:
            self._cursor.close()
            self._cursor = None

    def _verify(self, shard: int) -> ShardFormatError | None:
        """Why ``shard`` fails its checksum (None: it passes, or nothing is checked); hashed once."""
        if self._checksums is None:
            return None
        if shard not in self._verified:
            url, expected = self._urls[shard], self._checksums[shard]
            try:
                if is_remote(url):  # fetching checks the file against the manifest's sha256
                    self._opener(url)[0].close()
                    found = expected
                elif is_gzip(url):  # the manifest hashes the file, not the tar inside
                    with open_shard(url) as raw:
                        found = file_sha256(raw)
                else:
                    f = self._open(shard)
                    f.seek(0)
                    found = file_sha256(f)
            except (ShardFormatError, *_ReadErrors) as e:  # unreadable, or a fetch that failed
                return damage(url, e)  # not remembered: the next read tries again
            else:
                self._verified[shard] = (
                    None
                    if found == expected
                    else ShardFormatError(
                        f"sha256 {found} does not match the manifest's {expected} (corrupt or replaced; "
                        "`shardify verify` checks every shard)",
                        shard=url,
                    )
                )
        return self._verified[shard]

    def _open(self, shard: int) -> BinaryIO:
        if self._file is not None and self._file[0] == shard:
            return self._file[1]
        self.close()
        f, _ = self._opener(self._urls[shard])
        self._file = (shard, f)
        return f

    def _scan(self, shard: int) -> ShardLayout | None:
        """The layout of a plain tar shard, cached; None sends reads to the forward cursor."""
        if shard in self._layouts:
            self._layouts.move_to_end(shard)
            return self._layouts[shard]
        url = self._urls[shard]
        found: ShardLayout | None
        try:
            f = self._open(shard)
            f.seek(0)
            found = scan_layout(f, shard=url, max_member=self._max_member)
            if len(found) < self._sizes[shard]:
                raise ShardFormatError(f"holds {len(found)} samples, the source says {self._sizes[shard]}", shard=url)
        except (ShardFormatError, *_ReadErrors) as e:
            if not self._skip:
                raise damage(url, e) from e
            found = None  # damaged: read forward and keep what comes before the damage
        self._layouts[shard] = found
        if len(self._layouts) > _MAX_CACHED_SHARDS:
            self._layouts.popitem(last=False)
        return found

    def _read_seek(self, shard: int, start: int, stop: int, layout: ShardLayout, *, base: int = 0) -> Iterator[Item]:
        """Positions ``start..stop-1``; ``layout`` begins at position ``base`` (a window's)."""
        url = self._urls[shard]
        index = start
        error: ShardFormatError | None = None
        try:
            f = self._open(shard)  # scanned in an earlier epoch, maybe deleted since
            while index < stop:
                sample = _read_sample(f, layout, index - base, url, self._fields)
                yield sample
                index += 1
        except (ShardFormatError, *_ReadErrors) as e:
            error = damage(url, e)
            self.close()
            if not self._skip:
                raise error from e
        for i in range(index, stop):
            yield Lost(url, i, str(error))

    def _read_ranged(self, ranged: RangeFetcher, shard: int, start: int, stop: int) -> Iterator[Item]:
        url, index = self._urls[shard], start
        try:
            for data in ranged.samples(shard, start, stop):
                yield parse_sample(
                    data, url=url, offset=ranged.offset(shard, index), keep=self._keep, max_member=self._max_member
                )
                index += 1
        except (ShardFormatError, *_ReadErrors) as e:
            if not self._skip:
                raise damage(url, e) from e
            for i in range(index, stop):
                yield Lost(url, i, str(damage(url, e)))

    def _read_forward(self, shard: int, start: int, stop: int) -> Iterator[Item]:
        url = self._urls[shard]
        cur = self._cursor
        if cur is None or cur.shard != shard or cur.index > start:
            self.close()
            cur = self._cursor = _Cursor(shard, url, self._opener, keep=self._keep, max_member=self._max_member)
        while cur.index < start and cur.error is None:
            cur.next()
        for i in range(start, stop):
            sample = cur.next() if cur.index == i else None
            if sample is not None:
                yield sample
                continue
            if cur.error is None:
                cur.error = ShardFormatError(f"no sample at position {i}", shard=url)
            if not self._skip:
                raise cur.error
            yield Lost(url, i, str(cur.error))


def _keep_member(fields: frozenset[str], name: str) -> bool:
    """Whether the member ``name`` holds one of ``fields`` (a name breaking the key rules is
    kept, so that grouping reports it as it would otherwise)."""
    try:
        return split_member_name(name)[1] in fields
    except KeyRuleError:
        return True
