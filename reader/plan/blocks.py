"""An epoch's block-shuffled sequence that each worker evaluates on its own slice only (plan version 4).

The epoch's takes (the streams' shards laid end to end, see :mod:`shardify.reader.plan.mix`)
are held as three numpy arrays, one entry per shard range, never as Python tuples. The
``N`` positions of the takes are cut into ``N // block`` whole blocks of ``block`` samples
(and a last partial block of ``N % block`` samples, which stays at the end); position ``p``
of the shuffled sequence, in whole block ``k = p // block``, is position
``perm(k) * block + p % block`` of the takes, where ``perm`` is the keyed bijection of
:class:`shardify.permute.KeyedPermutation` over ``range(N // block)`` keyed by
``reader-blocks:{seed}:{epoch}``. So a worker maps the positions of its own share (a few
batches) to shard ranges in O(share) time and memory, whatever the epoch's length: nothing
builds or holds the permutation of the whole epoch. Layouts 2 and 3 hold it whole
(``mix._interleave``); their states still resume in their own order.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from shardify.permute import KeyedPermutation

__all__ = ["BlockSequence"]

_CHUNK = 1 << 20
"""Positions mapped at a time when the whole sequence is listed (a resume on another topology)."""


class BlockSequence:
    """The epoch's sequence of plan version 4: ``takes`` (shard, first index, samples) in blocks of
    ``block`` put in the keyed order of ``(seed, epoch)``; see the module docstring.

    ``total`` is its length in samples. Iterating lists all of it as ``(shard, start, stop)``
    ranges (O(total): only a resume on another topology does); :meth:`ranges_at` maps a share.
    """

    def __init__(
        self, shards: np.ndarray, firsts: np.ndarray, counts: np.ndarray, *, block: int, seed: int, epoch: int
    ) -> None:
        if block < 1:
            raise ValueError(f"{block=} should be >= 1")
        self._shards = np.asarray(shards, dtype=np.int64)
        self._firsts = np.asarray(firsts, dtype=np.int64)
        counts = np.asarray(counts, dtype=np.int64)
        if not len(self._shards) == len(self._firsts) == len(counts):
            raise ValueError(
                f"takes should be three arrays of one length, found {len(self._shards)}, "
                f"{len(self._firsts)}, {len(counts)}"
            )
        if counts.size and (int(counts.min()) < 0 or int(self._firsts.min()) < 0):
            raise ValueError("takes should have first indices >= 0 and counts >= 0")
        self._cum = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=self._cum[1:])
        self.total = int(self._cum[-1])
        self.block = block
        self.key = (seed, epoch)
        self._perm = KeyedPermutation(self.total // block, label=f"reader-blocks:{seed}:{epoch}")

    def source_positions(self, positions: np.ndarray) -> np.ndarray:
        """Where each position of the shuffled sequence (ints in ``[0, total)``) lies in the takes."""
        pos = np.asarray(positions, dtype=np.int64)
        k, off = np.divmod(pos, self.block)
        whole = np.flatnonzero(k < len(self._perm))
        out: np.ndarray = pos.copy()  # the last partial block stays where it is
        if whole.size:  # the bijection once per run of one block (a share's positions come in runs)
            kw = k[whole]
            starts = np.flatnonzero(np.concatenate(([True], kw[1:] != kw[:-1])))
            lengths = np.diff(np.append(starts, len(kw)))
            out[whole] = np.repeat(self._perm.at(kw[starts]), lengths) * self.block + off[whole]
        return out

    def ranges_at(self, positions: np.ndarray) -> list[tuple[int, int, int]]:
        """The samples at ``positions`` of the sequence, in order, as ``(shard, start, stop)``
        ranges, consecutive samples of a shard merged into one range."""
        src = self.source_positions(positions)
        if not src.size:
            return []
        take = np.searchsorted(self._cum, src, side="right") - 1
        shard = self._shards[take]
        index = self._firsts[take] + src - self._cum[take]
        cut = np.flatnonzero((shard[1:] != shard[:-1]) | (index[1:] != index[:-1] + 1)) + 1
        lo = np.concatenate(([0], cut))
        hi = np.concatenate((cut, [len(src)]))
        return list(zip(shard[lo].tolist(), index[lo].tolist(), (index[hi - 1] + 1).tolist()))

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        last: tuple[int, int, int] | None = None
        for lo in range(0, self.total, _CHUNK):
            for r in self.ranges_at(np.arange(lo, min(lo + _CHUNK, self.total), dtype=np.int64)):
                if last is not None and last[0] == r[0] and last[2] == r[1]:
                    last = (last[0], last[1], r[2])
                    continue
                if last is not None:
                    yield last
                last = r
        if last is not None:
            yield last

    def __repr__(self) -> str:
        return f"BlockSequence(total={self.total}, block={self.block}, seed/epoch={self.key})"
