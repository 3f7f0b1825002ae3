"""Sample key -> global index, without holding every key of a split in memory.

A :class:`KeyIndex` is two sorted columns: each key's 64-bit hash (BLAKE2b) and the sample's
global index in stored order, 16 bytes a sample, nothing else. :meth:`KeyIndex.candidates`
binary-searches the hashes (a hash shared by two keys gives both; the caller reads the sample
and compares its key). :func:`write_key_index` builds it once from a split's shards (each
sample's key is the name in its first tar header, read where the per-sample table says it
starts) and writes it as one file, through a temporary file and ``os.replace``;
:func:`load_key_index` memory-maps it, so a process touches only the pages its searches do
(about 27 of 4 KiB for 10^8 keys) and processes on a node share them.

File layout: ``b"SHKEYIX1"``, the number of samples ``n`` (``<u8``), ``n`` hashes (``<u8``,
ascending), then ``n`` indices (``<u8``).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from shardify.errors import ManifestError
from shardify.reader.io.chunkbytes import ChunkBytes
from shardify.reader.io.items import sample_key
from shardify.reader.io.samplebytes import SampleBytes

__all__ = ["KeyIndex", "key_hash", "split_key_list", "build_key_index", "write_key_index", "load_key_index"]

MAGIC = b"SHKEYIX1"
_HEAD = struct.Struct("<8sQ")


def key_hash(key: str) -> int:
    """The 64-bit hash a key index sorts ``key`` by."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little")


class KeyIndex:
    """Sorted key hashes (``uint64``) and each one's global sample index (``uint64``)."""

    def __init__(self, hashes: np.ndarray, indices: np.ndarray) -> None:
        if len(hashes) != len(indices):
            raise ValueError(f"{len(hashes)=} and {len(indices)=} should be equal")
        self.hashes, self.indices = hashes, indices

    def __len__(self) -> int:
        return len(self.hashes)

    def candidates(self, key: str) -> list[int]:
        """The global indices whose key hashes as ``key`` does (usually one; none: not in the split)."""
        h = np.uint64(key_hash(key))
        lo = int(np.searchsorted(self.hashes, h, side="left"))
        out = []
        while lo < len(self.hashes) and self.hashes[lo] == h:
            out.append(int(self.indices[lo]))
            lo += 1
        return out


def split_key_list(data: SampleBytes, chunks: ChunkBytes | None = None) -> Iterator[str]:
    """Every sample key of ``data``'s source, in stored order: the name of each sample's first
    header (512 bytes read where its table says it starts; a remote shard's are fetched), or
    for a chunked shard (``chunks`` reads them) its chunks' keys members."""
    src = data.source
    chunked = chunks.chunked if chunks is not None else ()
    for shard, n in enumerate(src.sizes):
        if chunks is not None and shard < len(chunked) and chunked[shard]:
            yield from chunks.keys(shard)
            continue
        ends = data.ranges(shard).ends
        f, _ = src.open_tar(src.urls[shard])
        try:
            for i in range(n):
                f.seek(ends[i])
                key = sample_key(f.read(100))
                if key is None:
                    raise ManifestError(f"{src.urls[shard]}: sample {i} does not start with a tar header")
                yield key
        finally:
            f.close()


def build_key_index(keys: Iterable[str]) -> KeyIndex:
    """The :class:`KeyIndex` of ``keys`` (sample ``i`` has the ``i``-th), in memory."""
    hashes = np.fromiter((key_hash(k) for k in keys), dtype="<u8")
    order = np.argsort(hashes, kind="stable")
    return KeyIndex(hashes[order], order.astype("<u8"))


def write_key_index(index: KeyIndex, path: str | os.PathLike[str]) -> None:
    """Write ``index`` to ``path`` (a temporary file beside it, then ``os.replace``)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(_HEAD.pack(MAGIC, len(index)))
        f.write(np.ascontiguousarray(index.hashes, dtype="<u8").tobytes())
        f.write(np.ascontiguousarray(index.indices, dtype="<u8").tobytes())
    os.replace(tmp, path)


def load_key_index(path: str | os.PathLike[str], *, nsamples: int) -> KeyIndex:
    """The key index at ``path``, memory-mapped; ManifestError when it is not one, or not of a
    split of ``nsamples`` samples."""
    with open(path, "rb") as f:
        head = f.read(_HEAD.size)
        size = os.fstat(f.fileno()).st_size
    if len(head) != _HEAD.size or head[:8] != MAGIC:
        raise ManifestError(f"{os.fspath(path)}: not a shardify key index")
    n = _HEAD.unpack(head)[1]
    if n != nsamples or size != _HEAD.size + 16 * n:
        raise ManifestError(
            f"{os.fspath(path)}: a key index of {n} samples ({size} bytes); the split has {nsamples}: "
            "it belongs to another split or version (delete it to build it again)"
        )
    if not n:
        return KeyIndex(np.zeros(0, "<u8"), np.zeros(0, "<u8"))
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(mapped, "madvise"):  # a binary search's reads are random: no readahead around them
        mapped.madvise(mmap.MADV_RANDOM)
    hashes = np.frombuffer(mapped, dtype="<u8", count=n, offset=_HEAD.size)
    return KeyIndex(hashes, np.frombuffer(mapped, dtype="<u8", count=n, offset=_HEAD.size + 8 * n))
