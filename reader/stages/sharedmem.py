"""ToSharedMemory: each collated batch moved into a worker's shared-memory slot and packed for the main process.

The last stage in a DataLoader worker. ``slots`` (the worker's
:class:`~shardify.reader.delivery.batchpool.SlotPool`, given by whoever wires the stages) returns
each batch packed (:meth:`~shardify.reader.delivery.batchpool.SlotPool.send`): its large tensors
as references to recycled shared-memory slots, those collate made over a slot as they are, any
other copied into one. The main process maps each slot once and the batch arrives without a
fresh shared-memory segment per tensor. Its place is its source's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from shardify.reader.stages.base import Mapped, Stage

__all__ = ["Slots", "ToSharedMemory"]


class Slots(Protocol):
    """Where batches go to travel: ``send(batch)`` gives what the worker hands to the DataLoader."""

    def send(self, batch: Any) -> Any: ...


class ToSharedMemory(Mapped[Any]):
    """``slots.send`` on each batch of ``source``; its state is its source's."""

    def __init__(self, source: Iterator[Any] | Stage[Any], slots: Slots) -> None:
        super().__init__(source, slots.send)
        self.slots = slots
