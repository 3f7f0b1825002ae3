"""shardify.cli.procmem: the one /proc reader of ``shardify bench`` and the tools."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys

from shardify.cli.procmem import child_pids, memory_kib, process_memory


def test_this_process_has_rss_peak_pss_and_uss() -> None:
    kib = memory_kib()
    assert kib["VmHWM"] >= kib["VmRSS"] > 0
    assert 0 < kib["Uss"] <= kib["Pss"] <= kib["Rss"]
    assert "Private_Clean" not in kib and "Private_Dirty" not in kib


def test_a_process_that_is_gone_has_no_figures() -> None:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert memory_kib(int(proc.stdout)) == {}


def test_a_child_is_found_and_counted() -> None:
    ctx = multiprocessing.get_context("fork")
    started, stop = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_wait, args=(started, stop))
    child.start()
    try:
        assert started.wait(10)
        assert child.pid in child_pids()
        assert process_memory() > memory_kib()["Pss"] * 1024
    finally:
        stop.set()
        child.join(10)


def _wait(started, stop) -> None:  # type: ignore[no-untyped-def]
    started.set()
    stop.wait(10)
