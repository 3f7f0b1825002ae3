"""Faults while training: a killed worker, a failing transform, leaving early, many epochs.

Each must end in a clear error in the training process (never a hang: every test runs under
a time limit) and leave no worker processes, threads or open files behind.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardify.cli.bench import child_pids
from shardify.errors import SampleError, WorkerError
from shardify.reader import DecodeOptions, ShardedDataset, make_loader

ROOT = Path(__file__).resolve().parents[2]


TIME_LIMIT_S = 60
"""A hang fails the test instead of stalling the run (see tests/conftest.py)."""


# -- what a process holds ------------------------------------------------------------------------


def _children() -> set[int]:
    return set(child_pids())


def _fds() -> dict[int, str]:
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the fd listdir itself used
            continue
    return out


def snapshot() -> dict[str, Any]:
    """Threads, open files and child processes of this process."""
    return {
        "threads": len(os.listdir("/proc/self/task")),
        "fds": _fds(),
        "children": _children(),
        "mp_children": {p.pid for p in multiprocessing.active_children()},
    }


def assert_back_to(before: dict[str, Any], *, within: float = 15.0) -> None:
    """Wait (bounded) until threads, fds and children are what they were ``before``."""
    deadline = time.monotonic() + within
    while True:
        gc.collect()
        now = snapshot()
        leaked = {
            "threads": now["threads"] - before["threads"],
            "fds": {fd: target for fd, target in now["fds"].items() if fd not in before["fds"]},
            "children": now["children"] - before["children"],
            "mp_children": now["mp_children"] - before["mp_children"],
        }
        if leaked["threads"] <= 0 and not any(leaked[k] for k in ("fds", "children", "mp_children")):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"left behind after {within} s: {leaked}")
        time.sleep(0.05)


@pytest.fixture
def counting(counting_dataset) -> Callable[..., ShardedDataset]:
    """``make(**kw)``: a ShardedDataset of 3 shards of 20 counting samples, batches of 4."""
    root = counting_dataset([20, 20, 20])

    def make(**kw: Any) -> ShardedDataset:
        if "map" not in kw:
            kw.setdefault("fields", ("cls",))
        return ShardedDataset(root, batch_size=4, shuffle=True, **kw)

    return make


@pytest.fixture
def warm(counting) -> None:
    """One full run first, so that one-time set-up (torch's handlers, imports) is not a leak."""
    with make_loader(counting(), num_workers=2) as loader:
        list(loader)
    gc.collect()


def _slow(sample: dict[str, Any]) -> int:
    time.sleep(0.01)
    return int(sample["cls"])


def _values(batches: list[Any]) -> list[int]:
    return sorted(int(x) for b in batches for x in b)


# -- a worker killed mid-epoch --------------------------------------------------------------------


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "per_epoch"])
def test_killed_worker_gives_a_clear_error_then_resumes_exactly(counting, warm, persistent: bool) -> None:
    ds = counting(map=_slow)
    baseline = snapshot()
    loader = make_loader(ds, num_workers=2, persistent_workers=persistent)
    got: list[Any] = []
    with pytest.raises(RuntimeError) as caught:
        for i, batch in enumerate(loader):
            got.append([int(x) for x in batch])  # not the tensor: it holds shared memory
            if i == 2:
                victim = min(_children() - baseline["children"])
                os.kill(victim, signal.SIGKILL)
    batch = None  # the last batch's tensor holds shared memory
    # Usually a WorkerError from the loader; torch's SIGCHLD handler may also raise its own
    # RuntimeError at any point of the loop body. Either way: which worker, and that it died.
    message = str(caught.value)
    assert str(victim) in message and ("killed" in message or "exited unexpectedly" in message), message
    if isinstance(caught.value, WorkerError):
        assert "SIGKILL" in message and "load_state_dict" in message and "epoch 0" in message
    assert_back_to(baseline)  # the other worker was stopped too

    loader.load_state_dict(loader.state_dict())  # go on after the batches the loop received
    rest = [[int(x) for x in b] for b in loader]
    assert len(got) + len(rest) == len(ds)
    assert _values(got + rest) == list(range(60))  # nothing lost, nothing twice
    loader.close()
    assert_back_to(baseline)


def _hangs_once_on(sample: dict[str, Any], *, value: int, flag: Path) -> int:
    """``map=``: the worker that makes sample ``value`` hangs (until killed) the first time."""
    cls = int(sample["cls"])
    if cls == value and not flag.exists():
        flag.write_text(str(os.getpid()))
        while True:
            time.sleep(1)
    return cls


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "per_epoch"])
def test_a_hung_worker_under_timeout_is_a_worker_error_then_resumes_exactly(
    counting, warm, tmp_path: Path, persistent: bool
) -> None:
    """``make_loader(timeout=)``: a worker that never returns (a map= that hangs) is stopped, the
    loop gets a WorkerError saying so and how to go on, and the resumed epoch has every sample once."""
    import functools

    flag = tmp_path / "hung"
    ds = counting(map=functools.partial(_hangs_once_on, value=49, flag=flag))  # in batch 7 of 15, mid-epoch
    baseline = snapshot()
    # 5 s: ~10x what the first batch takes on a busy 2-core machine (workers start), so only the hang reaches it
    loader = make_loader(ds, num_workers=2, persistent_workers=persistent, timeout=5)
    got: list[list[int]] = []
    with pytest.raises(
        WorkerError,
        match=r"no batch in 5 s \(timeout=\): one may hang.*epoch 0 after \d+ batches.*"
        r"load_state_dict",
    ) as caught:
        for batch in loader:
            got.append([int(x) for x in batch])
    assert flag.exists() and f"after {len(got)} batches" in str(caught.value)
    del caught
    assert_back_to(baseline, within=20)  # the hung worker was stopped too
    loader.load_state_dict(loader.state_dict())
    rest = [[int(x) for x in b] for b in loader]
    assert len(got) + len(rest) == len(ds)
    assert _values(got + rest) == list(range(60))
    loader.close()
    with pytest.raises(ValueError, match="timeout"):
        make_loader(ds, timeout=1)  # no workers: nothing to wait for


def test_worker_killed_while_the_loop_runs_its_own_code_then_resumes_with_the_defaults(counting, warm) -> None:
    """Persistent workers (the default), and the worker dies while the loop body runs: torch's
    SIGCHLD handler raises in the loop, outside the loader. The documented recovery must
    still work: the dead worker set is replaced, and the resume is exact."""
    ds = counting(map=_slow)
    baseline = snapshot()
    loader = make_loader(ds, num_workers=2)
    got: list[Any] = []
    with pytest.raises(RuntimeError) as caught:
        for i, batch in enumerate(loader):
            got.append([int(x) for x in batch])
            if i == 2:
                victim = min(_children() - baseline["children"])
                os.kill(victim, signal.SIGKILL)
                for _ in range(200):  # the loop's own work, until torch's handler interrupts it
                    time.sleep(0.05)
    batch = None
    assert str(victim) in str(caught.value), caught.value
    loader.load_state_dict(loader.state_dict())
    rest = [[int(x) for x in b] for b in loader]
    assert len(got) + len(rest) == len(ds)
    assert _values(got + rest) == list(range(60))  # nothing lost, nothing twice
    assert len(_children() - baseline["children"]) == 2  # the new workers persist as usual
    ds.set_epoch(1)
    assert _values(list(loader)) == list(range(60))
    loader.close()
    assert_back_to(baseline)


# -- an exception in a user transform -------------------------------------------------------------


class NeedsTwoArguments(Exception):
    """An exception torch could not rebuild from a message alone."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what} (code {code})")


def _raise_on_7(sample: dict[str, Any]) -> int:
    if int(sample["cls"]) == 7:
        raise NeedsTwoArguments("label seven is cursed", 42)
    return int(sample["cls"])


def _divide(image: Any) -> Any:
    return 1 / 0


@pytest.mark.parametrize("workers", [0, 2])
def test_transform_error_reaches_the_trainer_with_shard_key_and_cause(image_dataset, workers: int) -> None:
    ds = ShardedDataset(image_dataset, batch_size=4, transform=_divide)
    with make_loader(ds, num_workers=workers) as loader, pytest.raises(SampleError) as caught:
        list(loader)
    message = str(caught.value)
    assert "train-00000" in message and "key 'img000" in message, message
    assert "ZeroDivisionError: division by zero" in message and "field 'jpg'" in message, message
    if workers == 0:
        assert isinstance(caught.value.__cause__, ZeroDivisionError)
        assert caught.value.shard.endswith("train-000000.tar") and caught.value.key == "img00000"


@pytest.mark.parametrize("workers", [0, 2])
def test_map_error_of_any_type_reaches_the_trainer(counting, workers: int) -> None:
    ds = counting(map=_raise_on_7)
    with make_loader(ds, num_workers=workers) as loader, pytest.raises(SampleError) as caught:
        list(loader)
    message = str(caught.value)
    assert "train-000000.tar" in message and "key 's000_00007'" in message, message
    assert "NeedsTwoArguments: label seven is cursed (code 42)" in message, message


def test_transform_errors_are_skipped_and_counted_under_the_skip_policy(counting) -> None:
    ds = counting(map=_raise_on_7, decoding=DecodeOptions(on_error="skip"))
    with make_loader(ds, num_workers=2) as loader:
        batches = list(loader)
    assert len(batches) == len(ds) and 7 not in _values(batches)
    report = ds.last_epoch_report
    assert report.bad == 1 and report.entries[0][1] == "s000_00007"
    assert "NeedsTwoArguments: label seven is cursed" in report.entries[0][2]


# -- nothing left behind ----------------------------------------------------------------------------


def _leave_early(loader: Any, n: int = 2) -> None:
    for i, _ in enumerate(loader):
        if i == n:
            break


def test_break_then_close_stops_persistent_workers(counting, warm) -> None:
    ds = counting()
    baseline = snapshot()
    loader = make_loader(ds, num_workers=2, persistent_workers=True)
    _leave_early(loader)
    assert _children() - baseline["children"], "persistent workers stay up between iterations"
    loader.close()
    assert_back_to(baseline)


def test_break_then_del_stops_persistent_workers(counting, warm) -> None:
    ds = counting()
    baseline = snapshot()
    loader = make_loader(ds, num_workers=2, persistent_workers=True)
    _leave_early(loader)
    del loader
    assert_back_to(baseline)


def test_break_stops_per_epoch_workers_at_once(counting, warm) -> None:
    ds = counting()
    baseline = snapshot()
    loader = make_loader(ds, num_workers=2, persistent_workers=False)
    _leave_early(loader)
    assert_back_to(baseline)
    assert _values(list(loader)) == list(range(60))  # and the loader still works


def test_with_block_stops_workers(counting, warm) -> None:
    ds = counting()
    baseline = snapshot()
    with make_loader(ds, num_workers=2) as loader:
        _leave_early(loader)
    assert_back_to(baseline)


def test_break_in_process_closes_the_shard_file(counting, warm) -> None:
    ds = counting()
    baseline = snapshot()
    loader = make_loader(ds, num_workers=0)
    _leave_early(loader)
    assert_back_to(baseline)


def test_error_mid_epoch_stops_persistent_workers_even_if_the_error_is_kept(counting, warm) -> None:
    ds = counting(map=_raise_on_7)
    baseline = snapshot()
    loader = make_loader(ds, num_workers=2, persistent_workers=True)
    with pytest.raises(SampleError) as kept:  # a notebook or a logger may hold on to the error
        list(loader)
    assert_back_to(baseline)
    assert "s000_00007" in str(kept.value)


def test_repeated_early_exits_do_not_accumulate(counting, warm) -> None:
    ds = counting()
    baseline = snapshot()
    loader = make_loader(ds, num_workers=2, persistent_workers=True)
    for epoch in range(4):
        ds.set_epoch(epoch)
        _leave_early(loader, n=epoch)
        assert len(_children() - baseline["children"]) == 2
    loader.close()
    assert_back_to(baseline)


# -- many epochs ---------------------------------------------------------------------------------


def test_soak_memory_and_fds_flat_over_epochs() -> None:
    """A short run of tools/soak.py (run it by hand for 10 epochs): flat after the first epoch."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "soak.py"), "--epochs", "4", "--images", "400", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode in (0, 1), proc.stderr
    result = json.loads(proc.stdout)
    epochs = result["epochs"]
    assert len(epochs) == 4 and all(e["samples"] == 400 for e in epochs)
    assert all(len(e["worker_rss_mib"]) == 2 for e in epochs)
    assert len({(e["main_fds"], tuple(e["worker_fds"])) for e in epochs}) == 1, epochs
    assert result["problems"] == [], result["problems"]
    assert proc.returncode == 0
