"""How a batch's tensors travel from a worker's slots (:mod:`~shardify.reader.delivery.batchpool`,
:mod:`~shardify.reader.mapslots`): a reference into a slot, or a small tensor by value; the walk
over a batch's structure; a slot's size and its bytes as an array."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__: list[str] = []  # internal to batchpool and mapslots


def _capacity(nbytes: int) -> int:
    """``nbytes`` rounded up to within 1/8 above it (at least a page): batch sizes vary a little."""
    step = 1 << max(12, nbytes.bit_length() - 4)
    return max(step, -(-nbytes // step) * step)


def _storage_bytes(storage: torch.UntypedStorage) -> np.ndarray:
    """The whole of ``storage`` as a uint8 array (keeping it alive)."""
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,)).numpy()


@dataclass(frozen=True, slots=True)
class _SlotRef:
    """A tensor over a slot: where it lies there."""

    slot: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


@dataclass(frozen=True, slots=True)
class _Inline:
    """A small tensor, by value."""

    data: bytes
    dtype: torch.dtype
    shape: tuple[int, ...]

    @staticmethod
    def of(t: torch.Tensor) -> _Inline:
        flat = t.detach().contiguous().reshape(-1)
        return _Inline(flat.view(torch.uint8).numpy().tobytes(), t.dtype, tuple(t.shape))

    def tensor(self) -> torch.Tensor:
        if not self.data:
            return torch.empty(self.shape, dtype=self.dtype)
        return torch.frombuffer(bytearray(self.data), dtype=torch.uint8).view(self.dtype).reshape(self.shape)


def _inlinable(t: torch.Tensor) -> bool:
    return (
        t.device.type == "cpu"
        and t.layout == torch.strided
        and not t.is_quantized
        and not t.requires_grad
        and not t.is_conj()
        and not t.is_neg()
    )


def _map_leaves(obj: Any, fn: Callable[[Any], Any]) -> Any:
    """``obj`` with ``fn`` applied to every leaf of its tuples, namedtuples, lists and dicts.

    Only those exact types are opened; anything else (subclasses included) is a leaf.
    """
    kind = type(obj)
    if kind is tuple or kind is list:
        return kind(_map_leaves(x, fn) for x in obj)
    if kind is dict:
        return {k: _map_leaves(v, fn) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return kind(*(_map_leaves(x, fn) for x in obj))
    return fn(obj)
