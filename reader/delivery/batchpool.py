"""Batches from DataLoader workers to the training process through recycled shared memory.

Without this, every batch tensor made in a worker travels in a fresh shared-memory segment:
the worker page-faults it into existence (9.6 MB for 64 x 3 x 224 x 224 uint8), its file
descriptor is passed over a socket, and the main process frees the segment when the batch
is dropped. On a 2-core machine that is about a tenth of the reading time.

Here each worker keeps a few shared-memory *slots*, and the main process maps each slot once:

- :class:`BatchChannel` (made by ``make_loader`` for one set of worker processes, registered
  in the main process): a shared ``int64`` table ``tokens[worker, slot]``; 0 means free.
- :class:`SlotPool` (one per worker process): a collate function given its allocator
  (``default_collate(samples, empty=pool.empty)``) makes each large batch tensor over a free
  slot big enough (or a new one; past ``max_slots`` private memory) and the slot's token is
  set; :meth:`SlotPool.send` (the ToSharedMemory stage, :mod:`shardify.reader.stages.sharedmem`)
  then packs the batch: a tensor over a slot becomes a reference (no copy), another large one
  is copied into a slot (a collate that allocates for itself), a small one travels by value,
  and a slot's storage goes along the first time the main process needs it.
- In the main process, unpickling a packed batch (a :class:`Received`) maps new slot
  storages; :meth:`Received.unpack` makes tensors over the mapped slots. When the last
  tensor over a slot is freed, the slot's token is cleared if it still holds the same token;
  the worker may then write there again. A packed batch dropped without being unpacked (a
  stale batch discarded by the DataLoader) clears its tokens too.

A worker writes only into a slot whose token is 0, and only the main process clears a token,
once no tensor over the slot is left: a batch is never overwritten while the training loop
can still see it, whatever the loop keeps. A loop that keeps many batches uses up the slots,
and later batches use fresh shared memory, as without the pool.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import threading
import time
import uuid
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from shardify.errors import ShardifyError
from shardify.reader.delivery.slotwire import _capacity, _inlinable, _Inline, _map_leaves, _SlotRef, _storage_bytes
from shardify.reader.delivery.stats import MainClock
from shardify.reader.sample.clock import CLOCK

__all__ = ["BatchChannel", "SlotPool", "WorkerSlots", "Received", "unpack", "MAX_SLOTS", "INLINE_BYTES", "unsend"]

MAX_SLOTS = 16
"""The most slots per worker (``make_loader`` uses ``prefetch_factor + 3``, within this)."""

INLINE_BYTES = 64 * 1024
"""Tensors up to this size (labels, lengths) travel by value inside the pickled batch."""

_CHANNELS: dict[str, BatchChannel] = {}


def _release(tokens: np.ndarray, worker: int, slot: int, token: int) -> None:
    """Free ``slot`` for its worker, unless it was given out again meanwhile."""
    if tokens[worker, slot] == token:
        tokens[worker, slot] = 0


class BatchChannel:
    """The token table shared by one set of DataLoader workers and the main process.

    Made and :meth:`register`-ed in the main process before the workers start; pickled (or
    forked) into them with the dataset. Keeps, in the main process, the mapping of every slot
    the workers have sent.
    """

    def __init__(self, workers: int, *, max_slots: int | None = None, inline_bytes: int | None = None) -> None:
        max_slots = MAX_SLOTS if max_slots is None else max_slots
        if workers < 1 or max_slots < 1:
            raise ValueError(f"{workers=} and {max_slots=} should be >= 1")
        self.id = uuid.uuid4().hex
        self.tokens = torch.zeros((workers, max_slots), dtype=torch.int64).share_memory_()
        self.inline_bytes = INLINE_BYTES if inline_bytes is None else inline_bytes
        self._maps: dict[tuple[int, int], tuple[int, np.ndarray]] = {}
        self._lock = threading.Lock()
        self.clock: MainClock | None = None  # the loader's: unpacking and pinning add their seconds

    def __getstate__(self) -> dict[str, Any]:
        return {"id": self.id, "tokens": self.tokens, "inline_bytes": self.inline_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._maps, self._lock, self.clock = {}, threading.Lock(), None

    def register(self) -> None:
        """Accept batches for this channel in this (the main) process."""
        _CHANNELS[self.id] = self

    def close(self) -> None:
        """Stop accepting batches and drop the slot mappings (tensors still in use keep theirs)."""
        _CHANNELS.pop(self.id, None)
        with self._lock:
            self._maps.clear()

    def _adopt(self, pool: int, slot: int, generation: int, storage: torch.UntypedStorage) -> None:
        base = _storage_bytes(storage)
        with self._lock:
            self._maps[(pool, slot)] = (generation, base)

    def _slot_tensor(self, pool: int, worker: int, slot: int, generation: int, token: int) -> torch.Tensor:
        """A uint8 tensor over the whole slot; the slot is freed when its last user is gone."""
        with self._lock:
            entry = self._maps.get((pool, slot))
        if entry is None or entry[0] != generation:
            raise ShardifyError(
                f"batch slot {slot} of worker {worker} (generation {generation}) was never "
                f"received; the loader's batch channel {self.id} lost track of it"
            )
        view = entry[1].view()  # a new array object: its life is the life of the tensors below
        weakref.finalize(view, _release, self.tokens.numpy(), worker, slot, token).atexit = False
        return torch.from_numpy(view)


@dataclass(slots=True)
class _Slot:
    storage: torch.UntypedStorage
    capacity: int
    generation: int
    sent: bool = False


class SlotPool:
    """A worker's slots (see the module docstring); made in the worker process."""

    def __init__(self, channel: BatchChannel, worker: int) -> None:
        if not 0 <= worker < channel.tokens.shape[0]:
            raise ValueError(f"{worker=} outside the channel's {channel.tokens.shape[0]} workers")
        self._channel = channel.id
        self.inline_bytes = channel.inline_bytes
        self._worker = worker
        self._tokens = channel.tokens.numpy()[worker]
        self._tokens[:] = 0  # a new worker process: slots of an earlier one are not ours
        self._id = random.getrandbits(62)
        self._slots: list[_Slot | None] = []  # None: given up (see send)
        self._taken: dict[int, int] = {}  # slot -> token, taken for the batch being made
        self._next_token = random.getrandbits(61) | 1
        self._generation = 0

    def _token(self) -> int:
        self._next_token = self._next_token + 1 if self._next_token < (1 << 62) else 1
        return self._next_token

    def _new_storage(self, nbytes: int) -> tuple[torch.UntypedStorage, int, int]:
        capacity = _capacity(nbytes)
        self._generation += 1
        storage = torch.empty(capacity, dtype=torch.uint8).share_memory_().untyped_storage()
        return storage, capacity, self._generation

    def _take(self, nbytes: int) -> int | None:
        """A free slot of at least ``nbytes`` taken for the batch being made, or None (none left)."""
        free = [i for i in range(len(self._slots)) if self._tokens[i] == 0 and i not in self._taken]
        fits = [(i, s) for i in free if (s := self._slots[i]) is not None and nbytes <= s.capacity <= 4 * nbytes]
        if fits:
            i = min(fits, key=lambda f: f[1].capacity)[0]
        else:
            if len(self._slots) < len(self._tokens):
                i = len(self._slots)
                self._slots.append(None)
            elif free:  # a given-up slot, else a free one of the wrong size: a new one there
                i = next((j for j in free if self._slots[j] is None), free[0])
            else:
                return None
            self._slots[i] = _Slot(*self._new_storage(nbytes))
        token = self._token()
        self._tokens[i] = token
        self._taken[i] = token
        return i

    def _over(self, i: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        storage = cast(_Slot, self._slots[i]).storage  # a taken slot is never None
        over: torch.Tensor = torch.empty(0, dtype=dtype).set_(storage, 0, shape)  # type: ignore[call-overload]
        return over

    def empty(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised tensor for the batch being made: over a free slot when it is large (so
        :meth:`send` passes it on without a copy), else private memory. The allocator a collate
        function takes (``default_collate(samples, empty=pool.empty)``)."""
        shape = tuple(shape)
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        i = self._take(nbytes) if nbytes > self.inline_bytes else None
        return torch.empty(shape, dtype=dtype) if i is None else self._over(i, shape, dtype)

    def send(self, batch: Any) -> Packed:
        """``batch`` ready to pickle: its large tensors as references to slots (made by :meth:`empty`,
        or copied into one now), small tensors by value; tensors inside objects other than tuples,
        lists and dicts are left to torch."""
        start = time.perf_counter()
        by_pointer = {cast(_Slot, self._slots[i]).storage.data_ptr(): i for i in self._taken}
        used: set[int] = set()

        def encode(x: Any) -> Any:
            if not isinstance(x, torch.Tensor) or not _inlinable(x):
                return x
            i = by_pointer.get(x.untyped_storage().data_ptr()) if x.untyped_storage().nbytes() else None
            if i is not None:  # made over a slot: no copy
                used.add(i)
                return _SlotRef(i, x.dtype, tuple(x.shape), tuple(x.stride()), int(x.storage_offset()))
            if x.numel() * x.element_size() <= self.inline_bytes:
                return _Inline.of(x)
            i = self._take(x.numel() * x.element_size())
            if i is None:
                return x  # out of slots: torch's own sharing
            dest = self._over(i, tuple(x.shape), x.dtype)
            dest.copy_(x)
            used.add(i)
            return _SlotRef(i, x.dtype, tuple(dest.shape), tuple(dest.stride()), 0)

        try:
            payload = _map_leaves(batch, encode)
        except BaseException:
            for i in self._taken:
                self._tokens[i] = 0
            self._taken.clear()
            raise
        refs = []
        for i, token in self._taken.items():
            if i not in used:
                # Made by empty() but not among the tuples, lists and dicts of the batch (or left by a
                # collate that failed): it may still sit in some other object, which torch pickles as
                # usual (sharing the memory), so the slot is given up rather than written again.
                self._slots[i] = None
                self._tokens[i] = 0
                continue
            s = cast(_Slot, self._slots[i])
            refs.append((i, s.generation, token, None if s.sent else s.storage))
            s.sent = True
        self._taken = {}
        CLOCK.transfer += time.perf_counter() - start
        return Packed(self._channel, self._id, self._worker, tuple(refs), payload)


def unsend(pool: SlotPool | None, batch: Any) -> None:
    """Give back the slots of ``batch``, packed by ``pool`` but never sent (made ahead, then dropped)."""
    if pool is None or not isinstance(batch, Packed):
        return
    for i, _, token, storage in batch.refs:
        if pool._tokens[i] == token:
            pool._tokens[i] = 0
        s = pool._slots[i]
        if storage is not None and s is not None:
            s.sent = False  # the main process never mapped it: send its storage next time


class WorkerSlots:
    """A dataset's batch channel, taken by its worker processes with their copy of the dataset,
    and each worker process's :class:`SlotPool` on it (made on first use in that process)."""

    def __init__(self) -> None:
        self._channel: BatchChannel | None = None
        self._pool: tuple[int, SlotPool] | None = None

    @contextlib.contextmanager
    def attached(self, channel: BatchChannel) -> Iterator[None]:
        """Worker processes started inside this block take ``channel``; the dataset lets go after."""
        self._channel = channel
        try:
            yield
        finally:
            self._channel = None

    def pool(self, worker: int) -> SlotPool | None:
        """This worker process's pool, or None without a channel (or a worker it has no slots for)."""
        if self._channel is None or worker >= self._channel.tokens.shape[0]:
            return None
        pid = os.getpid()
        if self._pool is None or self._pool[0] != pid:
            self._pool = (pid, SlotPool(self._channel, worker))
        return self._pool[1]

    def __getstate__(self) -> dict[str, Any]:
        return {"_channel": self._channel, "_pool": None}  # a spawned worker makes its own pool


@dataclass(frozen=True, slots=True)
class Packed:
    """A batch as a worker sends it; arrives in the main process as a :class:`Received`."""

    channel: str
    pool: int
    worker: int
    refs: tuple[tuple[int, int, int, torch.UntypedStorage | None], ...]  # (slot, generation, token, storage)
    payload: Any

    def __reduce__(self) -> tuple[Any, ...]:
        return (_receive, (self.channel, self.pool, self.worker, self.refs, self.payload))


def _receive(channel_id: str, pool: int, worker: int, refs: tuple[Any, ...], payload: Any) -> Received:
    """Unpickling in the main process: map the slots sent along (never raises, see Received)."""
    channel = _CHANNELS.get(channel_id)
    if channel is not None:
        for slot, generation, _, storage in refs:
            if storage is not None:
                channel._adopt(pool, slot, generation, storage)
    return Received(channel, channel_id, pool, worker, tuple((s, g, t) for s, g, t, _ in refs), payload)


class Received:
    """A packed batch in the main process; :meth:`unpack` gives the batch itself."""

    def __init__(
        self,
        channel: BatchChannel | None,
        channel_id: str,
        pool: int,
        worker: int,
        refs: tuple[tuple[int, int, int], ...],
        payload: Any,
    ) -> None:
        self._channel, self._channel_id = channel, channel_id
        self._pool, self._worker = pool, worker
        self._refs = refs
        self._payload = payload
        self._tokens = channel.tokens.numpy() if channel is not None else None

    def unpack(self) -> Any:
        """The batch: tensors over the slots (freed for the worker once all are dropped)."""
        if self._channel is None:
            raise ShardifyError(
                f"a batch arrived for batch channel {self._channel_id}, which is not open in this "
                f"process (its loader was closed)"
            )
        start = time.perf_counter()
        refs, self._refs = self._refs, ()
        slots = {}
        try:
            for slot, generation, token in refs:
                slots[slot] = self._channel._slot_tensor(self._pool, self._worker, slot, generation, token)
        except BaseException:
            self._refs = tuple(r for r in refs if r[0] not in slots)
            raise

        def decode(x: Any) -> Any:
            if isinstance(x, _SlotRef):
                return slots[x.slot].view(x.dtype).as_strided(x.shape, x.stride, x.offset)
            if isinstance(x, _Inline):
                return x.tensor()
            return x

        batch = _map_leaves(self._payload, decode)
        if self._channel.clock is not None:
            self._channel.clock.add("transfer", time.perf_counter() - start)
        return batch

    def pin_memory(self, device: Any = None) -> Any:
        """What DataLoader's pin-memory thread calls: the batch, copied to pinned memory."""
        from torch.utils.data._utils.pin_memory import pin_memory

        batch = self.unpack()
        start = time.perf_counter()
        pinned = pin_memory(batch)
        if self._channel is not None and self._channel.clock is not None:
            self._channel.clock.add("pin", time.perf_counter() - start)
        return pinned

    def __del__(self) -> None:
        if self._refs and self._tokens is not None:  # dropped unused: give the slots back
            try:
                for slot, _, token in self._refs:
                    _release(self._tokens, self._worker, slot, token)
            except Exception:  # noqa: BLE001 - at interpreter exit the table may be gone already
                pass


def unpack(batch: Any) -> Any:
    """``batch.unpack()`` for a :class:`Received`, anything else unchanged."""
    return batch.unpack() if isinstance(batch, Received) else batch
