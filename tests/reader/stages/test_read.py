"""The Read stage: positions in read order, consumed ones never read, restore without reading."""

from __future__ import annotations

from typing import Any

from shardify.reader.stages.read import Read

RANGES = ((0, 0, 5), (2, 3, 7), (1, 0, 3))  # 12 positions


def test_reads_each_run_once_and_restores_at_every_midpoint(check_midpoints: Any, fake_reader: Any) -> None:
    order = [0, 1, 2, 7, 8, 3, 4, 5, 6, 9, 10, 11]
    full = check_midpoints(lambda: Read(fake_reader(), RANGES, order), range(13))
    assert [p for p, _ in full] == order
    assert full[7][1]["x"] == 200 + 3  # position 5: shard 2's first, sample 3
    reader = fake_reader()
    list(Read(reader, RANGES, order))
    assert reader.reads == [(0, 0, 3), (2, 5, 7), (0, 3, 5), (2, 3, 5), (1, 0, 3)]
    assert reader.announced[0] == reader.reads and reader.announced[-1] == []


def test_a_restored_read_skips_without_reading(fake_reader: Any) -> None:
    reader = fake_reader()
    stage = Read(reader, RANGES, list(range(12)))
    stage.load_state_dict({"yielded": 10})
    assert [p for p, _ in stage] == [10, 11]
    assert reader.reads == [(1, 1, 3)]


def test_consumed_positions_are_never_read(fake_reader: Any) -> None:
    reader = fake_reader()
    stage = Read(reader, RANGES, list(range(12)))
    consumed = bytearray(12)
    consumed[1] = consumed[2] = consumed[9] = 1
    stage.consume(consumed)
    assert [p for p, _ in stage] == [0, 3, 4, 5, 6, 7, 8, 10, 11]
    assert reader.reads == [(0, 0, 1), (0, 3, 5), (2, 3, 7), (1, 1, 3)]
