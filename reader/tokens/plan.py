"""The plan of a packed-token epoch: sequences of ``seq_len`` tokens are the epoch's units.

Stream ``i`` is its split's documents laid end to end in stored order, ``N_i`` tokens. An
epoch takes ``c_i`` of them (:func:`~shardify.reader.plan.mix.stream_counts` of the epoch's
tokens by weight; by default ``N_i``, each stream once): epoch ``e`` takes positions
``[e * c_i, (e + 1) * c_i)`` of the stream read round and round (position ``p`` is token
``p mod N_i``), the mix's rule counted in tokens: every token once before any twice, and
consecutive epochs walk on through the stream. The take is cut into ``S_i = ceil(c_i / L)``
sequences: sequence ``s`` has as inputs take positions ``[s * L, s * L + L)`` and as labels
``[s * L + 1, s * L + L + 1)``, both cut at ``c_i`` (the rest is padding: the pad id, labels
``ignore_index``), so every token of a take is an input exactly once.

The epoch's ``U = sum(S_i)`` units (unit ``u`` is sequence ``u - first_i`` of the stream whose
units start at ``first_i``) are put in the keyed order of
:class:`~shardify.permute.KeyedPermutation` over ``range(U)``, label
``reader-tokens:{seed}:{epoch}`` (identity without shuffle): position ``p`` holds unit
``perm(p)``. No process lists the whole order; each maps only the positions of its own batches.

Ranks and workers as :mod:`shardify.reader.plan.assign` deals samples (its counts without
``drop_last``), with sequences as its samples and nothing dropped or repeated (``assign``
wraps a rank's slice round to the start, as DistributedSampler does; here it is padded): rank
``r`` of ``world`` takes positions ``[r * P, (r + 1) * P)`` with ``P = ceil(R / world)`` (``R``
positions to read); positions ``>= R`` and the rows that fill the last batch are *padding
sequences* (every label ignored), so every rank yields ``ceil(P / batch_size)`` batches; batch
``b`` of a rank goes to worker ``b % workers`` (after a resume, the batches left are dealt so
from worker 0).

Resume (as :mod:`shardify.reader.plan.resume`): a part of the epoch read under ``world``
ranks for ``batches`` batches is a :data:`Segment`; what it left, rank by rank in order, is
the positions the next part plans over the new world. A state is a few integers per segment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from shardify.permute import KeyedPermutation
from shardify.reader.plan.assign import batches_per_rank, samples_per_rank
from shardify.reader.plan.mix import stream_counts

__all__ = [
    "Segment",
    "TokenPlan",
    "Runs",
    "stream_tokens",
    "rank_batches",
    "remaining_runs",
    "batch_positions",
    "group_positions",
    "worker_share",
]

Segment = tuple[int, int]
"""``(world, batches)``: a part of an epoch read by ``world`` ranks, ``batches`` batches each."""


def stream_tokens(totals: Sequence[int], *, weights: Sequence[float] | None, epoch_tokens: int | None) -> list[int]:
    """Tokens each stream gives an epoch: its own size by default, else ``epoch_tokens`` by weight
    (or by size when no weight is given)."""
    if epoch_tokens is None:
        if weights is not None and len(set(weights)) > 1:
            raise ValueError("weights need epoch_tokens: the tokens an epoch takes from all streams together")
        return [int(t) for t in totals]
    counts = stream_counts(epoch_tokens, list(weights) if weights is not None else [max(1, int(t)) for t in totals])
    for i, (c, n) in enumerate(zip(counts, totals)):
        if c and not n:
            raise ValueError(f"stream {i} has no tokens, but {c} are asked of it per epoch")
    return counts


@dataclass(frozen=True)
class TokenPlan:
    """One epoch's units: streams of ``totals`` tokens, ``counts`` taken each, cut into
    sequences of ``seq_len``; their order keyed by ``(seed, epoch)`` (see the module)."""

    totals: tuple[int, ...]
    counts: tuple[int, ...]
    seq_len: int
    seed: int
    epoch: int
    shuffle: bool = True

    def __post_init__(self) -> None:
        if self.seq_len < 1:
            raise ValueError(f"seq_len={self.seq_len} should be >= 1")
        if len(self.totals) != len(self.counts):
            raise ValueError(f"{len(self.counts)} counts for {len(self.totals)} streams")

    @property
    def sequences(self) -> np.ndarray:
        """Sequences per stream (int64)."""
        return -(-np.asarray(self.counts, dtype=np.int64) // self.seq_len)

    @property
    def units(self) -> int:
        return int(self.sequences.sum())

    def take_start(self, stream: int) -> int:
        """Where stream ``stream``'s take of this epoch begins (a position of one pass)."""
        n = self.totals[stream]
        return (self.epoch * self.counts[stream]) % n if n else 0

    def units_at(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(stream, sequence)`` of the units at ``positions`` of the epoch's order."""
        pos = np.asarray(positions, dtype=np.int64)
        if self.shuffle and pos.size:
            pos = self._order.at(pos)
        stream = np.searchsorted(self._firsts, pos, side="right") - 1
        return stream, pos - self._firsts[stream]

    @cached_property
    def _order(self) -> KeyedPermutation:
        return KeyedPermutation(self.units, label=f"reader-tokens:{self.seed}:{self.epoch}")

    @cached_property
    def _firsts(self) -> np.ndarray:
        """The first unit of each stream, and the total."""
        return np.concatenate(([0], np.cumsum(self.sequences))).astype(np.int64)


def rank_batches(positions: int, *, world: int, batch_size: int) -> int:
    """Batches every rank yields over ``positions`` positions: ``ceil(ceil(R / world) / batch_size)``
    (the sample plan's count without ``drop_last``)."""
    return batches_per_rank(positions, world=world, batch_size=batch_size, drop_last=False)


def _rank_rest(total: int, world: int, batches: int, batch_size: int) -> list[tuple[int, int]]:
    """The positions a part left after ``batches`` batches of every rank, as ``[a, b)`` runs in order."""
    per = samples_per_rank(total, world=world, drop_last=False)
    done = min(batches * batch_size, per)
    runs = []
    for r in range(world):
        a, b = r * per + done, min((r + 1) * per, total)
        if b > a:
            runs.append((a, b))
    return runs


def _through(outer: list[tuple[int, int]], inner: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``inner`` (runs of positions of the sequence that ``outer``'s runs make) as runs of
    ``outer``'s own positions."""
    if not outer:
        return []
    cum = np.concatenate(([0], np.cumsum([b - a for a, b in outer]))).tolist()
    out: list[tuple[int, int]] = []
    for a, b in inner:
        k = int(np.searchsorted(cum, a, side="right")) - 1
        while a < b:
            take = min(b, cum[k + 1]) - a
            lo = outer[k][0] + a - cum[k]
            if out and out[-1][1] == lo:
                out[-1] = (out[-1][0], lo + take)
            else:
                out.append((lo, lo + take))
            a += take
            k += 1
    return out


def remaining_runs(units: int, history: Sequence[Segment], *, batch_size: int) -> list[tuple[int, int]]:
    """The positions of the epoch's order left after the parts ``history`` (in order), as runs."""
    runs = [(0, units)] if units else []
    for world, batches in history:
        total = sum(b - a for a, b in runs)
        runs = _through(runs, _rank_rest(total, world, batches, batch_size))
    return runs


class Runs:
    """Runs ``[a, b)`` of epoch positions laid end to end: the sequence of positions a part reads."""

    def __init__(self, runs: Sequence[tuple[int, int]]) -> None:
        self.starts = np.asarray([a for a, _ in runs], dtype=np.int64)
        self.cum = np.zeros(len(runs) + 1, dtype=np.int64)
        np.cumsum([b - a for a, b in runs], out=self.cum[1:])
        self.total = int(self.cum[-1])

    def at(self, q: np.ndarray) -> np.ndarray:
        """The epoch positions at places ``q`` (ints in ``[0, total)``) of the runs."""
        k = np.searchsorted(self.cum, q, side="right") - 1
        out: np.ndarray = self.starts[k] + q - self.cum[k]
        return out


def batch_positions(runs: Runs, *, rank: int, world: int, batch: int, batch_size: int) -> np.ndarray:
    """The epoch positions of the rows of batch ``batch`` of rank ``rank`` over ``runs``; -1 for
    a padding row."""
    rows: np.ndarray = group_positions(runs, rank=rank, world=world, batches=[batch], batch_size=batch_size)[0]
    return rows


def group_positions(runs: Runs, *, rank: int, world: int, batches: Sequence[int], batch_size: int) -> np.ndarray:
    """:func:`batch_positions` of each of ``batches`` at once: ``[len(batches), batch_size]``."""
    per = samples_per_rank(runs.total, world=world, drop_last=False)
    lo = rank * per + np.asarray(batches, dtype=np.int64)[:, None] * batch_size
    rows = lo + np.arange(batch_size, dtype=np.int64)
    real = (rows < min((rank + 1) * per, runs.total)) & (rows >= rank * per)
    out = np.full(rows.shape, -1, dtype=np.int64)
    if real.any():
        out[real] = runs.at(rows[real])
    return out


def worker_share(num_batches: int, *, worker: int, workers: int, skip: int = 0) -> range:
    """The rank's batches worker ``worker`` of ``workers`` makes, after the first ``skip``: the
    rest dealt round-robin from worker 0, the order in which a DataLoader asks its workers."""
    return range(skip + worker, num_batches, workers)
