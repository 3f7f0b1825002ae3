"""``split_keys``: the sample keys of a split, in stored order, without decoding any sample.

Stored order is the split's shard order, then each shard's tar order: the order of an
unshuffled epoch on one rank with no workers. Each shard's tar headers are read and member data
is passed over (seeked on a local shard; a remote shard is fetched, a gzip one inflated); a
chunked shard's keys come from its ``chunk-keys`` members (see docs/format.md), the only data read.
"""

from __future__ import annotations

from collections.abc import Iterator

from shardify.chunk import KEYS_EXT, chunk_keys, chunk_samples
from shardify.errors import ShardFormatError
from shardify.reader.io.sources import Source, SourceLike, resolve_source
from shardify.tario import iter_members, iter_samples

__all__ = ["split_keys"]


def split_keys(source: SourceLike | Source, *, split: str | None = None) -> Iterator[str]:
    """Yield the keys of ``split`` of ``source`` (a dataset folder, its manifest or split index,
    tar shards, or a URL of one: what :class:`~shardify.reader.ShardedDataset` takes), in stored order.

    A shard whose sample count differs from the split index's raises ShardFormatError naming it.
    """
    src = source if isinstance(source, Source) else resolve_source(source, split=split)
    for shard in src.shards:
        yield from _shard_keys(src, shard.url, shard.nsamples, shard.chunk)


def _shard_keys(src: Source, url: str, nsamples: int, chunk: int | None) -> Iterator[str]:
    wanted = f".{KEYS_EXT}"
    f, _ = src.open_tar(url)
    count = 0
    try:
        members = iter_members(f, shard=url, keep=lambda name: chunk is not None and name.endswith(wanted))
        for i, sample in enumerate(iter_samples(members, shard=url)):
            key = str(sample["__key__"])
            if chunk is None:
                count += 1
                yield key
                continue
            data = sample.get(KEYS_EXT)
            n = chunk_samples(nsamples, chunk, i)
            if not isinstance(data, bytes):
                raise ShardFormatError(f"chunk {i} has no {KEYS_EXT!r} member", shard=url, key=key)
            try:
                keys = chunk_keys(data, n)
            except ValueError as e:
                raise ShardFormatError(f"chunk {i}: {e}", shard=url, key=key) from e
            count += len(keys)
            yield from keys
    finally:
        f.close()
    if count != nsamples:
        raise ShardFormatError(f"holds {count} samples, the split lists {nsamples}", shard=url)
