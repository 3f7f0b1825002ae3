"""``TokenDataset``: packed sequences for language-model training from token splits.

It wires the plan (:mod:`~shardify.reader.tokens.plan`: which sequences each rank and worker
makes, a pure function of seed, epoch, topology and the streams' token totals), the reader
(:mod:`~shardify.reader.tokens.shards`: the tokens of any range of a stream, checked) and the
packing (:mod:`~shardify.reader.tokens.pack`) into an ``IterableDataset`` of whole batches.
World, rank and worker come from :func:`~shardify.reader.plan.world.detect_world`.

Its state (:meth:`TokenDataset.state_dict`) is a small JSON dict (:mod:`~shardify.reader.tokens.state`).
Iterated directly, the dataset counts the batches it yields; through DataLoader workers, wrap
it in :class:`TokenLoader`, which counts the batches the loop takes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any, cast

import numpy as np
import torch

from shardify.reader.io.fetchpool import DaemonPool
from shardify.reader.io.sources import Source, SourceLike, resolve_source
from shardify.reader.options import CacheOptions
from shardify.reader.plan.world import World, detect_world
from shardify.reader.streams import Stream
from shardify.reader.tokens.pack import PackOptions, pack_batch
from shardify.reader.tokens.plan import (
    Runs,
    Segment,
    TokenPlan,
    group_positions,
    rank_batches,
    remaining_runs,
    stream_tokens,
    worker_share,
)
from shardify.reader.tokens.shards import TokenShards
from shardify.reader.tokens.state import Resume, check_state, make_state, plan_fields, stream_identity

__all__ = ["TokenDataset", "TokenLoader"]

Batch = dict[str, torch.Tensor]

_MAPPED = 64
"""Batches whose sequences a worker maps through the keyed order at once."""


class TokenDataset(torch.utils.data.IterableDataset[Batch]):
    """Batches of ``batch_size`` packed sequences of ``seq_len`` tokens from one token split or
    weighted ``Stream``s of them (each ``Stream``'s ``source``, ``split`` and ``weight``).

    ``epoch_tokens``: tokens an epoch takes from all streams together, shared by weight (None:
    every stream once). ``shuffle``: sequences in a keyed order per ``(seed, epoch)``.
    ``packing``: pad and ignore ids, ``position_ids``, document masks (:class:`PackOptions`).
    ``cache``: how remote shards are read (:class:`~shardify.reader.CacheOptions`).
    ``rank_world``: ``(rank, world)``, else detected (torch.distributed, ``RANK``/``WORLD_SIZE``).
    ``verify``: check each shard's SHA-256 against the index before its first read in a process
    (the chunked layout keeps no checksum per document; see :mod:`~shardify.reader.tokens.shards`).
    """

    def __init__(
        self,
        source: SourceLike | Source | Stream | Sequence[Stream],
        *,
        seq_len: int,
        batch_size: int,
        split: str | None = None,
        seed: int = 0,
        shuffle: bool = True,
        epoch_tokens: int | None = None,
        packing: PackOptions | None = None,
        cache: CacheOptions | None = None,
        rank_world: tuple[int, int] | None = None,
        verify: bool = False,
    ) -> None:
        if seq_len < 1 or batch_size < 1:
            raise ValueError(f"{seq_len=} and {batch_size=} should be >= 1")
        if epoch_tokens is not None and epoch_tokens < 0:
            raise ValueError(f"{epoch_tokens=} should be >= 0")
        streams = _streams(source, split)
        c = cache or CacheOptions()
        self.shards = [TokenShards(_resolve(s, c), verify=verify) for s in streams]
        weights = [s.weight for s in streams]
        if any(w is not None for w in weights) and any(w is None for w in weights):
            raise ValueError("give every Stream a weight, or none")
        self.totals = tuple(int(s.total) for s in self.shards)
        self.counts = tuple(
            stream_tokens(
                self.totals,
                weights=None if weights[0] is None else [float(w or 0) for w in weights],
                epoch_tokens=epoch_tokens,
            )
        )
        self.seq_len, self.batch_size, self.seed, self.shuffle = seq_len, batch_size, seed, shuffle
        self.packing = packing or PackOptions()
        self.rank_world = rank_world
        self.resume_fields = plan_fields(
            seed=seed,
            seq_len=seq_len,
            batch_size=batch_size,
            shuffle=shuffle,
            counts=self.counts,
            data=[stream_identity(s.source, s.totals.tolist()) for s in self.shards],
        )
        """What a state must match to resume here (:func:`~shardify.reader.tokens.state.plan_fields`)."""
        self.epoch = 0
        self._resume: Resume | None = None
        self.taken = 0
        """Batches of the current epoch yielded so far (by this process, or counted by :class:`TokenLoader`)."""
        self._read_world: int | None = None
        """The world the current epoch's part is read under (None: not read yet, the detected one)."""
        self._requests = c.requests
        self._pool: tuple[int, DaemonPool] | None = None
        dtypes = {s.dtype for s in self.shards}
        self._dtype = dtypes.pop() if len(dtypes) == 1 else np.dtype(np.int64)
        """The rows' token dtype before the cast: the streams' own, int64 when they differ."""
        self._with_docs = self.packing.position_ids or self.packing.documents
        self._remote = any(s.remote for s in self.shards)
        self._history: tuple[Segment, ...] = ()

    # -- the plan ------------------------------------------------------------------------------
    def plan(self, epoch: int | None = None) -> TokenPlan:
        """The epoch's units (:class:`~shardify.reader.tokens.plan.TokenPlan`)."""
        return TokenPlan(
            totals=self.totals,
            counts=self.counts,
            seq_len=self.seq_len,
            seed=self.seed,
            epoch=self.epoch if epoch is None else epoch,
            shuffle=self.shuffle,
        )

    def world(self) -> World:
        return detect_world(self.rank_world)

    def _part(self, world: int) -> tuple[tuple[Segment, ...], int]:
        """The earlier parts of this epoch and the batches of the current one already taken,
        for reading under ``world`` ranks."""
        r = self._resume
        if r is None or r.epoch != self.epoch:
            return (), 0
        if r.world == world:
            return r.history, r.batches
        return (*r.history, (r.world, r.batches)), 0

    def __len__(self) -> int:
        """Batches each rank yields in the current epoch (all of it, or what a loaded state left)."""
        return self.epoch_sizes()["batches"]

    def epoch_sizes(self) -> dict[str, int]:
        """The current epoch under the detected world: its ``tokens`` (all streams' takes), its
        ``sequences``, the ``batches`` each rank yields and the ``padding_rows`` (all ranks
        together) that fill the last batches; after a loaded state, of what it left."""
        w = self.world()
        history, skip = self._part(w.world)
        left = Runs(remaining_runs(self.plan().units, history, batch_size=self.batch_size)).total
        batches = rank_batches(left, world=w.world, batch_size=self.batch_size)
        return {
            "tokens": sum(self.counts),
            "sequences": self.plan().units,
            "batches": batches - skip,
            "padding_rows": batches * self.batch_size * w.world - left,
        }

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration reads (its order and, with weights, its takes)."""
        if epoch < 0:
            raise ValueError(f"{epoch=} should be >= 0")
        if epoch != self.epoch:
            self.taken = 0
        self.epoch = epoch

    # -- iterating -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        return self.read_as(self.world())

    def read_as(self, w: World) -> Iterator[Batch]:
        """The batches of this epoch that rank ``w.rank`` of ``w.world``, worker ``w.worker`` of
        ``w.workers``, makes (what iterating does in that process; for tests and simulations)."""
        history, skip = self._part(w.world)
        self._history, self._read_world, self.taken = history, w.world, skip
        plan = self.plan()
        runs = Runs(remaining_runs(plan.units, history, batch_size=self.batch_size))
        num = rank_batches(runs.total, world=w.world, batch_size=self.batch_size)
        share = worker_share(num, worker=w.worker, workers=w.workers, skip=skip)
        takes = [(plan.take_start(i), c) for i, c in enumerate(plan.counts)]
        for at in range(0, len(share), _MAPPED):  # the keyed order for many batches at a time
            group = share[at : at + _MAPPED]
            positions = group_positions(runs, rank=w.rank, world=w.world, batches=group, batch_size=self.batch_size)
            real = positions >= 0
            streams = np.full(positions.shape, -1, dtype=np.int64)
            seqs = np.zeros(positions.shape, dtype=np.int64)
            streams[real], seqs[real] = plan.units_at(positions[real])
            rows = cast(list[list[int]], streams.tolist()), cast(list[list[int]], seqs.tolist())
            for b, st, sq in zip(group, *rows):
                batch = self._batch(takes, st, sq)
                self.taken = b + 1
                yield batch
        self._resume = None

    def _batch(self, takes: list[tuple[int, int]], streams: list[int], seqs: list[int]) -> Batch:
        """The batch of the sequences ``seqs`` of ``streams`` (-1: a padding row; ``takes``: each
        stream's take start and count), read into one ``[B, L + 1]`` array of the streams' token
        dtype; rows of remote streams are read at once by this process's threads (each costs a
        request's latency)."""
        tokens = np.empty((len(streams), self.seq_len + 1), dtype=self._dtype)
        docs: list[list[int]] | None = [[] for _ in streams] if self._with_docs else None
        for shards in self.shards:
            shards.ready()  # in this thread, before any pool thread reads
        rows = [(row, i, s, None if docs is None else docs[row]) for row, (i, s) in enumerate(zip(streams, seqs))]
        if self._remote and sum(i >= 0 and self.shards[i].remote for i in streams) > 1:
            pool = self._fetch_pool()
            futures = [
                pool.submit(self._read_row, takes, i, s, tokens[row], d) if i >= 0 else None for row, i, s, d in rows
            ]
            read = [0 if f is None else f.result() for f in futures]
        else:
            read = [self._read_row(takes, i, s, tokens[row], d) if i >= 0 else 0 for row, i, s, d in rows]
        return {k: torch.from_numpy(v) for k, v in pack_batch(tokens, read, docs, self.packing).items()}

    def _read_row(self, takes: list[tuple[int, int]], i: int, s: int, out: np.ndarray, docs: list[int] | None) -> int:
        """Sequence ``s`` of stream ``i`` read into ``out``: its tokens and the next one (when
        there is one), their number returned; where documents begin appended to ``docs``. The
        take is read round and round from its start."""
        start, count = takes[i]
        shards = self.shards[i]
        total = shards.total
        o = s * self.seq_len
        n = min(self.seq_len + 1, count - o)
        p, at = (start + o) % total, 0
        while at < n:
            k = min(n - at, total - p)
            shards.read_ready(p, p + k, out[at : at + k], docs, at)
            at, p = at + k, 0
        return n

    def _fetch_pool(self) -> DaemonPool:
        """This process's threads for a batch's remote rows (made again after a fork)."""
        if self._pool is None or self._pool[0] != os.getpid():
            self._pool = (os.getpid(), DaemonPool(self._requests, "shardify-tokens"))
        return self._pool[1]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pool": None}

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the epoch stands: a small JSON-able dict (see :mod:`~shardify.reader.tokens.state`)."""
        world = self._read_world if self._read_world is not None else self.world().world
        return make_state(self.resume_fields, Resume(self.epoch, self._history, world, self.taken))

    def load_state_dict(self, state: Any) -> None:
        """Resume at ``state`` (from :meth:`state_dict`, any topology): the next iteration of its
        epoch yields what it had left, every token once over all ranks; call before iterating."""
        r = self._resume = check_state(self.resume_fields, state)
        self.epoch, self._history, self._read_world, self.taken = r.epoch, r.history, r.world, r.batches

    def close(self) -> None:
        for s in self.shards:
            s.close()


def _streams(source: Any, split: str | None) -> list[Stream]:
    if isinstance(source, Stream):
        found = [source]
    elif (
        isinstance(source, Sequence)
        and not isinstance(source, (str, bytes))
        and all(isinstance(s, Stream) for s in source)
    ):
        found = list(source)
    else:
        found = [Stream(source, split=split)]
    if not found:
        raise ValueError("no stream given")
    for s in found:
        if s.transform is not None or s.map is not None or s.fields is not None:
            raise ValueError(f"Stream({s.source!r}): transform, map and fields do not apply to packed tokens")
    return found


def _resolve(stream: Stream, c: CacheOptions) -> Source:
    if isinstance(stream.source, Source):
        return stream.source
    return resolve_source(
        stream.source,
        split=stream.split,
        cache_dir=c.dir,
        cache_limit_bytes=c.limit_bytes,
        retry=c.retry,
        allow_locations=c.allow_locations,
        ranged=c.ranged,
        requests=c.requests,
    )


class TokenLoader:
    """A DataLoader over ``dataset`` with ``num_workers`` processes that counts the batches the
    loop takes, for :meth:`state_dict`; ``num_workers=0`` iterates the dataset in this process.
    Other keywords go to ``torch.utils.data.DataLoader`` (``pin_memory``, ``prefetch_factor``...)."""

    def __init__(self, dataset: TokenDataset, *, num_workers: int = 0, **loader_options: Any) -> None:
        if num_workers < 0:
            raise ValueError(f"{num_workers=} should be >= 0")
        if "persistent_workers" in loader_options or "batch_size" in loader_options:
            raise ValueError(
                "TokenLoader makes whole batches in fresh workers each epoch: no batch_size, no persistent_workers"
            )
        self.dataset, self.num_workers, self._options = dataset, num_workers, loader_options

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self) -> Iterator[Batch]:
        ds = self.dataset
        if self.num_workers == 0:
            yield from ds
            return
        w = ds.world()
        history, skip = ds._part(w.world)
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=self.num_workers, **self._options)
        it = iter(loader)  # the workers take the dataset (and a loaded state) as it is now
        ds._history, ds._read_world, ds.taken, ds._resume = history, w.world, skip, None
        for batch in it:
            ds.taken += 1
            yield batch

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        return self.dataset.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.dataset.load_state_dict(state)
