"""The shards of one reading process: opened one at a time, checked once, their layouts kept.

:class:`ShardFiles` is what every read strategy of :class:`~shardify.reader.io.stream.ShardReader`
stands on: it opens a shard (one file open at a time; a forward :class:`Cursor` counts as
one), checks its SHA-256 against the manifest's before its first sample is used (once per
shard and process, and again when a local shard's file changed since: its size, mtime, ctime
or inode, looked at before each read), keeps its per-sample table (from the index or a
sidecar, loaded when first read), and finds where its samples lie (a whole header scan, or the split
index's windows of ``OFFSET_STRIDE`` samples), keeping what it found. Damage is handled in
one place: :meth:`ShardFiles.lost` raises it, or under ``skip_damaged`` turns every position
it spoils into a :class:`~shardify.reader.io.items.Lost`. :func:`read_at` is the one read of
a member's bytes at a known offset, and says so when the file is shorter than its scan.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO, TypeVar

from shardify.errors import ShardFormatError
from shardify.jsonfiles import file_sha256
from shardify.reader.io.forward import Cursor
from shardify.reader.io.items import READ_ERRORS, Lost, damage
from shardify.reader.io.shardlist import LazySequence
from shardify.reader.io.shardopen import is_gzip, local_path, open_shard
from shardify.remote import is_remote
from shardify.sampletable import RECORD, SampleRanges, SampleTable
from shardify.tarfmt import OFFSET_STRIDE
from shardify.tario import KeepMember, ShardLayout, scan_layout, scan_window

__all__ = ["ShardFiles", "ShardChecks", "Table", "FileStamp", "file_stamp", "read_at"]

_MAX_CACHED_SHARDS = 1024
_MAX_CACHED_WINDOWS = 16384
_MAX_CACHED_TABLE_BYTES = 64 << 20
"""Per-sample tables kept per reader, in bytes (16 a sample: its record and its end)."""

Opener = Callable[[str], tuple[BinaryIO, bool]]


FileStamp = tuple[int, int, int, int]
"""A local file's size, mtime and ctime (ns) and inode: any write, replacement or touch changes it."""


def _ranges_bytes(ranges: SampleRanges) -> int:
    return len(ranges) * (RECORD.size + 8)


def file_stamp(url: str) -> FileStamp | None:
    """The :data:`FileStamp` of the local shard ``url`` (None for a remote one, checked as it is
    fetched); OSError when it cannot be had."""
    if is_remote(url):
        return None
    st = os.stat(local_path(url))
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def read_at(f: BinaryIO, at: int, size: int, *, url: str, key: str, field: str) -> bytes:
    """The ``size`` bytes of ``field`` at byte ``at`` of the shard open as ``f``; a shorter
    read (the file shrank since it was scanned) is damage naming the shard and key."""
    f.seek(at)
    data = f.read(size)
    if len(data) != size:  # the file shrank since it was scanned
        raise ShardFormatError(
            f"truncated: field {field!r} needs {size} bytes at byte {at}, only {len(data)} left", shard=url, key=key
        )
    return data


Table = bytes | Callable[[], bytes]
"""A shard's per-sample table (:mod:`shardify.sampletable`; b"": none), or what loads it (a sidecar)."""


@dataclass(frozen=True, slots=True)
class ShardChecks:
    """What the index says of each shard, for checking the file against it: ``checksums``
    (hex SHA-256, None: not checked), ``offsets`` (bytes of samples 0, OFFSET_STRIDE, ...;
    None or empty: not known), ``filesizes`` (None: not known) and ``tables`` (each shard's
    per-sample table, or its loader; None or b"": none, its samples are not checked)."""

    checksums: Sequence[str] | None = None
    offsets: Sequence[Sequence[int]] | None = None
    filesizes: Sequence[int | None] | None = None
    tables: Sequence[Table] | None = None


T = TypeVar("T")


def _column(values: Sequence[T] | None) -> Sequence[T] | None:
    """A per-shard column as given: a list copied, a lazy one (values made on access) kept."""
    if values is None or isinstance(values, LazySequence):
        return values
    return list(values)


class ShardFiles:
    """The shards ``urls`` of one reader, ``sizes`` tar samples each (chunks, in a chunked
    shard), opened with ``opener``; ``skip_damaged``: damage becomes Lost positions."""

    def __init__(
        self,
        urls: Sequence[str],
        sizes: Sequence[int],
        *,
        skip_damaged: bool,
        opener: Opener,
        checks: ShardChecks,
        max_member: int,
        keep: KeepMember | None,
    ) -> None:
        self.urls = urls if isinstance(urls, LazySequence) else list(urls)  # a shard list's: made on access
        self.sizes = list(sizes)
        self.skip = skip_damaged
        self.max_member = max_member
        self.keep = keep
        self._opener = opener
        for name in ("checksums", "offsets", "filesizes", "tables"):
            given = getattr(checks, name)
            if given is not None and len(given) != len(self.urls):
                raise ValueError(f"{name}= has {len(given)} entries, should have {len(self.urls)}, one per shard")
        self._checksums = _column(checks.checksums)
        self._offsets = _column(checks.offsets)
        self._filesizes: Sequence[int | None] = _column(checks.filesizes) or [None] * len(self.urls)
        self._tables = _column(checks.tables)
        self._ranges: OrderedDict[int, SampleRanges] = OrderedDict()
        self._ranges_bytes = 0
        self._verified: dict[int, tuple[FileStamp | None, ShardFormatError | None]] = {}
        self._layouts: OrderedDict[int, ShardLayout | None] = OrderedDict()
        self._windows: OrderedDict[tuple[int, int], ShardLayout | None] = OrderedDict()
        self._file: tuple[int, BinaryIO] | None = None
        self._cursor: Cursor | None = None

    # -- damage --------------------------------------------------------------------------------
    def lost(
        self, shard: int, start: int, stop: int, error: ShardFormatError, cause: BaseException | None = None
    ) -> Iterator[Lost]:
        """Positions ``start..stop-1`` of ``shard`` spoiled by ``error``: raised (from
        ``cause``, the exception it stands for), or under ``skip_damaged`` one Lost each."""
        if not self.skip:
            if cause is None or cause is error:
                raise error
            raise error from cause
        url, reason = self.urls[shard], str(error)
        for i in range(start, stop):
            yield Lost(url, i, reason)

    def refused(self, shard: int, start: int, stop: int) -> Iterator[Lost] | None:
        """None when ``shard`` passes its checksum (or none is checked); else the damage of
        every position asked for (see :meth:`lost`)."""
        mismatch = self.unknown(shard) or self.verify(shard)
        return None if mismatch is None else self.lost(shard, start, stop, mismatch)

    def unknown(self, shard: int) -> ShardFormatError | None:
        """Why what the index knows of ``shard`` cannot be had (None: it can): a compact index's
        shard's size and offsets come from its sidecar, which may be missing or not this shard's."""
        try:
            if self._offsets is not None:
                self._offsets[shard]
            self._filesizes[shard]
        except ShardFormatError as e:
            return e
        return None

    def verify(self, shard: int) -> ShardFormatError | None:
        """Why ``shard`` fails its checksum (None: it passes, or nothing is checked); hashed once,
        and again when a local shard's file changed since (its size, mtime, ctime or inode)."""
        if self._checksums is None:
            return None
        url = self.urls[shard]
        try:
            stamp = file_stamp(url)
        except OSError as e:
            return damage(url, e)  # not remembered: the next read tries again
        known = self._verified.get(shard)
        if known is not None and known[0] == stamp:
            return known[1]
        if known is not None:  # changed since it was hashed: what was kept of the old file goes
            self.forget(shard)
        expected = self._checksums[shard]
        try:
            if is_remote(url):  # fetching checks the file against the manifest's sha256
                self._opener(url)[0].close()
                found = expected
            elif is_gzip(url):  # the manifest hashes the file, not the tar inside
                with open_shard(url) as raw:
                    found = file_sha256(raw)
            else:
                f = self.open(shard)
                f.seek(0)
                found = file_sha256(f)
        except (ShardFormatError, *READ_ERRORS) as e:  # unreadable, or a fetch that failed
            return damage(url, e)  # not remembered: the next read tries again
        verdict = (
            None
            if found == expected
            else ShardFormatError(
                f"sha256 {found} does not match the manifest's {expected} (corrupt or replaced; "
                "`shardify verify` checks every shard)",
                shard=url,
            )
        )
        self._verified[shard] = (stamp, verdict)
        return verdict

    def forget(self, shard: int) -> None:
        """Drop what was kept of ``shard``'s file (its open handle, layouts, windows): it changed."""
        if (self._file is not None and self._file[0] == shard) or (
            self._cursor is not None and self._cursor.shard == shard
        ):
            self.close()
        self._layouts.pop(shard, None)
        for key in [k for k in self._windows if k[0] == shard]:
            del self._windows[key]

    # -- files ---------------------------------------------------------------------------------
    def open(self, shard: int) -> BinaryIO:
        """``shard`` open for seeks (closing whatever else was open)."""
        if self._file is not None and self._file[0] == shard:
            return self._file[1]
        self.close()
        f, _ = self._opener(self.urls[shard])
        self._file = (shard, f)
        return f

    def cursor(self, shard: int, start: int) -> Cursor:
        """A forward cursor over ``shard`` at or before position ``start`` (the open one when
        it is not past ``start``; else a new one, closing whatever else was open)."""
        cur = self._cursor
        if cur is None or cur.shard != shard or cur.index > start:
            self.close()
            cur = self._cursor = Cursor(
                shard, self.urls[shard], self._opener, keep=self.keep, max_member=self.max_member
            )
        return cur

    def close(self) -> None:
        if self._file is not None:
            self._file[1].close()
            self._file = None
        if self._cursor is not None:
            self._cursor.close()
            self._cursor = None

    # -- layouts -------------------------------------------------------------------------------
    def sample_ranges(self, shard: int) -> SampleRanges | None:
        """Where each sample of ``shard`` lies and its checksum, from its per-sample table (None:
        it has none); kept, the most recently used up to ``_MAX_CACHED_TABLE_BYTES``. A table
        that cannot be loaded (a sidecar missing or not this shard's) raises its error, naming
        the shard."""
        if self._tables is None:
            return None
        found = self._ranges.get(shard)
        if found is not None:
            self._ranges.move_to_end(shard)
            return found
        table = self._tables[shard]
        if callable(table):
            table = table()
        if not table:
            return None
        found = self._ranges[shard] = SampleTable(table).ranges()
        self._ranges_bytes += _ranges_bytes(found)
        while self._ranges_bytes > _MAX_CACHED_TABLE_BYTES and len(self._ranges) > 1:
            self._ranges_bytes -= _ranges_bytes(self._ranges.popitem(last=False)[1])
        return found

    def seekable(self, shard: int) -> bool:
        """Whether ``shard`` can be read by seeks (a plain tar, not gzip)."""
        return not is_gzip(self.urls[shard])

    def windowed(self, shard: int, start: int, stop: int) -> bool:
        """Whether to read ``start..stop-1`` through windows: the index gave offsets, the range
        is short (a block, not a shard), and the whole shard is not scanned already."""
        if self._offsets is None or not self._offsets[shard] or shard in self._layouts:
            return False
        return stop - start <= max(2 * OFFSET_STRIDE, self.sizes[shard] // 4)

    def scan(self, shard: int) -> ShardLayout | None:
        """The layout of a plain tar shard, cached; None: damaged under ``skip_damaged``, to be
        read forward (keeping what comes before the damage)."""
        if shard in self._layouts:
            self._layouts.move_to_end(shard)
            return self._layouts[shard]
        url = self.urls[shard]
        found: ShardLayout | None
        try:
            f = self.open(shard)
            f.seek(0)
            found = scan_layout(f, shard=url, max_member=self.max_member)
            if len(found) < self.sizes[shard]:
                raise ShardFormatError(f"holds {len(found)} samples, the source says {self.sizes[shard]}", shard=url)
        except (ShardFormatError, *READ_ERRORS) as e:
            if not self.skip:
                raise damage(url, e) from e
            found = None
        self._layouts[shard] = found
        if len(self._layouts) > _MAX_CACHED_SHARDS:
            self._layouts.popitem(last=False)
        return found

    def window(self, shard: int, w: int) -> ShardLayout | None:
        """The layout of window ``w`` of ``shard`` (samples ``w * OFFSET_STRIDE`` on), cached;
        None when the shard does not match its index there."""
        key = (shard, w)
        if key in self._windows:
            self._windows.move_to_end(key)
            return self._windows[key]
        offsets = self._offsets[shard] if self._offsets is not None else ()
        count = min(OFFSET_STRIDE, self.sizes[shard] - w * OFFSET_STRIDE)
        found: ShardLayout | None = None
        if w < len(offsets) and count > 0:
            try:
                f: BinaryIO | None = self.open(shard)
            except (ShardFormatError, *READ_ERRORS):
                f = None  # the full scan reports it
            if f is not None:
                found = scan_window(
                    f,
                    start=offsets[w],
                    count=count,
                    next_start=offsets[w + 1] if w + 1 < len(offsets) else None,
                    filesize=self._filesizes[shard],
                    max_member=self.max_member,
                )
        self._windows[key] = found
        if len(self._windows) > _MAX_CACHED_WINDOWS:
            self._windows.popitem(last=False)
        return found

    def unit_members(self, shard: int, i: int) -> tuple[str, int, list[tuple[str, int, int]]] | None:
        """``(key, offset, [(field, at, size), ...])`` of tar sample ``i`` of a seekable shard, from
        the index's window or a whole scan (for reading parts of members); None when the shard
        is read forward (gzip, or damaged under ``skip_damaged``)."""
        if not self.seekable(shard):
            return None
        if self._offsets is not None and self._offsets[shard] and shard not in self._layouts:
            w = i // OFFSET_STRIDE
            window = self.window(shard, w)
            if window is not None:
                j = i - w * OFFSET_STRIDE
                return window.key(j), int(window.offsets[j]), list(window.fields(j))
        layout = self.scan(shard)
        if layout is None:
            return None
        return layout.key(i), int(layout.offsets[i]), list(layout.fields(i))
