"""``MapDataset.collate``'s batches from DataLoader workers through recycled shared memory.

A plain ``DataLoader`` sends each batch tensor made in a worker in a fresh shared-memory
segment: the worker creates it and faults every page of it into existence (9.6 MB for
64 x 3 x 224 x 224 uint8), a tenth of the worker's time for a batch of JPEG photos. Here each
worker keeps a few *slots*: a shared storage holding all the tensors of one batch (each at a
64-byte boundary) and, after them, one busy word. :func:`collate_in_slot` stacks a batch into a
free slot (or copies already stacked columns there, :func:`columns_in_slot`) and sets its busy
word; the batch then travels as one storage by torch's own sharing (its file descriptor),
and unpickling it in the main process gives the batch itself (tensors over the slot: nothing
to set up or unpack there, so any ``DataLoader`` works). When the last of those tensors is
freed, the main process clears the busy word, and only then does the worker write there again:
a batch the training loop keeps keeps its slot. With :data:`SLOTS` busy, a worker's batch goes
in fresh shared memory, as torch's would.

``make_loader``'s :mod:`~shardify.reader.delivery.batchpool` does the same with a token table
the main process makes before the workers start; a map-style dataset has no such moment, so
here the busy word travels in the slot. Outside a worker these functions change nothing.
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate, get_worker_info
from torch.utils.data._utils.collate import collate, collate_tensor_fn, default_collate_fn_map

from shardify.reader.delivery.slotwire import _capacity, _map_leaves, _SlotRef, _storage_bytes

__all__ = ["collate_in_slot", "columns_in_slot", "SLOTS"]

SLOTS = 6
"""Slots per worker: the batches a ``DataLoader`` queues (``prefetch_factor=2``), the one in
the loop, one kept, and the one being made."""

_ALIGN = 64
_BUSY = 8  # bytes of the busy word (int64) after a slot's capacity


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


@dataclass(slots=True)
class _Slot:
    storage: torch.UntypedStorage
    capacity: int  # bytes for tensors, before the busy word
    busy: np.ndarray  # the busy word: int64 [1], a view of the storage


class _Slots:
    """This worker process's slots (one set per process, made on first use)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.slots: list[_Slot] = []

    def take(self, nbytes: int) -> _Slot | None:
        """A free slot of at least ``nbytes``, now busy; None when all :data:`SLOTS` are busy."""
        free = [s for s in self.slots if not s.busy[0]]
        fits = [s for s in free if nbytes <= s.capacity <= max(4 * nbytes, _capacity(nbytes))]
        if fits:
            slot = min(fits, key=lambda s: s.capacity)
        elif len(self.slots) < SLOTS or free:
            if len(self.slots) >= SLOTS:
                self.slots.remove(free[0])  # the wrong size: the main process frees its mapping on its own
            capacity = _capacity(nbytes)
            storage = torch.UntypedStorage._new_shared(capacity + _BUSY)
            busy = _storage_bytes(storage)[capacity:].view(np.int64)
            slot = _Slot(storage, capacity, busy)
            self.slots.append(slot)
        else:
            return None
        slot.busy[0] = 1
        return slot


_SLOTS: _Slots | None = None


def _slots() -> _Slots:
    global _SLOTS
    if _SLOTS is None or _SLOTS.pid != os.getpid():  # a forked worker starts its own
        _SLOTS = _Slots()
    return _SLOTS


class _Arena:
    """Tensors laid out one after another in a slot."""

    def __init__(self, slot: _Slot) -> None:
        self.slot, self.at = slot, 0

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        size = torch.empty((), dtype=dtype).element_size()
        at, nbytes = _aligned(self.at), math.prod(shape) * size
        if at + nbytes > self.slot.capacity:
            return None
        self.at = at + nbytes
        out: torch.Tensor = torch.empty(0, dtype=dtype).set_(self.slot.storage, at // size, shape)  # type: ignore[call-overload]
        return out

    def holds(self, t: torch.Tensor) -> bool:
        return t.untyped_storage().data_ptr() == self.slot.storage.data_ptr()


def _plain(t: Any) -> bool:
    return type(t) is torch.Tensor and t.device.type == "cpu" and t.layout == torch.strided and not t.requires_grad


def _stack(batch: list[Any], *, arena: _Arena, collate_fn_map: Any = None) -> torch.Tensor:
    """``collate_tensor_fn``'s batch, stacked into the slot when every tensor is alike."""
    elem = batch[0]
    if all(_plain(t) and t.shape == elem.shape and t.dtype == elem.dtype for t in batch):
        out = arena.empty((len(batch), *elem.shape), elem.dtype)
        if out is not None:
            return torch.stack(batch, 0, out=out)
    stacked: torch.Tensor = collate_tensor_fn(batch, collate_fn_map=collate_fn_map)
    return stacked


def _leaf_bytes(obj: Any) -> int:
    """Bytes of ``obj``'s tensors and arrays, and 8 for each number: what its batch takes."""
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        return int(obj.nbytes)
    if isinstance(obj, (int, float, np.generic)):
        return 8
    if isinstance(obj, dict):
        return sum(_leaf_bytes(v) for v in obj.values())
    if isinstance(obj, (tuple, list)):
        return sum(_leaf_bytes(v) for v in obj)
    return 0


def collate_in_slot(batch: list[Any]) -> Any:
    """``default_collate(batch)``; inside a worker, its tensors made in one free slot (see the module)."""
    if get_worker_info() is None or not batch:
        return default_collate(batch)
    need = _aligned(sum(_leaf_bytes(s) for s in batch)) + _ALIGN * (1 + _leaf_count(batch[0]))
    slot = _slots().take(need)
    if slot is None:
        return default_collate(batch)
    arena = _Arena(slot)
    fns: dict[type | tuple[type, ...], Callable[..., Any]] = {
        **default_collate_fn_map,
        torch.Tensor: partial(_stack, arena=arena),
    }
    try:
        return _pack(collate(batch, collate_fn_map=fns), arena)
    except BaseException:
        slot.busy[0] = 0
        raise


def columns_in_slot(columns: Any) -> Any:
    """``columns`` (tensors in a list or tuple, or one tensor); inside a worker, their tensors
    copied into one free slot."""
    single = isinstance(columns, torch.Tensor)
    tensors = [columns] if single else [c for c in columns if _plain(c)]
    if get_worker_info() is None or not tensors:
        return columns
    slot = _slots().take(sum(_aligned(t.nbytes) for t in tensors))
    if slot is None:
        return columns
    try:
        return _pack(columns, _Arena(slot))
    except BaseException:
        slot.busy[0] = 0
        raise


def _leaf_count(obj: Any) -> int:
    if isinstance(obj, dict):
        return sum(_leaf_count(v) for v in obj.values())
    if isinstance(obj, (tuple, list)):
        return sum(_leaf_count(v) for v in obj)
    return 1


def _pack(batch: Any, arena: _Arena) -> Any:
    """``batch`` to send: its tensors in the slot (copied there if made elsewhere and room is
    left) as references; the slot freed again when none is."""

    def encode(x: Any) -> Any:
        if not _plain(x):
            return x
        if not arena.holds(x):
            out = arena.empty(tuple(x.shape), x.dtype)
            if out is None:
                return x  # no room left: torch's own sharing
            x = out.copy_(x)
        return _SlotRef(0, x.dtype, tuple(x.shape), tuple(x.stride()), int(x.storage_offset()))

    payload = _map_leaves(batch, encode)
    if not arena.at:
        arena.slot.busy[0] = 0
        return batch
    return _InSlot(arena.slot.storage, arena.slot.capacity, payload)


@dataclass(frozen=True, slots=True)
class _InSlot:
    """A batch as a worker sends it; unpickled, it is the batch itself (:func:`_received`)."""

    storage: torch.UntypedStorage
    capacity: int
    payload: Any

    def __reduce__(self) -> tuple[Any, ...]:
        return (_received, (self.storage, self.capacity, self.payload))


def _received(storage: torch.UntypedStorage, capacity: int, payload: Any) -> Any:
    """The batch, over the slot's storage mapped in this process; the slot's busy word is cleared
    when the last of its tensors is freed."""
    base = _storage_bytes(storage)
    view = base.view()  # a new array object: its life is the life of the tensors below
    weakref.finalize(view, _free, base[capacity:].view(np.int64)).atexit = False
    whole = torch.from_numpy(view)

    def decode(x: Any) -> Any:
        if isinstance(x, _SlotRef):
            return whole.view(x.dtype).as_strided(x.shape, x.stride, x.offset)
        return x

    return _map_leaves(payload, decode)


def _free(busy: np.ndarray) -> None:
    busy[0] = 0
