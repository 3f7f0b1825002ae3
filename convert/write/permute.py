"""The converter's seeded order of a big split: :class:`shardify.permute.KeyedPermutation`
keyed by ``{seed}:{split}`` (see :data:`~shardify.convert.write.plan.PERMUTE_MIN_SAMPLES`)."""

from __future__ import annotations

from shardify.permute import KeyedPermutation as _Keyed

__all__ = ["KeyedPermutation"]


class KeyedPermutation(_Keyed):
    """The permutation of ``range(n)`` for ``(seed, split)``: positions ``lo..hi`` in O(hi - lo)."""

    def __init__(self, n: int, *, seed: int, split: str) -> None:
        super().__init__(n, label=f"{seed}:{split}")
