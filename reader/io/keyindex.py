"""Sample key -> global index, without holding every key of a split in memory.

A :class:`KeyIndex` is two sorted columns: each key's 64-bit hash (BLAKE2b) and the sample's
global index in stored order, 16 bytes a sample, nothing else. :meth:`KeyIndex.candidates`
binary-searches the hashes (a hash shared by two keys gives both; the caller reads the sample
and compares its key). :func:`build_key_index` builds it in memory from a split's keys (each
sample's key is the name in its first tar header, read where the per-sample table says it
starts: :func:`split_key_list`) and :func:`write_key_index` writes it as one file, through a
temporary file and ``os.replace``; :func:`write_key_file` writes the same file in bounded
memory (buckets by hash on disk, each sorted alone), for a split of any size;
:func:`load_key_index` memory-maps it, so a process touches only the pages its searches do
(about 27 of 4 KiB for 10^8 keys) and processes on a node share them.

File layout: ``b"SHKEYIX1"``, the number of samples ``n`` (``<u8``), ``n`` hashes (``<u8``,
ascending), then ``n`` indices (``<u8``).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import mmap
import os
import struct
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np

from shardify.errors import ManifestError
from shardify.reader.io.chunkbytes import ChunkBytes
from shardify.reader.io.items import sample_key
from shardify.reader.io.samplebytes import SampleBytes

__all__ = [
    "KeyIndex",
    "key_hash",
    "split_key_list",
    "build_key_index",
    "write_key_index",
    "write_key_file",
    "load_key_index",
]

MAGIC = b"SHKEYIX1"
_HEAD = struct.Struct("<8sQ")
_RECORD = np.dtype([("hash", "<u8"), ("index", "<u8")])
BUCKET_BYTES = 64 << 20
"""About the most memory one bucket of :func:`write_key_file` takes when it is sorted."""


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


def write_key_file(
    keys: Iterable[str],
    path: str | os.PathLike[str],
    *,
    nsamples: int,
    bucket_bytes: int = BUCKET_BYTES,
    block: int = 1 << 20,
) -> None:
    """Write the key index of ``keys`` (``nsamples`` of them; sample ``i`` has the ``i``-th) to
    ``path`` in bounded memory: the file :func:`write_key_index` writes for
    ``build_key_index(keys)``, byte for byte. The keys are hashed ``block`` at a time and each
    ``(hash, index)`` appended to the bucket of its hash's top bits (files in a temporary
    folder beside ``path``), as many buckets as keep one within about ``bucket_bytes``; each
    bucket is then sorted alone and written in place (the hashes are uniform, so the buckets
    are even). ValueError when ``keys`` holds another number of keys than ``nsamples``."""
    path = Path(path)
    bits = max(0, math.ceil(math.log2(max(1, nsamples * 16 / bucket_bytes))))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as work:
        buckets = [open(os.path.join(work, f"{b}"), "wb") for b in range(1 << bits)]  # noqa: SIM115 - closed below
        try:
            n = _spill(iter(keys), buckets, bits, block)
        finally:
            for f in buckets:
                f.close()
        if n != nsamples:
            raise ValueError(f"{n} keys for a split of {nsamples} samples")
        try:
            with open(tmp, "wb") as out:
                out.write(_HEAD.pack(MAGIC, n))
                at = 0
                for b in range(1 << bits):
                    records = np.fromfile(os.path.join(work, f"{b}"), dtype=_RECORD)
                    records = records[np.argsort(records["hash"], kind="stable")]  # (ties: stored order)
                    out.seek(_HEAD.size + 8 * at)
                    out.write(records["hash"].tobytes())
                    out.seek(_HEAD.size + 8 * (n + at))
                    out.write(records["index"].tobytes())
                    at += len(records)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def _spill(keys: Iterator[str], buckets: Sequence[BinaryIO], bits: int, block: int) -> int:
    """Append ``(hash, index)`` of each of ``keys`` to the bucket of its hash's top ``bits``,
    ``block`` keys at a time; the number of keys."""
    n = 0
    while True:
        hashes = np.fromiter((key_hash(k) for k in itertools.islice(keys, block)), dtype="<u8")
        if not len(hashes):
            return n
        records = np.empty(len(hashes), dtype=_RECORD)
        records["hash"], records["index"] = hashes, np.arange(n, n + len(hashes), dtype="<u8")
        n += len(hashes)
        if bits == 0:
            buckets[0].write(records.tobytes())
            continue
        which = hashes >> np.uint64(64 - bits)
        order = np.argsort(which, kind="stable")
        records, which = records[order], which[order]
        cuts = np.flatnonzero(np.diff(which)) + 1
        for part in np.split(records, cuts):
            buckets[int(part["hash"][0] >> np.uint64(64 - bits))].write(part.tobytes())


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
