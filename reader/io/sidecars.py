"""A shard's per-sample table from its sidecar (:mod:`shardify.sidecar`), loaded when needed.

A split over the writer's threshold keeps each shard's table in ``<shard>.idx`` rather than in
its JSON index. :func:`table_loader` gives what :class:`~shardify.reader.io.ranged.RangeFetcher`
calls the first time a worker reads from the shard: the sidecar of a remote shard comes through
the node's cache (:mod:`~shardify.reader.io.cache`, fetched once per cache folder and checked
against the size and SHA-256 the index records), a local one from disk. A sidecar that cannot be
had, or does not match, raises :class:`~shardify.errors.SidecarError` naming the shard: no
sample is ever read from a wrong table.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from shardify.errors import SidecarError
from shardify.reader.io.cache import FetchOptions
from shardify.reader.io.shardopen import read_whole
from shardify.remote import ShardFetchError
from shardify.sidecar import SidecarRef, decode, sidecar_name

__all__ = ["load_table", "table_loader"]


def load_table(url: str, ref: SidecarRef, *, nsamples: int, filesize: int, fetch: FetchOptions) -> bytes:
    """The checked per-sample table (:mod:`shardify.sampletable` records) of the shard ``url``."""
    name = sidecar_name(url)
    try:
        data = read_whole(name, fetch=fetch, size=ref.size, sha256=ref.sha256)
    except ShardFetchError as e:
        raise SidecarError(f"cannot fetch its sidecar {name}: {e.reason}", shard=url) from e
    except OSError as e:
        raise SidecarError(f"cannot read its sidecar {name}: {e}", shard=url) from e
    return decode(data, shard=url, ref=ref, nsamples=nsamples, filesize=filesize).raw


def table_loader(
    url: str, ref: SidecarRef, *, nsamples: int, filesize: int, fetch: FetchOptions
) -> Callable[[], bytes]:
    """:func:`load_table` of the shard ``url``, to call later (and in a worker process)."""
    return functools.partial(load_table, url, ref, nsamples=nsamples, filesize=filesize, fetch=fetch)
