"""The per-sample tables a worker checks whole-shard reads with, from a dataset's sources.

:func:`sample_tables` gives, in the order the dataset numbers its shards, each shard's
per-sample table (:mod:`shardify.sampletable`) or what loads it: inline in a JSON index, in a
sidecar named by a JSON index, or a compact index's proven sidecar (loaded when the shard is
first read, through the node's cache for a remote one). Shards with none (a list of tar files,
webdataset shards, gzip and chunked shards) get b"": their samples are not checked one by one.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardify.reader.io.compact import CompactShards
from shardify.reader.io.shardfile import Table
from shardify.reader.io.shardlist import ChainedSequence, LazySequence, ShardInfo
from shardify.reader.io.shardopen import is_gzip
from shardify.reader.io.sidecars import table_loader
from shardify.reader.io.source import Source
from shardify.sidecar import SidecarRef

__all__ = ["sample_tables"]


def sample_tables(sources: Sequence[Source]) -> Sequence[Table] | None:
    """Each shard's table or its loader (b"": none), the shards of ``sources`` end to end; None
    when no shard has one."""
    parts: list[Sequence[Table]] = []
    found = False
    for src in sources:
        shards = src.shards
        if isinstance(shards, CompactShards):  # every shard has a sidecar, loaded when first read
            parts.append(LazySequence(len(shards), shards.table_loader))
            found = found or len(shards) > 0
            continue
        column = [_table(sh, src) for sh in shards]
        found = found or any(column)
        parts.append(column)
    return ChainedSequence(parts) if found else None


def _table(sh: ShardInfo, src: Source) -> Table:
    if sh.chunk is not None or is_gzip(sh.url):
        return b""
    if isinstance(sh.sidecar, SidecarRef) and sh.filesize is not None:
        return table_loader(sh.url, sh.sidecar, nsamples=sh.nsamples, filesize=sh.filesize, fetch=src.fetch)
    return sh.samples
