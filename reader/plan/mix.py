"""The epoch's sequence of samples: several weighted streams, a fixed epoch size, and blocks.

Each stream ``i`` (its shards are numbered after those of the streams before it) takes
``c = counts[i]`` of its ``N`` samples per epoch: ``c // N`` whole passes (its shards laid
end to end in a seeded order; natural without shuffle; stream 0's first pass is the shard
order of a single source's epoch), then ``r = c % N`` more: epoch ``e`` takes positions
``[e * r, (e + 1) * r)`` of one pass read round and round (position ``p`` is sample
``p mod N`` of the pass). So the extra part of an epoch never holds a sample twice, however
it falls across the end of the pass, and consecutive epochs walk through the stream: every
sample is used once before any twice, and an oversampled epoch holds each sample ``c // N``
or ``c // N + 1`` times. The pass is reshuffled only where an epoch boundary meets a pass
boundary, every ``lcm(N, r) / r`` epochs (cycle ``k`` uses order ``k``), since a new order
begun mid-epoch could repeat a sample of the old one. ``stream_counts`` splits an epoch size
by weight with largest-remainder rounding, so the counts add up.

With shuffle, the streams' takes are then cut into blocks of ``block`` samples (read with
one seek each) and the blocks put in a seeded random order: batches mix the streams, and
any slice of the sequence (a rank's) is a sample of the whole epoch even when shards are
sorted by class: :func:`block_sequence` keeps the takes as numpy arrays and the blocks' order
is a keyed bijection each worker evaluates on its own share (:mod:`shardify.reader.plan.blocks`).
(:func:`epoch_sequence` with ``interleave`` lists the whole epoch's permutation instead: a
reference for tests and benchmarks.) Everything here is a pure function of its arguments.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from shardify.reader.plan.assign import Range, append_range
from shardify.reader.plan.blocks import BlockSequence
from shardify.reader.plan.shuffle import derive_seed, shard_order

__all__ = ["stream_counts", "stream_take", "epoch_sequence", "shard_permutation", "block_sequence", "planned_sequence"]


def stream_counts(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` split in proportion to ``weights`` with largest-remainder rounding (ties: lower index)."""
    if total < 0:
        raise ValueError(f"{total=} should be >= 0")
    if not weights or any(not w > 0 for w in weights):
        raise ValueError(f"weights should be > 0, found {list(weights)}")
    s = sum(weights)
    exact = [total * w / s for w in weights]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def _whole_arrays(
    sizes: np.ndarray, order: Sequence[int] | np.ndarray, offset: int, lo: int, hi: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions ``[lo, hi)`` of the stream's shards (``sizes``, int64) laid end to end in
    ``order``, as ``(shards, starts, stops)`` arrays (vectorised: an epoch at 1 B samples lays
    436 K shards)."""
    idx = np.asarray(order, dtype=np.int64)
    stops = np.cumsum(sizes[idx])
    starts = stops - sizes[idx]
    keep = (stops > lo) & (starts < hi) & (stops > starts)
    first = starts[keep]
    return idx[keep] + offset, np.maximum(first, lo) - first, np.minimum(stops[keep], hi) - first


def _whole(
    sizes: np.ndarray, order: Sequence[int] | np.ndarray, offset: int, lo: int, hi: int, out: list[Range]
) -> None:
    """:func:`_whole_arrays` appended to ``out`` as ranges: within one pass a shard appears
    once, so only its first range can continue the last one of ``out``."""
    if hi <= lo:
        return
    shards, a, b = (x.tolist() for x in _whole_arrays(sizes, order, offset, lo, hi))
    if shards:
        append_range(out, shards[0], a[0], b[0])
        out.extend(zip(shards[1:], a[1:], b[1:]))


OrderFn = Callable[..., "Sequence[int] | np.ndarray"]
"""``order(num_shards, *, seed, epoch, shuffle)``: the order of a pass's shards."""


def _take_parts(
    sizes: np.ndarray, *, count: int, epoch: int, seed: int, shuffle: bool, stream: int, offset: int, order: OrderFn
) -> list[tuple[np.ndarray, Sequence[int] | np.ndarray, int, int]]:
    """Stream ``stream``'s take as ``(sizes, shard order, lo, hi)`` parts: positions ``[lo, hi)``
    of the shards laid end to end in that order (see :func:`stream_take`)."""
    n = int(sizes.sum())
    if count and not n:
        raise ValueError(f"stream {stream} has no samples, but {count} are asked of it per epoch")
    parts: list[tuple[np.ndarray, Sequence[int] | np.ndarray, int, int]] = []
    if not count:
        return parts
    passes, rest = divmod(count, n)
    for j in range(passes):
        pass_seed = (
            (seed if stream == 0 else derive_seed("cycle", seed, stream))
            if j == 0
            else derive_seed("pass", seed, stream, j)
        )
        parts.append((sizes, order(len(sizes), seed=pass_seed, epoch=epoch, shuffle=shuffle), 0, n))
    if rest:
        cycle, at = divmod(epoch * rest, n // math.gcd(n, rest) * rest)  # cycles end on a pass and an epoch
        cycle_order = order(len(sizes), seed=derive_seed("rest", seed, stream), epoch=cycle, shuffle=shuffle)
        at %= n
        head = min(rest, n - at)
        parts.append((sizes, cycle_order, at, at + head))
        parts.append((sizes, cycle_order, 0, rest - head))  # round to the pass's start: r <= N, no overlap
    return parts


def stream_take(
    sizes: Sequence[int], *, count: int, epoch: int, seed: int, shuffle: bool, stream: int = 0, offset: int = 0
) -> list[Range]:
    """Stream ``stream``'s ``count`` samples of ``epoch`` (shard indices shifted by ``offset``).

    ``count // N`` whole passes over the stream's ``N`` samples (pass 0 of stream 0 is the
    shard order of a single source's epoch), then ``count % N`` samples: the epoch's window of
    one pass read round and round (see the module's docstring). So an epoch holds every sample
    ``count // N`` or ``count // N + 1`` times, and the extra ones go through every sample
    before any twice, over consecutive epochs.
    """
    out: list[Range] = []
    for part_sizes, order, lo, hi in _take_parts(
        np.asarray(sizes, dtype=np.int64).reshape(-1),
        count=count,
        epoch=epoch,
        seed=seed,
        shuffle=shuffle,
        stream=stream,
        offset=offset,
        order=shard_order,
    ):
        _whole(part_sizes, order, offset, lo, hi, out)
    return out


def shard_permutation(num_shards: int, *, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """Layout 4's order of a pass's shards: NumPy's frozen ``RandomState`` stream (NEP 19), the
    same on every version and machine; 10 ms at 436 K shards, where :func:`shard_order`'s
    Python shuffle takes 0.3-0.5 s."""
    if not shuffle:
        return np.arange(num_shards, dtype=np.int64)
    return np.random.RandomState(derive_seed("shards", seed, epoch) % 2**32).permutation(num_shards)


def _counts_per_stream(streams: Sequence[Sequence[int]], counts: Sequence[int] | None) -> Sequence[int]:
    """``counts``, one per stream (None: each stream's whole size); ValueError if they do not pair."""
    if counts is None:
        return [sum(s) for s in streams]
    if len(counts) != len(streams):
        raise ValueError(f"{len(counts)=} should be {len(streams)}, one per stream")
    return counts


def block_sequence(
    streams: Sequence[Sequence[int]], *, counts: Sequence[int] | None, seed: int, epoch: int, block: int
) -> BlockSequence:
    """Layout 4's shuffled epoch: each stream's take (``counts``; None: each stream once, its
    shards in :func:`shard_permutation` order) as arrays, in blocks of ``block`` samples put in
    a keyed order that a worker evaluates on its own share (:class:`BlockSequence`)."""
    counts = _counts_per_stream(streams, counts)
    pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    offset = 0
    for i, (sizes, count) in enumerate(zip(streams, counts)):
        sizes_np = np.asarray(sizes, dtype=np.int64).reshape(-1)
        for part_sizes, order, lo, hi in _take_parts(
            sizes_np,
            count=count,
            epoch=epoch,
            seed=seed,
            shuffle=True,
            stream=i,
            offset=offset,
            order=shard_permutation,
        ):
            if hi > lo:
                pieces.append(_whole_arrays(part_sizes, order, offset, lo, hi))
        offset += len(sizes)
    shards, firsts, stops = (
        np.concatenate([p[j] for p in pieces]) if pieces else np.zeros(0, dtype=np.int64) for j in range(3)
    )
    return BlockSequence(shards, firsts, stops - firsts, block=block, seed=seed, epoch=epoch)


def epoch_sequence(
    streams: Sequence[Sequence[int]],
    *,
    counts: Sequence[int] | None,
    seed: int,
    epoch: int,
    shuffle: bool,
    block: int,
    interleave: bool = True,
) -> tuple[Range, ...]:
    """The epoch's samples in order: each stream's take (``counts``; None: each stream once),
    then, with ``shuffle`` and ``interleave``, blocks of ``block`` samples in a seeded order."""
    counts = _counts_per_stream(streams, counts)
    if block < 1:
        raise ValueError(f"{block=} should be >= 1")
    takes: list[Range] = []
    offset = 0
    for i, (sizes, count) in enumerate(zip(streams, counts)):
        takes += stream_take(sizes, count=count, epoch=epoch, seed=seed, shuffle=shuffle, stream=i, offset=offset)
        offset += len(sizes)
    if not (shuffle and interleave):
        return tuple(takes)
    return _interleave(takes, block=block, seed=seed, epoch=epoch)


def planned_sequence(
    streams: Sequence[Sequence[int]],
    *,
    counts: Sequence[int] | None,
    seed: int,
    epoch: int,
    shuffle: bool,
    block: int,
    blocks: bool = True,
) -> tuple[Range, ...] | BlockSequence:
    """The epoch's sequence the plan reads: with ``shuffle`` and ``blocks`` (shards that can
    seek), :func:`block_sequence`; else the takes in order."""
    if shuffle and blocks:
        return block_sequence(streams, counts=counts, seed=seed, epoch=epoch, block=block)
    return epoch_sequence(
        streams, counts=counts, seed=seed, epoch=epoch, shuffle=shuffle, block=block, interleave=False
    )


_FEW_ACROSS = 8
"""Blocks are expanded one by one where fewer than one in this many crosses a take's end (the
default small blocks: no numpy pass over every block), else all at once with numpy."""


def _interleave(takes: Sequence[Range], *, block: int, seed: int, epoch: int) -> tuple[Range, ...]:
    """``takes`` cut into blocks of ``block`` samples, the blocks in a seeded random order.

    The permutation comes from NumPy's ``RandomState``, whose stream is frozen (NEP 19), so
    the order is the same on every version and machine; vectorised, as an epoch of ImageNet
    has 320,000 blocks of 4 (and one of 1 B samples in blocks of 1,024 cuts 1.4 M ranges).
    """
    if not takes:
        return ()
    shards = np.array([s for s, _, _ in takes], dtype=np.int64)
    firsts = np.array([a for _, a, _ in takes], dtype=np.int64)
    cum = np.concatenate(([0], np.cumsum([b - a for _, a, b in takes]))).astype(np.int64)
    n = int(cum[-1])
    perm = np.random.RandomState(derive_seed("blocks", seed, epoch) % 2**32).permutation(-(-n // block))
    starts = perm.astype(np.int64) * block
    stops = np.minimum(starts + block, n)
    first = np.searchsorted(cum, starts, side="right") - 1  # the take where each block starts
    last = np.searchsorted(cum, stops - 1, side="right") - 1  # and the take where it ends
    across = np.flatnonzero(last > first).tolist()  # blocks across the end of a take: one range per take
    if len(across) * _FEW_ACROSS > len(perm):  # large blocks: expand every block with numpy
        pieces = last - first + 1
        block_of = np.repeat(np.arange(len(perm)), pieces)
        first = first[block_of] + np.arange(len(block_of)) - np.repeat(np.cumsum(pieces) - pieces, pieces)
        starts, stops = np.maximum(starts[block_of], cum[first]), np.minimum(stops[block_of], cum[first + 1])
    lo = starts - cum[first] + firsts[first]
    rows = list(zip(shards[first].tolist(), lo.tolist(), (lo + stops - starts).tolist()))
    if len(across) * _FEW_ACROSS > len(perm) or not across:
        return tuple(rows)
    out: list[Range] = []  # small blocks: a few cross, expanded one by one between the others
    at = 0
    for k in across:
        out += rows[at:k]
        v, end, r = int(starts[k]), int(stops[k]), int(first[k])
        while v < end:
            take = min(end, int(cum[r + 1])) - v
            out.append((int(shards[r]), int(firsts[r]) + v - int(cum[r]), int(firsts[r]) + v - int(cum[r]) + take))
            v, r = v + take, r + 1
        at = k + 1
    out += rows[at:]
    return tuple(out)
