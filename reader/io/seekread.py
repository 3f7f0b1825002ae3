"""Reading a plain tar shard by seeks: each field of a sample is one read where its layout says.

The layout comes from the shard file object (:class:`~shardify.reader.io.shardfile.ShardFiles`):
for a short range, the split index's windows of ``OFFSET_STRIDE`` samples it falls in (only
their headers are read); otherwise, or when a window is not as the index says, the whole
shard's headers. No header is parsed again once a layout is kept. Only the ``fields`` asked
for are read into memory.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import BinaryIO

from shardify.errors import ShardFormatError
from shardify.reader.io.forward import read_forward
from shardify.reader.io.items import READ_ERRORS, Item, damage
from shardify.reader.io.shardfile import ShardFiles, read_at
from shardify.tarfmt import OFFSET_STRIDE
from shardify.tario import ShardLayout

__all__ = ["read_scanned", "read_windows", "read_seek"]

Fields = Collection[str] | None


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


def read_seek(
    files: ShardFiles, shard: int, start: int, stop: int, layout: ShardLayout, fields: Fields, *, base: int = 0
) -> Iterator[Item]:
    """Positions ``start..stop-1``; ``layout`` begins at position ``base`` (a window's)."""
    url = files.urls[shard]
    index = start
    try:
        f = files.open(shard)  # scanned in an earlier epoch, maybe deleted since
        while index < stop:
            sample = _read_sample(f, layout, index - base, url, fields)
            yield sample
            index += 1
    except (ShardFormatError, *READ_ERRORS) as e:
        files.close()
        yield from files.lost(shard, index, stop, damage(url, e), e)


def read_scanned(files: ShardFiles, shard: int, start: int, stop: int, fields: Fields) -> Iterator[Item]:
    """Positions ``start..stop-1`` by the whole shard's layout, or forward when it is damaged
    (under ``skip_damaged``: what comes before the damage is kept)."""
    layout = files.scan(shard)
    if layout is None:
        yield from read_forward(files.cursor(shard, start), start, stop, skip_damaged=files.skip)
    else:
        yield from read_seek(files, shard, start, stop, layout, fields)


def read_windows(files: ShardFiles, shard: int, start: int, stop: int, fields: Fields) -> Iterator[Item]:
    """Positions ``start..stop-1`` through the index's windows; from the first window that is
    not as the index says, by the whole shard's scan (which says why)."""
    index = start
    while index < stop:
        w = index // OFFSET_STRIDE
        layout = files.window(shard, w)
        if layout is None:
            yield from read_scanned(files, shard, index, stop, fields)
            return
        base = w * OFFSET_STRIDE
        end = min(stop, base + len(layout))
        yield from read_seek(files, shard, index, end, layout, fields, base=base)
        index = end
