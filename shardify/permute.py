"""A keyed permutation of ``range(n)`` that any part can compute alone, in constant memory.

Used by the converter (a big split's sample order, keyed by seed and split) and by the reader
(an epoch's block order, keyed by seed and epoch). The rule: position ``p`` of the order holds
``perm(p)``, where ``perm`` is a 6-round
balanced Feistel network over ``2 * h`` bits (the smallest even number of bits that counts
to ``n``, so the domain is less than ``4 * n``) followed by cycle walking (apply it again
while the value is ``n`` or more), which keeps it a bijection of ``range(n)``. Round ``r``
maps ``(L, R)`` to ``(R, L ^ F(R ^ k_r))`` with ``F`` the splitmix64 finalizer cut to ``h``
bits and ``k_r`` the ``r``-th 8 bytes of SHA-256 of ``shardify-permutation:{label}`` (the converter's label:
``{seed}:{split}``).
Positions ``lo..hi`` (or any array of positions) cost O(their number) time and memory whatever
``n``: a plan computes its part of the order alone, in any process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np

__all__ = ["KeyedPermutation"]

_ROUNDS = 6
_CHUNK = 1 << 16


class KeyedPermutation(Sequence[int]):
    """``perm(0), perm(1), ..., perm(n - 1)`` (the module's rule) keyed by ``label``;
    a slice is a numpy int64 array."""

    def __init__(self, n: int, *, label: str) -> None:
        if n < 0:
            raise ValueError(f"{n=} should be >= 0")
        self._n = n
        bits = max(2, (n - 1).bit_length())
        self._half = (bits + 1) // 2
        digest = hashlib.sha256(f"shardify-permutation:{label}".encode()).digest()
        digest += hashlib.sha256(digest).digest()
        self._keys = [np.uint64(int.from_bytes(digest[8 * r : 8 * r + 8], "little")) for r in range(_ROUNDS)]

    def __len__(self) -> int:
        return self._n

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        half = np.uint64(self._half)
        mask = np.uint64((1 << self._half) - 1)
        left, right = x >> half, x & mask
        for key in self._keys:
            z = right ^ key
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z ^= z >> np.uint64(31)
            left, right = right, left ^ (z & mask)
        out: np.ndarray = (left << half) | right
        return out

    def positions(self, lo: int, hi: int) -> np.ndarray:
        """``perm(p)`` for ``p`` in ``lo..hi`` (clipped to ``range(n)``), as int64."""
        lo, hi = max(lo, 0), min(hi, self._n)
        if hi <= lo:
            return np.zeros(0, dtype=np.int64)
        return self.at(np.arange(lo, hi, dtype=np.int64))

    def at(self, positions: np.ndarray) -> np.ndarray:
        """``perm(p)`` for each ``p`` of ``positions`` (ints in ``range(n)``), as int64."""
        pos = np.asarray(positions, dtype=np.int64)
        if pos.size and (int(pos.min()) < 0 or int(pos.max()) >= self._n):
            raise IndexError(f"positions should be in [0, {self._n}), found {int(pos.min())}..{int(pos.max())}")
        n = np.uint64(self._n)
        with np.errstate(over="ignore"):
            out = self._encrypt(pos.astype(np.uint64))
            walking = np.flatnonzero(out >= n)
            while len(walking):
                values = self._encrypt(out[walking])
                out[walking] = values
                walking = walking[values >= n]
        return out.astype(np.int64)

    # (a slice is an int64 ndarray: a sequence at run time, which numpy's stubs don't say)
    @overload  # type: ignore[override]
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> np.ndarray: ...
    def __getitem__(self, i: int | slice) -> int | np.ndarray:
        if isinstance(i, slice):
            start, stop, step = i.indices(self._n)
            if step != 1:
                return np.array([self[j] for j in range(start, stop, step)], dtype=np.int64)
            return self.positions(start, stop)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"position {i} of {self._n}")
        return int(self.positions(i, i + 1)[0])

    def __iter__(self) -> Iterator[int]:
        for lo in range(0, self._n, _CHUNK):
            yield from self.positions(lo, lo + _CHUNK).tolist()
