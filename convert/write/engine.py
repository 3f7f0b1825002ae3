"""Run shard-writing tasks: in this process, or on a pool of worker processes.

The engine only executes; what to write was decided by the plan. At most two tasks per
worker are in flight, so tasks made lazily keep memory bounded. Results arrive in any
order (the caller sorts them), progress is counted in shared memory and shown by
:func:`shardify.progress.progress_bar` (stderr, when a terminal), and the first failure cancels the rest and is
raised in the caller.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from shardify.convert.write.writer import ShardResult, ShardTask, write_shard
from shardify.progress import progress_bar

__all__ = ["run_local", "ProgressBar"]

_shared: Any = None


class ProgressBar:
    """A tqdm bar of samples (with MB/s) that can be fed from many processes."""

    def __init__(self, *, total: int | None, desc: str, enabled: bool, done: int = 0, done_bytes: int = 0) -> None:
        self.start = time.monotonic()
        self.base_bytes = done_bytes
        self.bar: Any = None
        # shardify's one bar: shown only on a terminal's stderr
        self.bar = progress_bar(total=total, initial=done, desc=desc, unit=" samples", enabled=enabled)
        self.samples = done
        self.nbytes = done_bytes

    def set(self, samples: int, nbytes: int) -> None:
        if self.bar is None:
            self.samples, self.nbytes = samples, nbytes
            return
        if samples != self.samples:
            self.bar.update(samples - self.samples)
            self.samples = samples
        self.nbytes = nbytes
        elapsed = max(time.monotonic() - self.start, 1e-6)
        self.bar.set_postfix_str(f"{(nbytes - self.base_bytes) / elapsed / 1e6:.1f} MB/s", refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _init_worker(counters: Any) -> None:
    global _shared
    _shared = counters


def _report(samples: int, nbytes: int) -> None:
    with _shared.get_lock():
        _shared[0] += samples
        _shared[1] += nbytes


def _run_task(task: ShardTask) -> ShardResult:
    return write_shard(task, _report)


def run_local(
    tasks: Sequence[ShardTask],
    *,
    workers: int,
    bar: ProgressBar,
    on_result: Callable[[ShardResult], None],
) -> None:
    """Write every task, calling ``on_result`` in this process as each shard finishes."""
    if not tasks:
        return
    if workers <= 1 or len(tasks) == 1:
        done = [bar.samples, bar.nbytes]

        def progress(samples: int, nbytes: int) -> None:
            done[0] += samples
            done[1] += nbytes
            bar.set(done[0], done[1])

        for task in tasks:
            on_result(write_shard(task, progress))
        return
    ctx = mp.get_context("fork" if sys.platform == "linux" else "spawn")
    counters = ctx.Array("q", [bar.samples, bar.nbytes])
    workers = min(workers, len(tasks))
    queued = iter(tasks)  # tasks are made (and their samples held) only when submitted
    with cf.ProcessPoolExecutor(
        max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=(counters,)
    ) as pool:
        pending: set[cf.Future[ShardResult]] = set()
        try:
            while True:
                while len(pending) < 2 * workers and (submitted := next(queued, None)) is not None:
                    pending.add(pool.submit(_run_task, submitted))
                if not pending:
                    break
                finished, pending = cf.wait(pending, timeout=0.2, return_when=cf.FIRST_COMPLETED)
                bar.set(counters[0], counters[1])
                for fut in finished:
                    on_result(fut.result())
        except BaseException:
            for fut in pending:
                fut.cancel()
            raise
        bar.set(counters[0], counters[1])
