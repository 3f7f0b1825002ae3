"""Worker processes for ``convert_items`` with limits per item: a time limit and a memory ceiling.

:class:`SupervisedExecutor`, the supervised implementation of
:class:`~shardify.convert.executor.Executor`, used when ``item_timeout`` or
``max_worker_memory`` is set (Linux: fork and ``/proc``). Each worker is forked and runs whole
chunks, as in the local pool of :func:`~shardify.convert.pyapi.itemmap.map_ordered`, and notes
in shared memory which item it is on and since when. The calling process watches every
:data:`POLL_S`: a worker on one item for longer than ``item_timeout``, or whose resident memory
grew by more than ``max_worker_memory`` since it started, is killed with SIGKILL and replaced by
a new one, and its chunk runs again there with that item reported instead of run (``"timed out
after 5 s"``, ``"worker exceeded 200 MiB"``).

Memory is judged only in a fresh worker, so that the verdict does not depend on what a worker
ran before (which depends on the number of workers): a worker over the ceiling that had run
other chunks is replaced and the chunk runs again from its start in the new worker; an item
is reported only when that worker, having run just the items before it in the chunk, goes
over. The items before the stopped one run again (``fn`` must be a function of its item), so
the output is the same for any number of workers. The ceiling is checked every
:data:`POLL_S`, so a worker may overshoot it by what it allocates in that time.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from shardify.convert.pyapi.itemchunks import ChunkOut, ChunkRunner, ChunkSlots, ItemChunk, Outcome, died, pack
from shardify.errors import WorkerError

__all__ = ["Limits", "SupervisedExecutor", "POLL_S"]

POLL_S = 0.02
"""Seconds between two looks at the workers' time on their item and memory."""

DEPTH = 2
"""Chunks handed to a worker at once, so that it never waits for the next while the caller writes."""

_PAGE = os.sysconf("SC_PAGE_SIZE")
_W = 4
"""Progress cells per worker: item position, its start (``time.monotonic``, 0: between chunks),
resident bytes at the worker's start (-1: not yet), the chunk's sequence number."""


@dataclass(frozen=True)
class Limits:
    """``item_timeout`` seconds per item; ``max_memory`` bytes a worker may add to what it had
    when it started (resident set). None: no limit."""

    item_timeout: float | None = None
    max_memory: int | None = None

    def timed_out(self) -> str:
        return f"timed out after {self.item_timeout:g} s"

    def over_memory(self) -> str:
        ceiling = self.max_memory or 0
        mib = ceiling / (1 << 20)
        return f"worker exceeded {mib:.0f} MiB" if mib >= 1 else f"worker exceeded {ceiling} bytes"


def _rss(pid: int) -> int:
    """Resident bytes of process ``pid`` (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _serve(conn: Any, runner: ChunkRunner, slots: ChunkSlots, progress: Any, w: int) -> None:
    """A worker: run chunks sent on ``conn`` until it closes; note the item and its start time."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the calling process stops the workers
    progress[_W * w + 2] = _rss(os.getpid())
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:  # the caller is done
            return
        seq, chunk, skip, slot = msg
        outcomes: list[Outcome] = []
        parts: list[bytes] = []
        for j, (index, item) in enumerate(zip(chunk.indexes, chunk.items)):
            if j in skip:
                outcomes.append(Outcome(stopped=skip[j]))
                continue
            progress[_W * w + 3] = seq
            progress[_W * w] = j
            progress[_W * w + 1] = time.monotonic()
            outcomes.append(runner.one(index, item, parts))
        progress[_W * w + 1] = 0.0
        conn.send(pack(slots, slot, outcomes, parts))


@dataclass
class _Task:
    seq: int
    chunk: ItemChunk
    slot: int
    skip: dict[int, str] = field(default_factory=dict)
    """Positions in the chunk reported instead of run, with the reason."""
    fresh: bool = False
    """Run only in a worker that has run nothing else (memory is judged there)."""


@dataclass
class _Worker:
    proc: Any
    conn: Any
    tasks: deque[_Task] = field(default_factory=deque)
    """Handed to it and not yet returned, in order: the first is the one it runs."""
    first: int | None = None
    """Sequence number of the first chunk it was given (it ran nothing before that one)."""


class _Pool:
    """``workers`` forked workers sharing ``slots`` and a progress table; replaced when killed."""

    def __init__(self, runner: ChunkRunner, workers: int, slots: ChunkSlots, limits: Limits) -> None:
        self.ctx = mp.get_context("fork")
        self.runner, self.slots, self.limits = runner, slots, limits
        self.progress = self.ctx.RawArray("d", _W * workers)
        self.workers: list[_Worker] = []
        for w in range(workers):
            self.workers.append(self._start(w))

    def _start(self, w: int) -> _Worker:
        self.progress[_W * w : _W * w + _W] = [0.0, 0.0, -1.0, -1.0]
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_serve, args=(child, self.runner, self.slots, self.progress, w), daemon=True)
        proc.start()
        child.close()
        return _Worker(proc, parent)

    def replace(self, w: int) -> _Worker:
        """Kill worker ``w`` (SIGKILL) and start a new one in its place."""
        old = self.workers[w]
        old.proc.kill()
        old.proc.join()
        old.conn.close()
        self.workers[w] = self._start(w)
        return self.workers[w]

    def verdict(self, w: int, now: float) -> tuple[str | None, bool] | None:
        """None while worker ``w`` keeps to the limits; else ``(reason or None, memory)``: stop it,
        reporting its item for ``reason`` (None: rerun in a fresh worker, no verdict)."""
        wk, p, limits = self.workers[w], self.progress, self.limits
        started = p[_W * w + 1]
        if limits.item_timeout is not None and started > 0 and now - started > limits.item_timeout:
            return limits.timed_out(), False
        base = p[_W * w + 2]
        if limits.max_memory is not None and base >= 0 and _rss(wk.proc.pid) - base > limits.max_memory:
            fresh = started > 0 and wk.first is not None and int(p[_W * w + 3]) == wk.first
            return (limits.over_memory() if fresh else None), True
        return None

    def close(self) -> None:
        for wk in self.workers:  # a worker waiting for a chunk ends; a busy one (the run failed) is killed
            try:
                if not wk.tasks:
                    wk.conn.send(None)
                else:
                    wk.proc.kill()
            except OSError:
                pass
            wk.conn.close()
        deadline = time.monotonic() + 2
        for wk in self.workers:
            wk.proc.join(max(0.0, deadline - time.monotonic()))
            if wk.proc.is_alive():
                wk.proc.kill()
                wk.proc.join()


class SupervisedExecutor:
    """``workers`` supervised worker processes under ``limits``: ``map(runner, chunks)`` yields
    ``(chunk, outcomes)`` in order, at most ``2 * workers`` chunks ahead; an item past a limit
    is an outcome (``stopped``), a worker that died on its own a WorkerError naming its items."""

    def __init__(self, *, workers: int, limits: Limits) -> None:
        self.workers, self.limits = max(1, workers), limits

    def map(
        self, fn: ChunkRunner, items: Iterable[ItemChunk], *, args: tuple[Any, ...] = ()
    ) -> Iterator[tuple[ItemChunk, ChunkOut]]:
        """``(chunk, fn(chunk))`` for each chunk, in order (``args``: none; the runner is whole)."""
        if args:
            raise TypeError(f"SupervisedExecutor.map takes no args (the runner holds its own), found {len(args)}")
        return _map_supervised(fn, items, workers=self.workers, limits=self.limits)

    def close(self) -> None:
        """Nothing to do: each map stops its workers when it ends or is left."""

    def __enter__(self) -> SupervisedExecutor:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def _map_supervised(
    runner: ChunkRunner, chunks: Iterable[ItemChunk], *, workers: int, limits: Limits
) -> Iterator[tuple[ItemChunk, ChunkOut]]:
    """Yield ``(chunk, outcomes)`` in the order of ``chunks``, ``workers`` at a time, under ``limits``."""
    window = 2 * workers
    slots = ChunkSlots(window)
    pool = _Pool(runner, workers, slots, limits)
    source = iter(chunks)
    queue: deque[_Task] = deque()
    tasks: dict[int, _Task] = {}
    results: dict[int, ChunkOut] = {}
    taken = submitted = 0
    exhausted = False
    watched = 0.0
    try:
        while True:
            while not exhausted and submitted - taken < window:
                chunk = next(source, None)
                if chunk is None:
                    exhausted = True
                    break
                task = _Task(submitted, chunk, slots.free.pop())
                tasks[submitted] = task
                queue.append(task)
                submitted += 1
            _assign(pool, queue)  # before yielding: the workers run while the caller writes
            if taken in results:
                task = tasks.pop(taken)
                yield task.chunk, results.pop(taken)
                slots.free.append(task.slot)
                taken += 1
                continue
            if exhausted and taken == submitted:
                return
            _collect(pool, results, slots)
            if time.monotonic() - watched >= POLL_S:  # not per result: /proc reads cost the writer's CPU
                _watch(pool, queue)
                watched = time.monotonic()
    finally:
        pool.close()


def _assign(pool: _Pool, queue: deque[_Task]) -> None:
    """Hand queued tasks to workers, up to :data:`DEPTH` each; a task that needs a fresh worker
    is the first one of a new worker."""
    for w in range(len(pool.workers)):
        wk = pool.workers[w]
        while queue and len(wk.tasks) < DEPTH:
            task = queue[0]
            if task.fresh and wk.first is not None:
                if wk.tasks:
                    break  # the next idle worker, or this one once idle, is replaced for it
                wk = pool.replace(w)
            queue.popleft()
            if wk.first is None:
                wk.first = task.seq
            wk.tasks.append(task)
            wk.conn.send((task.seq, task.chunk, task.skip, task.slot))


def _collect(pool: _Pool, results: dict[int, ChunkOut], slots: ChunkSlots) -> None:
    """Wait up to :data:`POLL_S` for finished chunks; a worker that died on its own is an error."""
    busy = [wk for wk in pool.workers if wk.tasks]
    if not busy:
        return
    ready = set(
        multiprocessing.connection.wait([wk.conn for wk in busy] + [wk.proc.sentinel for wk in busy], timeout=POLL_S)
    )
    for wk in busy:
        if wk.conn in ready:
            while wk.tasks and wk.conn.poll():
                task = wk.tasks[0]
                try:
                    got = wk.conn.recv()
                except (EOFError, OSError) as e:
                    raise died([task.chunk], e) from e
                wk.tasks.popleft()
                results[task.seq] = (
                    got if isinstance(got, ChunkOut) else ChunkOut(got[0], slots.view(task.slot, got[1]))
                )
        elif wk.proc.sentinel in ready:
            wk.proc.join()
            cause = WorkerError(f"exit code {wk.proc.exitcode}")
            raise died([wk.tasks[0].chunk], cause) from cause


def _watch(pool: _Pool, queue: deque[_Task]) -> None:
    """Stop workers past a limit: report their item, or rerun their chunks in a fresh worker."""
    now = time.monotonic()
    for w, wk in enumerate(pool.workers):
        if not wk.tasks:
            if pool.limits.max_memory is not None and wk.first is not None and pool.verdict(w, now) is not None:
                pool.replace(w)  # grown over the ceiling between chunks: no item to blame
            continue
        found = pool.verdict(w, now)
        if found is None:
            continue
        reason, memory = found
        position, seq = int(pool.progress[_W * w]), int(pool.progress[_W * w + 3])
        tasks = list(wk.tasks)
        pool.replace(w)
        for task in reversed(tasks):  # back to the front of the queue, in their order
            if task.seq == seq:
                if reason is not None:
                    task.skip[position] = reason
                task.fresh = task.fresh or memory
            queue.appendleft(task)
