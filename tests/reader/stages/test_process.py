"""The Process stage: a map of the sample processor, per item or per batch; its state is its source's."""

from __future__ import annotations

from typing import Any

import pytest

from shardify.reader.stages.batch import Cut
from shardify.reader.stages.process import Process, by_stream
from shardify.reader.stages.read import Read

RANGES = ((0, 0, 6), (1, 0, 5))


def _double(item: Any) -> int:
    return int(item[1]["x"]) * 2


@pytest.mark.parametrize("batched", [False, True])
def test_maps_each_item_or_batch_and_restores(batched: bool, check_midpoints: Any, fake_reader: Any) -> None:
    def make() -> Process:
        source = Read(fake_reader(), RANGES, list(range(11)))
        return Process(Cut(source, [4, 4, 3]) if batched else source, _double, batched=batched)

    full = check_midpoints(make)
    flat = [x for g in full for x in g] if batched else full
    assert flat == [2 * x for x in [0, 1, 2, 3, 4, 5, 100, 101, 102, 103, 104]]


def test_by_stream_sends_each_item_to_its_streams_processor() -> None:
    process = by_stream([lambda x: ("a", x), lambda x: ("b", x)])
    assert process({"__stream__": 1})[0] == "b"
    assert process("lost")[0] == "a"  # not a sample dict: the first stream's processor
