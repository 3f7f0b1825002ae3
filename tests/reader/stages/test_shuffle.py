"""The Shuffle stage: output order from a reorder buffer, rebuilt by reading on restore."""

from __future__ import annotations

from typing import Any

import pytest

from shardify.reader.plan.assign import WorkerPlan
from shardify.reader.plan.resume import PlanOptions, share_order
from shardify.reader.stages.base import Mapped
from shardify.reader.stages.read import Read
from shardify.reader.stages.shuffle import Shuffle

RANGES = ((0, 0, 20), (1, 5, 25), (2, 0, 9))


def _orders(seed: int) -> tuple[list[int], list[int]]:
    plan = WorkerPlan(ranges=RANGES, batch_size=4)
    opts = PlanOptions(seed=seed, shuffle=True, batch_size=4, drop_last=False, block=3, buffer=8)
    return share_order(plan, opts, epoch=1, rank=0, worker=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_yields_the_output_order_and_restores_at_every_midpoint(
    seed: int, check_midpoints: Any, fake_reader: Any
) -> None:
    read, out = _orders(seed)
    full = check_midpoints(lambda: Shuffle(Read(fake_reader(), RANGES, read), out), range(len(out) + 1))
    keys = [f"s{s}/{i}" for s, a, b in RANGES for i in range(a, b)]
    assert [x["__key__"] for x in full] == [keys[p] for p in out]


def test_a_restored_shuffle_never_reads_what_its_output_consumed(fake_reader: Any) -> None:
    read, out = _orders(0)
    reader = fake_reader()
    stage = Shuffle(Read(reader, RANGES, read), out)
    stage.load_state_dict({"yielded": 30})
    rest = list(stage)
    assert len(rest) == len(out) - 30
    read_keys = {(s, i) for s, a, b in reader.reads for i in range(a, b)}
    assert len(read_keys) == len(out) - 30  # each position left read once, none of the first 30


def test_through_a_map_it_needs_its_read_stage(check_midpoints: Any, fake_reader: Any) -> None:
    read, out = _orders(0)
    with pytest.raises(TypeError, match="pass read="):
        Shuffle(Mapped(Read(fake_reader(), RANGES, read), lambda pair: pair), out)

    def make() -> Shuffle:
        source = Read(fake_reader(), RANGES, read)
        return Shuffle(Mapped(source, lambda pair: (pair[0], pair[1]["x"])), out, read=source)

    check_midpoints(make)
