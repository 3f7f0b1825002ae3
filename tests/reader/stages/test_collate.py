"""The Collate stage: the collate function over each batch; its state is its source's."""

from __future__ import annotations

from typing import Any

import torch

from shardify.reader.sample.collate import default_collate
from shardify.reader.stages.base import Mapped
from shardify.reader.stages.batch import Cut
from shardify.reader.stages.collate import Collate
from shardify.reader.stages.read import Read


def test_collates_each_batch_and_restores(check_midpoints: Any, fake_reader: Any) -> None:
    def make() -> Collate:
        values = Mapped(Read(fake_reader(), ((0, 0, 7),), list(range(7))), lambda pair: pair[1]["x"])
        return Collate(Cut(values, [3, 3, 1]), default_collate)

    full = check_midpoints(make)
    assert [t.tolist() for t in full] == [[0, 1, 2], [3, 4, 5], [6]]
    assert all(t.dtype == torch.int64 for t in full)
