"""Seeded shuffling: the shard order, a worker's sample order, and per-sample augmentation RNGs.

Every function here is pure: the same arguments give the same result on every run, machine
and Python version (seeds come from BLAKE2b of the arguments, never from ``hash()``).

A worker's order is computed up front over the positions of its own share of samples, as
two stages that bound memory by ``buffer_size`` encoded samples:

1. block shuffle: the share is cut into blocks of ``block`` consecutive samples (read with
   one seek each) and the blocks are visited in random order;
2. buffer shuffle: the classic shuffle buffer (emit a random sample held and put the next
   one read in its place) applied to that read order. It ramps up, as webdataset's
   ``shuffle(initial=...)`` does: the first sample leaves once ``s`` samples are read
   (:func:`ramp_start`: ``buffer_size // 16``, at most 64), and until the buffer holds
   ``buffer_size`` it reads two samples per sample emitted. So a worker's first batch of
   ``B`` waits for about ``s + 2 B`` reads instead of ``buffer_size + B`` (for the defaults
   and ``B = 64``: at most 190, median 175, instead of ~1,050), and the buffer is full after
   ``2 (buffer_size - s)`` reads; from there on it is the full buffer.

:func:`array_order` runs both stages with numpy's draws, vectorised but for the ramp (a few
milliseconds for 50,000 samples).

Because the output order is a list of positions, resuming after ``k`` outputs only has to
read the positions not yet emitted: nothing is replayed, nothing is decoded twice.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import numpy as np

__all__ = [
    "derive_seed",
    "shard_order",
    "sample_rng",
    "RAMP_START",
    "ramp_start",
    "numpy_rng",
    "array_order",
    "reorder",
]

T = TypeVar("T")


def derive_seed(*parts: object) -> int:
    """A 64-bit seed from ``parts`` (ints and strings), stable across runs and machines."""
    text = "\x1f".join(f"{type(p).__name__}:{p}" for p in parts).encode("utf-8", "surrogateescape")
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def shard_order(num_shards: int, *, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """The order in which the shards are laid end to end in ``epoch``: natural when not shuffling."""
    order = list(range(num_shards))
    if shuffle:
        random.Random(derive_seed("shards", seed, epoch)).shuffle(order)
    return order


def sample_rng(seed: int, epoch: int, key: str) -> random.Random:
    """The augmentation RNG of sample ``key`` in ``epoch``: the same whatever the ranks and workers."""
    return random.Random(derive_seed("sample", seed, epoch, key))


RAMP_START = 64
"""At most this many samples are held before a ramped buffer's first output (see
:func:`ramp_start`). Part of the plan: changing it changes every ramped order (a new
:data:`~shardify.reader.plan.resume.PLAN_VERSION`)."""


def ramp_start(buffer_size: int) -> int:
    """How many samples a ramped shuffle buffer of ``buffer_size`` holds before its first
    output: a sixteenth of it, at least 1 and at most :data:`RAMP_START` (64 for the default
    1,024)."""
    return max(1, min(RAMP_START, buffer_size // 16))


def _ramp(n: int, *, size: int, initial: int | None, draw: Callable[[], float]) -> tuple[list[int], list[int], int]:
    """The shuffle buffer's ramp (webdataset's ``shuffle(initial=...)``): start with
    ``initial`` items (None: a full buffer of ``size``), then emit one and read two until full.
    ``draw()`` gives a float in [0, 1) per step. Returns ``(buffer, emitted, next item to read)``."""
    t = size if initial is None else max(1, min(initial, size))
    buf = list(range(t))
    out: list[int] = []
    while len(buf) < size and t < n:  # the ramp: emit one, read two
        j = int(draw() * len(buf))
        out.append(buf[j])
        buf[j] = t
        t += 1
        if t < n:
            buf.append(t)
            t += 1
    return buf, out, t


def numpy_rng(*parts: object) -> np.random.RandomState:
    """A NumPy ``RandomState`` (a frozen stream, NEP 19) seeded with :func:`derive_seed` of ``parts``."""
    seed = derive_seed(*parts)
    return np.random.RandomState([seed & 0xFFFFFFFF, seed >> 32])


def _buffer_emitted(n: int, *, size: int, initial: int | None, rng: np.random.RandomState) -> np.ndarray:
    """The order in which a shuffle buffer of ``size`` emits items read as ``0..n-1``: the ramp
    (at most ``size`` steps) in Python, then the full buffer vectorised. Each step of the full buffer picks slot ``j``,
    emits what it holds and puts the next item read there; so the item a step emits is the one
    put in its slot at that slot's previous pick (or the slot's item when the buffer filled)."""
    size = min(size, n)
    if size <= 1:
        return np.arange(n, dtype=np.int64)
    draws = iter(rng.random_sample(size).tolist())
    buf, out, t = _ramp(n, size=size, initial=initial, draw=draws.__next__)
    slots = (rng.random_sample(n - t) * len(buf)).astype(np.int64)  # the full buffer: emit one, read one
    by_slot = np.argsort(slots, kind="stable")  # the steps by slot, in step order within one
    first = np.ones(len(by_slot), dtype=bool)
    first[1:] = slots[by_slot[1:]] != slots[by_slot[:-1]]
    held = np.asarray(buf, dtype=np.int64)
    emitted = np.empty(n - t, dtype=np.int64)
    emitted[by_slot] = np.where(first, held[slots[by_slot]], t + np.concatenate(([0], by_slot[:-1])))
    last = np.ones(len(by_slot), dtype=bool)
    last[:-1] = first[1:]
    held[slots[by_slot[last]]] = t + by_slot[last]  # what each slot holds at the end
    return np.concatenate((np.asarray(out, dtype=np.int64), emitted, held[rng.permutation(len(held))]))


def array_order(
    n: int, *, rng: np.random.RandomState, block: int, buffer_size: int, initial: int | None = None
) -> tuple[list[int], list[int]]:
    """``(read order, output order)`` of a worker's ``n`` samples, both permutations of
    ``0..n-1``: runs of ``block`` in a seeded order, then a shuffle buffer of ``buffer_size``
    with its ramp from ``initial`` (None: it fills whole first), with numpy's draws, in O(n)
    numpy work and a Python loop of at most ``buffer_size`` steps. Output ``k`` is among the
    first ``k + buffer_size`` items read (``initial + 2 k`` while the ramp lasts)."""
    if block < 1:
        raise ValueError(f"{block=} should be >= 1")
    if n <= 0:
        return [], []
    firsts = np.arange(0, n, block, dtype=np.int64)[rng.permutation(-(-n // block))]
    lengths = np.minimum(block, n - firsts)
    read = np.repeat(firsts - (np.cumsum(lengths) - lengths), lengths) + np.arange(n, dtype=np.int64)
    return read.tolist(), read[_buffer_emitted(n, size=buffer_size, initial=initial, rng=rng)].tolist()


def reorder(source: Iterator[tuple[int, T]], order: Sequence[int]) -> Iterator[T]:
    """Yield the items of ``source`` (``(position, item)`` pairs) in ``order`` of positions.

    Reads ``source`` only as far as the next position needs, so what it holds is bounded by
    how far ``order`` runs ahead of the read order (the buffer size for :func:`array_order`).
    """
    pending: dict[int, T] = {}
    for pos in order:
        while pos not in pending:
            try:
                got, item = next(source)
            except StopIteration:
                raise RuntimeError(f"source ended before position {pos} was read") from None
            pending[got] = item
        yield pending.pop(pos)
