"""``MapDataset``: a converted split as a map-style ``Dataset``, by index and by key.

``len(ds)``, ``ds[i]`` (global index in stored order: shard order, then tar order),
``ds.get(key)`` and ``ds.__getitems__(indices)`` (torch's batched fetch: a ``DataLoader`` gets
a batch in one call). A batch's samples are read together: a per-sample shard's by the split
index's per-sample table (:mod:`~shardify.reader.io.samplebytes`: copied out of a memory map
locally, ranged requests remotely, coalesced and concurrent, or the shard fetched whole with
``CacheOptions(ranged=False)``; every sample checked; batches drawn through
:class:`~shardify.reader.mapahead.FetchAhead` fetched before they are asked for), their
headers parsed at once (:mod:`~shardify.reader.io.tarbatch`); a chunked shard's as rows of their chunks
(:mod:`~shardify.reader.io.chunkbytes`). Without ``transform=`` and ``map=``, fixed ``.npy``
fields and labels are decoded for the whole batch (:mod:`~shardify.reader.mapbatch`); anything
else is decoded and transformed by the streaming reader's
:class:`~shardify.reader.sample.processor.SampleProcessor`: the same output fields, and the same
augmentation for the same (seed, epoch, key) (:meth:`MapDataset.set_epoch`). Any sampler works
(``shuffle=True``, ``RandomSampler``, ``WeightedRandomSampler``, ``DistributedSampler``,
``BatchSampler``); a worker gets the resolved source and options, opening its own files.

Keys: :mod:`~shardify.reader.io.keyindex`, built on the first ``get`` (in memory, 16 bytes a
sample) or kept in the file ``key_index=`` (built there once in bounded memory, then
memory-mapped).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from shardify.errors import SampleError, ShardFormatError
from shardify.reader.io.chunkbytes import ChunkBytes
from shardify.reader.io.items import sample_key
from shardify.reader.io.keyindex import KeyIndex, build_key_index, load_key_index, split_key_list, write_key_file
from shardify.reader.io.samplebytes import Got, SampleBytes
from shardify.reader.io.sampleparse import parse_sample
from shardify.reader.io.source import shard_columns
from shardify.reader.io.sources import Source, SourceLike, resolve_source
from shardify.reader.io.tarbatch import parse_batch
from shardify.reader.mapahead import AheadBatch, batches_for_worker
from shardify.reader.mapbatch import BatchList, FieldBatch, collate, fast_outputs, sample_dict
from shardify.reader.options import CacheOptions, DecodeOptions
from shardify.reader.sample.bad import Bad
from shardify.reader.sample.fields import output_fields
from shardify.reader.sample.processor import SampleProcessor, selected_fields

__all__ = ["MapDataset"]


class MapDataset(torch.utils.data.Dataset[Any]):
    """Random access to ``split`` of ``source`` (what :class:`~shardify.reader.ShardedDataset`
    takes); see the module. ``fields``, ``transform``, ``map``, ``seed``: as there, per
    sample. ``decoding.on_error="skip"``: a damaged sample is left out of a
    ``__getitems__`` batch (logged nowhere, so counted in :attr:`skipped`); ``ds[i]`` and
    ``get`` raise for it either way. ``key_index``: a file to keep the key index in."""

    def __init__(
        self,
        source: SourceLike | Source,
        *,
        split: str | None = None,
        fields: Sequence[str] | None = None,
        transform: Callable[..., Any] | None = None,
        map: Callable[[dict[str, Any]], Any] | None = None,
        seed: int = 0,
        decoding: DecodeOptions | None = None,
        cache: CacheOptions | None = None,
        key_index: str | os.PathLike[str] | None = None,
    ) -> None:
        self.decoding = decoding or DecodeOptions()
        c = cache or CacheOptions()
        if fields is not None and map is not None:
            raise ValueError("pass fields=... or map=..., not both")
        if isinstance(source, Source):
            src = source
        else:
            src = resolve_source(
                source,
                split=split,
                cache_dir=c.dir,
                cache_limit_bytes=c.limit_bytes,
                retry=c.retry,
                allow_locations=c.allow_locations,
                requests=c.requests,
            )
        self.source = src
        columns = (fields,) if isinstance(fields, str) else fields
        where = f"{src.name} split {src.split!r}"
        self.fields: tuple[str, ...] = () if map is not None else output_fields(None, src.fields, where=where)
        if columns is not None:  # checked against the split ("__key__" passes), kept as given
            output_fields(tuple(f for f in columns if f != "__key__"), src.fields, where=where)
            self.fields = tuple(columns)
        self.seed, self.epoch = seed, 0
        self._transform, self._map = transform, map
        self._bytes = SampleBytes(src, threads=c.requests, whole=not c.ranged)  # a batch's requests at once
        chunks = shard_columns(src).chunks or ()
        per = np.fromiter((n or 0 for n in chunks), np.int64, len(chunks)) if chunks else np.zeros(0, np.int64)
        self._chunked = per if per.any() else None  # samples per chunk of each shard (0: per-sample layout)
        self._chunk_bytes: ChunkBytes | None = None
        if self._chunked is not None:
            read = None if map is not None else selected_fields(tuple(f for f in self.fields if f != "__key__"))
            self._chunk_bytes = ChunkBytes(
                src, chunks=per.tolist(), fields=read, max_member=self.decoding.max_member_bytes
            )
        self._starts = np.zeros(len(src.sizes) + 1, dtype=np.int64)
        np.cumsum(src.sizes, out=self._starts[1:])
        self._key_path = os.fspath(key_index) if key_index is not None else None
        self._keys: KeyIndex | None = None
        self.skipped = 0
        self._ahead_run, self._ahead_last = -1, -1  # the FetchAhead iteration seen last, its last batch fetched ahead
        self._processor = self._make_processor()

    def _make_processor(self) -> SampleProcessor:
        return SampleProcessor(
            seed=self.seed,
            epoch=self.epoch,
            transform=self._transform,
            fields=self.fields,
            map=self._map,
            allow_pickle=self.decoding.allow_pickle,
            skip_errors=self.decoding.on_error == "skip",
            unique_keys=self.source.unique_keys,
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if self._key_path is None:
            state["_keys"] = None  # an in-memory index stays in its process; a worker that needs one builds it
        elif self._keys is not None:
            state["_keys"] = None  # memory-mapped again where it is used
        return state

    def set_epoch(self, epoch: int) -> None:
        """The epoch that seeds each sample's augmentation (with ``seed`` and its key); call it
        before each epoch's iteration starts (workers that are not ``persistent_workers``
        get it then)."""
        self.epoch = epoch
        self._processor = self._make_processor()

    def __len__(self) -> int:
        return int(self._starts[-1])

    def locate(self, index: int) -> tuple[int, int]:
        """``(shard, position)`` of global ``index`` (negative: from the end); IndexError."""
        n = len(self)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError(f"index {index} out of range for {self.source.name} split {self.source.split!r} of {n}")
        shard = int(np.searchsorted(self._starts, i, side="right")) - 1
        return shard, i - int(self._starts[shard])

    def _locate_many(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(shards, positions)`` of each of ``indices`` (:meth:`locate`'s, at one NumPy search)."""
        i = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        i = np.where(i < 0, i + n, i)
        bad = (i < 0) | (i >= n)
        if bad.any():
            self.locate(int(np.asarray(indices).reshape(-1)[bad][0]))  # raises, naming it
        shards = np.searchsorted(self._starts, i, side="right") - 1
        return shards, i - self._starts[shards]

    def __getitem__(self, index: int) -> Any:
        shard, pos = self.locate(int(index))
        return self._batch(np.array([shard]), np.array([pos]), strict=True)[0]

    collate = staticmethod(collate)
    """``DataLoader(ds, collate_fn=ds.collate)``: ``default_collate``'s batch, made in one step
    for a batch of fields decoded together (:mod:`~shardify.reader.mapbatch`); inside a worker,
    made in shared memory the worker reuses once the batch is freed (:mod:`~shardify.reader.mapslots`)."""

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The samples at ``indices``, read together (grouped by shard, remote neighbours
        coalesced and fetched concurrently) and decoded as a batch where the fields allow
        (:mod:`~shardify.reader.mapbatch`); damaged ones left out under ``on_error="skip"``."""
        if isinstance(indices, AheadBatch):
            self._fetch_ahead(indices)
        out = self._batch(*self._locate_many(indices), strict=False)
        if isinstance(out, BatchList):
            return out
        kept = [item for item in out if not isinstance(item, Bad)]
        self.skipped += len(out) - len(kept)
        return kept

    def _fetch_ahead(self, batch: AheadBatch) -> None:
        """Start fetching the batches of ``batch.ahead`` this process gets next (the ranged
        samples of per-sample shards; :mod:`~shardify.reader.mapahead`), each batch once."""
        info = get_worker_info()
        if batch.run != self._ahead_run:
            self._ahead_run, self._ahead_last = batch.run, batch.number
        for number, indices in batches_for_worker(batch, info.num_workers if info is not None else 1):
            if number <= self._ahead_last:
                continue
            self._ahead_last = number
            try:
                shards, positions = self._locate_many(indices)
            except IndexError:
                continue  # raised when that batch is asked for
            if self._chunked is not None:
                tar = self._chunked[shards] == 0
                shards, positions = shards[tar], positions[tar]
            self._bytes.prefetch(list(zip(shards.tolist(), positions.tolist())))

    def _batch(self, shards: np.ndarray, positions: np.ndarray, *, strict: bool) -> list[Any]:
        """The outputs (or :class:`Bad`) of the samples ``(shards[j], positions[j])``."""
        cb = self._chunk_bytes
        if self._chunked is None or cb is None:
            return self._tar_batch(shards, positions, strict=strict)
        chunked = self._chunked[shards] > 0
        if chunked.all():
            return self._chunk_batch(cb, shards, positions, strict=strict)
        if not chunked.any():
            return self._tar_batch(shards, positions, strict=strict)
        out: list[Any] = [None] * len(shards)  # a source mixing both layouts: each part as its own batch
        for j, item in zip(
            np.flatnonzero(chunked).tolist(), self._chunk_batch(cb, shards[chunked], positions[chunked], strict=strict)
        ):
            out[j] = item
        for j, item in zip(
            np.flatnonzero(~chunked).tolist(), self._tar_batch(shards[~chunked], positions[~chunked], strict=strict)
        ):
            out[j] = item
        return out

    def _chunk_batch(self, cb: ChunkBytes, shards: np.ndarray, positions: np.ndarray, *, strict: bool) -> list[Any]:
        got = cb.gather(shards, positions, self._bytes.submit)
        urls = self._bytes.urls
        batch = FieldBatch(lambda: got.keys, [urls[s] for s in shards.tolist()], got.offsets, got.fields)
        if not got.bad:
            return self._outputs(batch, len(shards), strict=strict)
        skip = self.decoding.on_error == "skip" and not strict
        out = []
        for j in range(len(shards)):
            e = got.bad.get(j)
            if e is not None and not skip:
                raise e
            out.append(
                Bad(batch.urls[j], None, str(e), lost=True)
                if e
                else self._processed(sample_dict(batch, j), strict=strict)
            )
        return out

    def _tar_batch(self, shards: np.ndarray, positions: np.ndarray, *, strict: bool) -> list[Any]:
        got = self._bytes.gather(shards, positions)
        n = len(shards)
        urls = self._bytes.urls
        parsed = None
        if not got.bad:
            parsed = parse_batch(got.data, got.at[:-1], got.at[1:], max_member=self.decoding.max_member_bytes)
        if parsed is None:  # one by one, with each sample's own errors
            view = got.data.data
            return [
                self._decode(
                    (int(s), int(p)),
                    got.bad.get(j) or bytes(view[got.at[j] : got.at[j + 1]]),
                    strict=strict,
                )
                for j, (s, p) in enumerate(zip(shards.tolist(), positions.tolist()))
            ]
        data = got.data
        batch = FieldBatch(
            lambda: parsed.keys(data), [urls[s] for s in shards.tolist()], got.offsets.tolist(), dict(parsed.fields)
        )
        return self._outputs(batch, n, strict=strict)

    def _outputs(self, batch: FieldBatch, n: int, *, strict: bool) -> list[Any]:
        if self._map is None and self._transform is None:
            fast = fast_outputs(batch, self.fields, n)
            if fast is not None:
                return fast
        return [self._processed(sample_dict(batch, j), strict=strict) for j in range(n)]

    def get(self, key: str) -> Any:
        """The sample whose key is ``key``; KeyError naming the split when there is none."""
        if self._keys is None:
            self._keys = self._load_keys()
        for i in self._keys.candidates(key):
            shard, pos = self.locate(i)
            if self._chunk_bytes is not None and self._chunked is not None and self._chunked[shard]:
                if self._chunk_bytes.key(shard, pos) == key:
                    return self._batch(np.array([shard]), np.array([pos]), strict=True)[0]
                continue
            data = self._read((shard, pos))
            if sample_key(data) == key:  # (the first header's name: a hash may be shared)
                return self._decode((shard, pos), data, strict=True)
        raise KeyError(f"no sample with key {key!r} in {self.source.name} split {self.source.split!r}")

    def _load_keys(self) -> KeyIndex:
        path = self._key_path
        if path is not None and os.path.exists(path):
            return load_key_index(path, nsamples=len(self))
        keys = split_key_list(self._bytes, self._chunk_bytes)
        if path is None:
            return build_key_index(keys)
        write_key_file(keys, path, nsamples=len(self))  # (in bounded memory, whatever the split's size)
        return load_key_index(path, nsamples=len(self))

    def _read(self, where: tuple[int, int]) -> bytes:
        got = self._bytes.read([where])[0]
        if isinstance(got, Exception):
            raise got
        return got

    def _decode(self, where: tuple[int, int], got: Got, *, strict: bool = False) -> Any:
        shard, pos = where
        url = self._bytes.urls[shard]
        skip = self.decoding.on_error == "skip" and not strict
        if isinstance(got, Exception):
            if skip:
                return Bad(url, got.key, str(got), lost=True)
            raise got
        try:
            sample = parse_sample(
                got,
                url=url,
                offset=self._bytes.offset(shard, pos),
                keep=None,
                max_member=self.decoding.max_member_bytes,
            )
        except ShardFormatError as e:
            if skip:
                return Bad(url, e.key, str(e), lost=True)
            raise
        return self._processed(sample, strict=strict)

    def _processed(self, sample: dict[str, object], *, strict: bool) -> Any:
        out = self._processor(sample)
        if isinstance(out, Bad) and strict:
            raise SampleError(out.reason, shard=out.shard, key=out.key)
        return out
