"""The converter's one executor interface: results in order, a bounded number ahead, a
worker that dies is an error naming the stage (never a hang), an error of ``fn`` reaches the
caller, and a map left early stops its workers."""

from __future__ import annotations

import os
import signal

import pytest

from shardify.convert.executor import Executor, LocalExecutor, executor_kind
from shardify.convert.pyapi.supervise import SupervisedExecutor
from shardify.errors import WorkerError


def _square(x: int) -> int:
    return x * x


def _power(n: int, x: int) -> int:
    return x**n


def _die_at(bad: int, x: int) -> int:
    if x == bad:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def _fails_at(bad: int, x: int) -> int:
    if x == bad:
        raise ValueError(f"item {x} is bad")
    return x


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_results_come_back_in_order(method: str) -> None:
    with LocalExecutor(workers=3, window=4, method=method) as ex:
        assert list(ex.map(_square, range(50))) == [(x, x * x) for x in range(50)]


@pytest.mark.parametrize("workers", [1, 2])
def test_args_come_before_the_item_in_a_worker_and_in_this_process(workers: int) -> None:
    assert [r for _, r in LocalExecutor(workers=workers).map(_power, range(6), args=(3,))] == [x**3 for x in range(6)]


def test_items_are_drawn_a_bounded_number_ahead() -> None:
    drawn: list[int] = []

    def items():  # noqa: ANN202
        for x in range(100):
            drawn.append(x)
            yield x

    results = LocalExecutor(workers=2, window=5, method="fork").map(_square, items())
    assert next(results) == (0, 0)
    assert len(drawn) == 5  # the window, the one taken back included
    assert [r for _, r in results] == [x * x for x in range(1, 100)]


def test_a_worker_that_dies_raises_naming_the_stage() -> None:
    with pytest.raises(WorkerError, match="scanning /data: a worker process died"):
        list(LocalExecutor(workers=2, method="fork", what="scanning /data").map(_die_at, range(20), args=(7,)))


def test_an_error_of_fn_reaches_the_caller_with_its_type_and_message() -> None:
    with pytest.raises(ValueError, match="item 7 is bad"):
        list(LocalExecutor(workers=2, method="fork").map(_fails_at, range(20), args=(7,)))


def test_a_map_left_early_stops_its_workers() -> None:
    ex = LocalExecutor(workers=2, method="fork")
    results = ex.map(_square, range(1000))
    next(results)
    results.close()
    assert ex._pools == []  # shut down when the map was left


def test_every_implementation_is_an_executor() -> None:
    from shardify.convert.executor_ray import RayExecutor
    from shardify.convert.pyapi.supervise import Limits

    executors: list[Executor] = [
        LocalExecutor(workers=1),
        SupervisedExecutor(workers=1, limits=Limits()),
        RayExecutor(address=None),
    ]
    assert all(isinstance(ex, Executor) for ex in executors)


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


@pytest.mark.parametrize(
    "engine, workers, supervised, kind",
    [
        pytest.param("ray", 1, False, "ray", id="ray-one-worker"),
        pytest.param("ray", 8, True, "ray", id="ray-with-limits"),
        pytest.param("local", 1, True, "supervised", id="limits-one-worker"),
        pytest.param("local", 4, True, "supervised", id="limits-four-workers"),
        pytest.param("local", 1, False, "this-process", id="one-worker"),
        pytest.param("local", 0, False, "this-process", id="no-worker"),
        pytest.param("local", 2, False, "processes", id="two-workers"),
    ],
)
def test_one_rule_picks_the_executor_for_shards_and_items(
    engine: str, workers: int, supervised: bool, kind: str
) -> None:
    # write_shards (planned shards) and map_ordered (convert_items) both ask this function
    assert executor_kind(engine=engine, workers=workers, supervised=supervised) == kind
