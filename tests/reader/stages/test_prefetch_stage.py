"""``DevicePrefetcher`` as a stage: save and restore at every midpoint, the batches prepared ahead
not counted (on the CPU; the CUDA path is the same code with a stream)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch

from shardify.reader.delivery.prefetch import DECODE_AHEAD, DevicePrefetcher
from shardify.reader.sample.prepared import EncodedBatch
from shardify.reader.stages.base import Stage


class Batches(Stage[tuple[torch.Tensor, int]]):
    """A stage of ``n`` image batches (uint8, one value each) and their index."""

    def __init__(self, n: int) -> None:
        self.n, self.i, self.taken = n, 0, 0

    def __next__(self) -> tuple[torch.Tensor, int]:
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        self.taken += 1
        return torch.full((2, 3, 2, 2), self.i - 1, dtype=torch.uint8), self.i - 1

    def state_dict(self) -> dict[str, Any]:
        return {"i": self.i}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.i = int(state["i"])

    def skip(self, n: int) -> None:
        self.i = min(n, self.n)


@pytest.mark.parametrize("n", [0, 1, 6])
def test_over_a_stage_source_it_restores_at_every_midpoint(n: int, check_midpoints: Any) -> None:
    full = check_midpoints(lambda: DevicePrefetcher(Batches(n), device="cpu"), range(n + 1))
    assert [label for _, label in full] == list(range(n))


def test_its_state_is_the_sources_at_the_last_batch_handed_out_not_at_those_prepared_ahead() -> None:
    source = Batches(6)
    stage = DevicePrefetcher(source, device="cpu")
    next(stage), next(stage)
    assert source.taken == 3  # one prepared ahead
    assert stage.state_dict() == {"yielded": 2, "source": {"i": 2}}


def test_over_a_plain_iterable_it_passes_over_the_batches_handed_out(check_midpoints: Any) -> None:
    def make() -> DevicePrefetcher:
        return DevicePrefetcher([(torch.full((1, 3, 2, 2), i, dtype=torch.uint8), i) for i in range(5)], device="cpu")

    full = check_midpoints(make, range(6))
    assert [label for _, label in full] == list(range(5))


def test_with_a_decode_thread_it_restores_too(check_midpoints: Any) -> None:
    def encoded(i: int) -> EncodedBatch:
        z = torch.zeros(0)
        return EncodedBatch(torch.tensor([i], dtype=torch.uint8), z, z, z, z, z, z, (2, 2), [f"s{i}"], [f"k{i}"])

    def decode(batch: EncodedBatch) -> tuple[torch.Tensor, None]:
        return torch.full((1, 3, 2, 2), int(batch.data[0]), dtype=torch.uint8), None

    class Encoded(Batches):
        def __next__(self) -> Any:  # type: ignore[override]
            _, i = super().__next__()
            return (encoded(i), i)

    n = 2 * DECODE_AHEAD + 1
    full = check_midpoints(lambda: DevicePrefetcher(Encoded(n), device="cpu", decode=decode), range(n + 1))
    assert [label for _, label in full] == list(range(n))
