"""Reading a plain tar shard by its per-sample table, every sample checked against its CRC-32.

When the split index holds a shard's per-sample table (:mod:`shardify.sampletable`: each
sample's length and checksum), a shard read from a file (local, or a remote one fetched whole
into the cache) is read by it: consecutive samples of a range, up to ``_GROUP_BYTES`` together
(a larger sample alone), in one read; each sample's bytes checked against its checksum, then
parsed in one pass (:func:`~shardify.reader.io.sampleparse.parse_sample`), no header scan needed.

A sample whose bytes do not match is a :class:`~shardify.errors.SampleChecksumError` naming
the shard and the key its bytes hold, for that position only: under ``skip_damaged`` it comes
back :class:`~shardify.reader.io.items.Lost` (counted and skipped) and the shard's other
samples are read. A file shorter than its table, or a table that cannot be loaded, is damage
of the shard for the rest of the range (see :meth:`~shardify.reader.io.shardfile.ShardFiles.lost`).
"""

from __future__ import annotations

from collections.abc import Iterator

from shardify.crc import crc32
from shardify.errors import ShardFormatError
from shardify.reader.io.items import READ_ERRORS, Item, changed_sample, damage, sample_key
from shardify.reader.io.sampleparse import parse_sample
from shardify.reader.io.shardfile import ShardFiles
from shardify.sampletable import SampleRanges

__all__ = ["read_table"]

_GROUP_BYTES = 64 << 10
"""Consecutive samples read in one read, up to this many bytes (a larger sample is read alone)."""


def read_table(files: ShardFiles, shard: int, start: int, stop: int, ranges: SampleRanges) -> Iterator[Item]:
    """Positions ``start..stop-1`` of ``shard`` by its table ``ranges``, each checked."""
    url = files.urls[shard]
    index = start
    try:
        f = files.open(shard)
        while index < stop:
            a = ranges[index][0]
            end = index + 1
            while end < stop and ranges[end][1] - a <= _GROUP_BYTES:
                end += 1
            b = ranges[end - 1][1]
            f.seek(a)
            data = f.read(b - a)
            if len(data) != b - a:
                raise ShardFormatError(
                    f"truncated: samples {index}..{end - 1} need bytes {a}-{b - 1}, only {len(data)} are left "
                    "(the file is shorter than its index says)",
                    shard=url,
                )
            alone = end - index == 1
            for i in range(index, end):
                s, e = ranges.ends[i], ranges.ends[i + 1]
                one = data if alone else data[s - a : e - a]
                if crc32(one) != ranges.crcs[i]:
                    bad = changed_sample(i, s, e, url=url, key=sample_key(one), remote=False)
                    yield from files.lost(shard, i, i + 1, bad)
                else:
                    yield parse_sample(one, url=url, offset=s, keep=files.keep, max_member=files.max_member)
                index += 1
    except (ShardFormatError, *READ_ERRORS) as e:
        files.close()
        yield from files.lost(shard, index, stop, damage(url, e), e)
