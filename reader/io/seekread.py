"""Reading a plain tar shard by seeks, where its layout says each sample's fields lie.

The layout comes from the shard file object (:class:`~shardify.reader.io.shardfile.ShardFiles`):
for a short range, the split index's windows of ``OFFSET_STRIDE`` samples it falls in (only
their headers are read); otherwise, or when a window is not as the index says, the whole
shard's headers. No header is parsed again once a layout is kept.

With the shard's per-sample table (``ranges``, :mod:`shardify.sampletable`), each sample is
checked: consecutive samples, up to ``_GROUP_BYTES`` together, are read in one read, each
sample's bytes (headers and padding too) checked against its CRC-32, and its fields sliced
out where the layout says. A sample that does not match is a
:class:`~shardify.errors.SampleChecksumError` naming the shard and key, for its position only
(under ``skip_damaged`` a :class:`~shardify.reader.io.items.Lost`); a layout that does not
start each sample where the table does (the file is not the one indexed) is damage of the
shard. Without a table, only the ``fields`` asked for are read, one read each.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import BinaryIO

from shardify.crc import crc32
from shardify.errors import ShardFormatError
from shardify.reader.io.forward import read_forward
from shardify.reader.io.items import READ_ERRORS, Item, changed_sample, damage
from shardify.reader.io.shardfile import ShardFiles, read_at
from shardify.reader.io.tableread import read_table
from shardify.sampletable import SampleRanges
from shardify.tarfmt import OFFSET_STRIDE
from shardify.tario import ShardLayout

__all__ = ["read_scanned", "read_windows", "read_seek"]

Fields = Collection[str] | None

_GROUP_BYTES = 64 << 10
"""Consecutive checked samples read in one read, up to this many bytes (a larger one alone)."""


def _read_sample(f: BinaryIO, layout: ShardLayout, i: int, url: str, fields: Fields) -> dict[str, object]:
    """Sample ``i`` of the shard open as ``f``: one read per field in ``fields`` (None: every
    field), where the layout says."""
    key = layout.key(i)
    sample: dict[str, object] = {"__key__": key, "__shard__": url, "__offset__": layout.offsets[i]}
    exts, ext, data, size = layout.exts, layout.ext, layout.data, layout.size
    for j in range(layout.first[i], layout.first[i + 1]):  # layout.fields(i), without a generator a sample
        field = exts[ext[j]]
        if fields is None or field in fields:
            sample[field] = read_at(f, data[j], size[j], url=url, key=key, field=field)
    return sample


def _slice_sample(
    data: bytes, at: int, layout: ShardLayout, k: int, start: int, stop: int, url: str, fields: Fields
) -> dict[str, object]:
    """Sample ``k`` of ``layout`` out of ``data``, the shard's bytes from byte ``at``, where the
    table puts the sample at bytes ``start..stop-1``; damage when the layout does not agree."""
    offset = layout.offsets[k]
    key = layout.key(k)
    sample: dict[str, object] = {"__key__": key, "__shard__": url, "__offset__": offset}
    exts, ext, where, size = layout.exts, layout.ext, layout.data, layout.size
    last = layout.first[k + 1] - 1
    if offset != start or where[last] + size[last] > stop:
        raise ShardFormatError(
            f"sample at byte {offset} is not where the split index's table puts it (the file is not the one indexed)",
            shard=url,
            key=key,
        )
    for j in range(layout.first[k], last + 1):
        field = exts[ext[j]]
        if fields is None or field in fields:
            d = where[j] - at
            sample[field] = data[d : d + size[j]]
    return sample


def _read_checked(
    files: ShardFiles,
    shard: int,
    f: BinaryIO,
    start: int,
    stop: int,
    layout: ShardLayout,
    *,
    base: int,
    ranges: SampleRanges,
    fields: Fields,
) -> Iterator[Item]:
    """Positions ``start..stop-1``, read in groups and each checked against ``ranges``."""
    url = files.urls[shard]
    ends, crcs = ranges.ends, ranges.crcs
    index = start
    while index < stop:
        a = ends[index]
        end = index + 1
        while end < stop and ends[end + 1] - a <= _GROUP_BYTES:
            end += 1
        data = read_at(f, a, ends[end] - a, url=url, key=layout.key(index - base), field="(sample bytes)")
        view = memoryview(data)
        for i in range(index, end):
            s, e = ends[i], ends[i + 1]
            if crc32(view[s - a : e - a]) != crcs[i]:
                bad = changed_sample(i, s, e, url=url, key=layout.key(i - base), remote=False)
                yield from files.lost(shard, i, i + 1, bad)
            else:
                yield _slice_sample(data, a, layout, i - base, s, e, url, fields)
        index = end


def read_seek(
    files: ShardFiles,
    shard: int,
    start: int,
    stop: int,
    layout: ShardLayout,
    fields: Fields,
    *,
    base: int = 0,
    ranges: SampleRanges | None = None,
) -> Iterator[Item]:
    """Positions ``start..stop-1``; ``layout`` begins at position ``base`` (a window's);
    ``ranges``: the shard's table, each sample checked against it."""
    url = files.urls[shard]
    index = start
    try:
        f = files.open(shard)  # scanned in an earlier epoch, maybe deleted since
        if ranges is not None:
            for item in _read_checked(files, shard, f, start, stop, layout, base=base, ranges=ranges, fields=fields):
                yield item
                index += 1
            return
        while index < stop:
            sample = _read_sample(f, layout, index - base, url, fields)
            yield sample
            index += 1
    except (ShardFormatError, *READ_ERRORS) as e:
        files.close()
        yield from files.lost(shard, index, stop, damage(url, e), e)


def read_scanned(
    files: ShardFiles, shard: int, start: int, stop: int, fields: Fields, ranges: SampleRanges | None = None
) -> Iterator[Item]:
    """Positions ``start..stop-1`` by the whole shard's layout; when it is damaged (under
    ``skip_damaged``), by its table (each sample parsed, checked) or else forward (what comes
    before the damage is kept)."""
    layout = files.scan(shard)
    if layout is None and ranges is not None:
        yield from read_table(files, shard, start, stop, ranges)
    elif layout is None:
        yield from read_forward(files.cursor(shard, start), start, stop, skip_damaged=files.skip)
    else:
        yield from read_seek(files, shard, start, stop, layout, fields, ranges=ranges)


def read_windows(
    files: ShardFiles, shard: int, start: int, stop: int, fields: Fields, ranges: SampleRanges | None = None
) -> Iterator[Item]:
    """Positions ``start..stop-1`` through the index's windows; from the first window that is
    not as the index says, by the whole shard's scan (which says why)."""
    index = start
    while index < stop:
        w = index // OFFSET_STRIDE
        layout = files.window(shard, w)
        if layout is None:
            yield from read_scanned(files, shard, index, stop, fields, ranges)
            return
        base = w * OFFSET_STRIDE
        end = min(stop, base + len(layout))
        yield from read_seek(files, shard, index, end, layout, fields, base=base, ranges=ranges)
        index = end
