"""The driver's worker pools (scan, plan): results in order, a bounded number ahead, and a
worker that dies is an error naming the stage, never a hang."""

from __future__ import annotations

import os
import signal

import pytest

from shardify.convert.driverpool import map_in_order
from shardify.errors import WorkerError


def _square(x: int) -> int:
    return x * x


def _die_at(x: int, bad: int) -> int:
    if x == bad:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_results_come_back_in_order(method: str) -> None:
    assert list(map_in_order(_square, ((x,) for x in range(50)), workers=3, method=method, what="t", ahead=1)) == [
        x * x for x in range(50)
    ]


def test_calls_are_drawn_a_bounded_number_ahead() -> None:
    drawn: list[int] = []

    def calls():  # noqa: ANN202
        for x in range(100):
            drawn.append(x)
            yield (x,)

    results = map_in_order(_square, calls(), workers=2, method="fork", what="t", ahead=2)
    assert next(results) == 0
    assert len(drawn) == 2 * 2 + 1  # the window, then one more for the result taken
    assert list(results) == [x * x for x in range(1, 100)]


def test_a_worker_that_dies_raises_naming_the_stage() -> None:
    with pytest.raises(WorkerError, match="scanning /data: a worker process died"):
        list(map_in_order(_die_at, ((x, 7) for x in range(20)), workers=2, method="fork", what="scanning /data"))


def test_a_plan_worker_that_dies_fails_the_plan(monkeypatch) -> None:
    from shardify.convert.inputs.inputs import SampleSpec, Scan
    from shardify.convert.options import ConvertOptions
    from shardify.convert.write import plan as plan_mod

    real = plan_mod._plan_chunk

    def dies_in_the_second_chunk(job, lo, hi):  # noqa: ANN001, ANN202
        if lo:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(job, lo, hi)

    scan = Scan(root="r", source="listing", samples=[SampleSpec(f"k{i}", f"k{i}", i % 3, i % 3) for i in range(40)])
    monkeypatch.setattr(plan_mod, "POOL_MIN_SAMPLES", 0)
    monkeypatch.setattr(plan_mod, "_CHUNK", 8)
    monkeypatch.setattr(plan_mod, "_plan_chunk", dies_in_the_second_chunk)
    with pytest.raises(WorkerError, match="planning the split: a worker process died"):
        plan_mod.plan_split(scan, ConvertOptions(workers=2, samples_per_shard=4))
