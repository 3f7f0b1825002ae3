"""A split read through its compact index (:mod:`shardify.compactindex`): shards known by count.

When the manifest names a compact index for a split, a reader reads it (through the node's cache
for a remote dataset, checked against the size and SHA-256 the manifest records) instead of the
JSON index: one ``uint32`` per shard and the root of the hash tree over the shards' sidecars.
:class:`CompactShards` makes a shard's :class:`~shardify.reader.io.shardlist.ShardInfo` on access
(its URL by the format's naming rule, in the index's folder). What else a reader needs of a shard
(its size and SHA-256, to check a fetched or local copy; its sample offsets, to seek; its
per-sample table, for ranged reads) comes from its sidecar, loaded the first time the shard is
read and checked against the root (:func:`shardify.sidecar.decode_proven`). A process remembers
the size, SHA-256 and offsets of the last :data:`FACTS_KEPT` shards it loaded (about 1 KB each).
A local shard or sidecar that is a link out of the index's folder is refused when it is loaded
(:func:`shardify.locations.check_in_folder`).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from shardify.compactindex import CompactIndex, CompactRef, decode
from shardify.errors import IndexMismatchError, ManifestError, SidecarError
from shardify.locations import check_in_folder
from shardify.reader.io.cache import FetchOptions, forget_remote
from shardify.reader.io.shardlist import ShardInfo, ShardList
from shardify.reader.io.shardopen import read_whole
from shardify.remote import ShardFetchError, is_remote, join_url
from shardify.sidecar import SidecarFacts, SidecarProof, decode_proven, sidecar_name
from shardify.tarfmt import OFFSET_STRIDE, shard_name, shard_of_split

__all__ = ["FACTS_KEPT", "CompactShards", "ShardFacts", "read_compact", "load_facts", "load_sidecar"]

FACTS_KEPT = 8192
"""Shards whose size, SHA-256 and offsets a process keeps (the least recently loaded go first)."""


@dataclass(frozen=True)
class ShardFacts:
    """What a compact shard's sidecar says beyond its count: its size, SHA-256 and sample offsets
    (one every OFFSET_STRIDE samples, as a JSON index records them)."""

    filesize: int
    sha256: str
    offsets: tuple[int, ...]


_facts: OrderedDict[tuple[bytes, int], ShardFacts] = OrderedDict()
_facts_lock = threading.Lock()


def _sidecar_bytes(url: str, proof: SidecarProof, fetch: FetchOptions) -> bytes:
    """The bytes of the sidecar of the shard ``url``: remote ones through the node's cache (keyed
    by the tree's root, so a sidecar of another version is never taken for this one's)."""
    name = sidecar_name(url)
    try:
        return read_whole(name, fetch=fetch, key=_cache_key(proof))
    except ShardFetchError as e:
        raise SidecarError(f"cannot fetch its sidecar {name}: {e.reason}", shard=url) from e
    except OSError as e:
        raise SidecarError(f"cannot read its sidecar {name}: {e}", shard=url) from e


def _cache_key(proof: SidecarProof) -> str:
    return f"root:{proof.root.hex()}"


def load_sidecar(url: str, proof: SidecarProof, *, nsamples: int, fetch: FetchOptions) -> SidecarFacts:
    """The checked sidecar of the compact shard ``url``; its facts are remembered. A remote
    sidecar that fails its checks is dropped from the cache, so that the next read fetches it again.
    A local shard and its sidecar must really be in their folder (a link elsewhere is refused
    unless ``fetch.allow_locations`` lists where it goes): checked here, once per shard loaded,
    since every read of a compact shard needs its facts first."""
    if not is_remote(url):
        for path in (url, sidecar_name(url)):
            check_in_folder(os.path.dirname(url), path, allow=fetch.allow_locations)
    try:
        facts = decode_proven(_sidecar_bytes(url, proof, fetch), shard=url, proof=proof, nsamples=nsamples)
    except SidecarError:
        if is_remote(url):
            forget_remote(sidecar_name(url), options=fetch, key=_cache_key(proof))
        raise
    kept = ShardFacts(facts.filesize, facts.sha256, tuple(facts.table.starts()[::OFFSET_STRIDE].tolist()))
    with _facts_lock:
        _facts[(proof.root, proof.index)] = kept
        _facts.move_to_end((proof.root, proof.index))
        while len(_facts) > FACTS_KEPT:
            _facts.popitem(last=False)
    return facts


def load_facts(url: str, proof: SidecarProof, *, nsamples: int, fetch: FetchOptions) -> ShardFacts:
    """The size, SHA-256 and offsets of the compact shard ``url`` (its sidecar loaded if not known)."""
    with _facts_lock:
        found = _facts.get((proof.root, proof.index))
        if found is not None:
            _facts.move_to_end((proof.root, proof.index))
            return found
    load_sidecar(url, proof, nsamples=nsamples, fetch=fetch)
    with _facts_lock:
        return _facts[(proof.root, proof.index)]


class CompactShards(ShardList):
    """The shards of a compact index in the folder ``base`` (a path or URL prefix ending in its
    separator): shard ``i`` is ``base + shard_name(split, i, version)`` of ``counts[i]`` samples."""

    def __init__(
        self, *, base: str, split: str, version: str, counts: npt.NDArray[np.uint32], root: bytes, fetch: FetchOptions
    ) -> None:
        self.base, self.split, self.version, self.root, self.fetch = base, split, version, root, fetch
        self.counts = counts
        super().__init__(len(counts), self._info)

    def url(self, i: int) -> str:
        return self.base + shard_name(self.split, i, self.version)

    def _proof(self, i: int) -> SidecarProof:
        return SidecarProof(self.root, i, len(self.counts))

    def _info(self, i: int) -> ShardInfo:
        return ShardInfo(url=self.url(i), nsamples=int(self.counts[i]), sidecar=self._proof(i))

    def full(self, i: int) -> ShardInfo:
        info = self[i]
        if i < 0:
            i += len(self)
        facts = load_facts(info.url, self._proof(i), nsamples=info.nsamples, fetch=self.fetch)
        return ShardInfo(
            url=info.url,
            nsamples=info.nsamples,
            filesize=facts.filesize,
            sha256=facts.sha256,
            offsets=facts.offsets,
            sidecar=info.sidecar,
        )

    def table_loader(self, i: int) -> Callable[[], bytes]:
        """What loads shard ``i``'s per-sample table from its sidecar (for ranged reads)."""
        url, proof, nsamples = self.url(i), self._proof(i), int(self.counts[i])
        return lambda: load_sidecar(url, proof, nsamples=nsamples, fetch=self.fetch).table.raw

    def index_of(self, url: str) -> int | None:
        """The number of the shard ``url`` (None: not one of these shards)."""
        if not url.startswith(self.base):
            return None
        found = shard_of_split(url[len(self.base) :], self.split)
        if found is None or found[0] != self.version or not 0 <= found[1] < len(self):
            return None
        return found[1] if self.url(found[1]) == url else None

    @property
    def sizes(self) -> list[int]:
        return list(self.counts.tolist())


def compact_base(index_at: str) -> str:
    """The folder of the index at ``index_at`` (a path or URL), ending in its separator."""
    if "://" in index_at:
        return join_url(index_at, "x")[:-1]
    return str(Path(index_at).parent) + os.sep


def read_compact(index_at: str, ref: CompactRef, fetch: FetchOptions, *, split: str | None = None) -> CompactIndex:
    """The compact index of ``split`` at ``index_at``, checked against the manifest's ``ref``: a
    remote one is fetched once per node through the cache (``fetch.cache_dir``, its copy named by
    the SHA-256 the manifest records), a local one read. Bytes that are not the manifest's are an
    :class:`IndexMismatchError` at once (not a fetch to retry), and a remote copy of them is
    dropped from the cache."""
    key = f"sha256:{ref.sha256}"
    try:
        data = read_whole(index_at, fetch=fetch, key=key)
    except ShardFetchError as e:
        raise ManifestError(f"{index_at}: cannot read the compact index: {e.reason}") from e
    except OSError as e:
        raise ManifestError(f"{index_at}: cannot read the compact index: {e}") from e
    try:
        if len(data) != ref.size:
            raise IndexMismatchError(
                f"{index_at}: split {split!r}: the compact index is {len(data)} bytes, the manifest says {ref.size}",
                split=split,
            )
        return decode(data, source=index_at, sha256=ref.sha256, split=split)
    except ManifestError:
        if is_remote(index_at):
            forget_remote(index_at, options=fetch, key=key)
        raise
