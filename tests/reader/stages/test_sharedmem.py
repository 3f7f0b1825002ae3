"""The ToSharedMemory stage: batches through a worker's shared-memory slots, resumable at any midpoint."""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from multiprocessing.reduction import ForkingPickler
from typing import Any

import pytest
import torch
import torch.multiprocessing  # noqa: F401 - registers the tensor reductions with ForkingPickler

import shardify.reader.delivery.batchpool as bp
from shardify.reader.sample.collate import default_collate
from shardify.reader.stages.base import Mapped, Stage
from shardify.reader.stages.sharedmem import ToSharedMemory


class Batches(Stage[Any]):
    """``n`` collated batches of images and labels, each a function of its index (resumable)."""

    def __init__(self, n: int) -> None:
        self.n, self.i = n, 0

    def __next__(self) -> Any:
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        k = self.i - 1
        return default_collate([(torch.full((3, 8, 8), 10 * k + j, dtype=torch.uint8), k) for j in range(4)])

    def state_dict(self) -> dict[str, Any]:
        return {"i": self.i}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.i = int(state["i"])

    def skip(self, n: int) -> None:
        self.i = min(n, self.n)


@pytest.fixture()
def channel() -> Any:
    ch = bp.BatchChannel(1, max_slots=3, inline_bytes=64)
    ch.register()
    yield ch
    ch.close()


def _received(packed: bp.Packed) -> Any:
    """What the main process gets from the DataLoader (here in one process), unpacked."""
    return pickle.loads(ForkingPickler.dumps(packed)).unpack()


def test_transport_restores_at_every_midpoint(channel: bp.BatchChannel, check_midpoints: Any) -> None:
    def make() -> Stage[Any]:
        return Mapped(ToSharedMemory(Batches(6), bp.SlotPool(channel, 0)), _received)

    full = check_midpoints(make, range(7))
    assert len(full) == 6
    for k, (images, labels) in enumerate(full):
        assert images[:, 0, 0, 0].tolist() == [10 * k + j for j in range(4)] and labels.tolist() == [k] * 4


def test_transport_sends_the_images_through_a_slot(channel: bp.BatchChannel) -> None:
    packed = next(ToSharedMemory(Batches(1), bp.SlotPool(channel, 0)))
    assert [type(x).__name__ for x in packed.payload] == ["_SlotRef", "_Inline"] and len(packed.refs) == 1
