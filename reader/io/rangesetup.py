"""The ranged path wired to a dataset's sources: which shards a worker reads in byte ranges.

:func:`range_fetcher` makes the :class:`~shardify.reader.io.ranged.RangeFetcher` of a worker
from the sources of a dataset (in the order the dataset numbers their shards): a shard is read
in ranges when it is remote, a plain tar with a per-sample table (inline in a JSON index, in a
sidecar, or a compact index's proven sidecar) and its source's ``fetch.ranged`` is on. A compact
index's shards get their table loaders on access, not one per shard up front.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardify.reader.io.cache import FetchOptions
from shardify.reader.io.compact import CompactShards
from shardify.reader.io.ranged import RangeFetcher
from shardify.reader.io.shardfile import Table
from shardify.reader.io.shardlist import ChainedSequence, LazySequence, Repeated
from shardify.reader.io.sidecars import table_loader
from shardify.reader.io.sources import Source, is_gzip
from shardify.reader.io.wholehost import Opener
from shardify.remote import is_remote
from shardify.sidecar import SidecarRef

__all__ = ["range_fetcher"]


def range_fetcher(sources: Sequence[Source]) -> RangeFetcher | None:
    """A fetcher for the shards of ``sources`` (in order, as the dataset numbers them) read in
    ranges: remote, plain tar with a per-sample table (inline, in a sidecar, or a compact index's
    proven sidecar), of a source whose ``fetch.ranged`` is on; None when there is none (every
    shard is read whole, as local files or through the cache). A compact index's shards get
    their table loaders on access, not one per shard up front."""
    urls: list[Sequence[str]] = []
    tables: list[Sequence[Table]] = []
    fetch: list[Sequence[FetchOptions]] = []
    openers: list[Sequence[Opener]] = []
    covered = False
    for src in sources:
        n = len(src.shards)
        column = _tables(src)
        covered = covered or column is not None
        urls.append(src.urls)
        tables.append(column if column is not None else Repeated(n, b""))
        fetch.append(Repeated(n, src.fetch))
        openers.append(Repeated(n, src.open_tar))  # a host that ignores Range: whole shards, checked
    if not covered:
        return None
    return RangeFetcher(
        ChainedSequence(urls), ChainedSequence(tables), ChainedSequence(fetch), openers=ChainedSequence(openers)
    )


def _tables(src: Source) -> Sequence[Table] | None:
    """The tables of ``src``'s shards for ranged reads (b"": read whole); None: none is ranged."""
    shards = src.shards
    if isinstance(shards, CompactShards):
        if not (src.fetch.ranged and len(shards) and is_remote(shards.base)):
            return None
        return LazySequence(len(shards), shards.table_loader)
    column: list[Table] = []
    for sh in shards:
        ranged = src.fetch.ranged and is_remote(sh.url) and sh.chunk is None and not is_gzip(sh.url)
        if ranged and isinstance(sh.sidecar, SidecarRef) and sh.filesize is not None:
            column.append(table_loader(sh.url, sh.sidecar, nsamples=sh.nsamples, filesize=sh.filesize, fetch=src.fetch))
        else:
            column.append(sh.samples if ranged else b"")
    return column if any(column) else None
