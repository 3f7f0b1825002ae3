"""One bounded, in-order executor for every parallel map of the converter.

``executor.map(fn, items, args=...)`` yields ``(item, fn(*args, item))`` in the order of
``items``, with at most ``window`` items handed out and not yet taken back (the one being
taken back included), so that items made lazily (a shard's samples, a chunk of user items)
keep memory bounded. ``close()`` (or leaving ``with``) stops the workers; work not yet
taken back is cancelled. A worker that dies (killed, out of memory) raises what ``died``
makes of the items it may have held (a :class:`~shardify.errors.WorkerError` naming the
stage, by default), never a hang; an exception of ``fn`` itself is raised in the caller.

Which one runs a map is :func:`executor_kind`, for every caller. Implementations:
:class:`LocalExecutor` (worker processes on this machine, or this process
for ``workers <= 1``), :class:`~shardify.convert.pyapi.supervise.SupervisedExecutor` (worker
processes that stop an item past its time or memory limit) and
:class:`~shardify.convert.executor_ray.RayExecutor` (Ray tasks, on a cluster or a local Ray).
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import multiprocessing as mp
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any, Generic, Literal, Protocol, TypeVar, runtime_checkable

from shardify.errors import WorkerError

__all__ = [
    "Executor",
    "ExecutorKind",
    "executor_kind",
    "LocalExecutor",
    "Ahead",
    "Died",
    "stage_died",
    "default_method",
    "TICK_S",
]

T = TypeVar("T")
R = TypeVar("R")
H = TypeVar("H")

TICK_S = 0.2
"""Seconds between two calls of an executor's ``tick`` (a progress bar) while it waits."""

Died = Callable[[list[Any], BaseException], BaseException]
"""What a dead worker is raised as, from the items it may have held and the cause."""


@runtime_checkable
class Executor(Protocol):
    """Run ``fn`` over items, a bounded number ahead, and give the results back in order."""

    def map(self, fn: Callable[..., Any], items: Iterable[Any], *, args: tuple[Any, ...] = ()) -> Iterator[Any]:
        """``(item, fn(*args, item))`` for each item, in order."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Executor: ...

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


ExecutorKind = Literal["ray", "supervised", "this-process", "processes"]
"""Where a map runs: Ray tasks, supervised worker processes, this process, or worker processes."""


def executor_kind(*, engine: str, workers: int, supervised: bool = False) -> ExecutorKind:
    """Which executor runs a map of ``workers`` at most (the caller passes no more than it has
    items): Ray for ``engine="ray"``; supervised worker processes when per-item limits are set
    (even for one worker, which is how a limit is enforced); this process for one worker; else
    worker processes on this machine."""
    if engine == "ray":
        return "ray"
    if supervised:
        return "supervised"
    if workers <= 1:
        return "this-process"
    return "processes"


def stage_died(what: str) -> Died:
    """The default ``died``: a WorkerError naming the stage (``what``)."""

    def died(items: list[Any], cause: BaseException) -> BaseException:
        return WorkerError(f"{what}: a worker process died (killed, or out of memory?): {cause}")

    return died


def default_method() -> str:
    """``fork`` on Linux (arguments reach the workers without pickling), else ``spawn``."""
    return "fork" if sys.platform == "linux" else "spawn"


class Ahead(Generic[T, H]):
    """Items handed to ``submit`` up to ``window`` ahead of the one being taken back (that one
    included), which iteration yields in order with its handle (a future, a Ray reference)."""

    def __init__(self, items: Iterable[T], window: int, submit: Callable[[T], H]) -> None:
        self._source = iter(items)
        self._window = window
        self._submit = submit
        self.pending: deque[tuple[T, H]] = deque()
        """Submitted and not yet taken back; the first is the one being taken back."""
        self._drawn: list[T] = []

    def __iter__(self) -> Iterator[tuple[T, H]]:
        while True:
            while len(self.pending) < self._window:
                self._drawn = list(itertools.islice(self._source, 1))
                if not self._drawn:
                    break
                self.pending.append((self._drawn[0], self._submit(self._drawn[0])))
                self._drawn = []
            if not self.pending:
                return
            yield self.pending[0]
            self.pending.popleft()

    def in_flight(self) -> list[T]:
        """The items a worker may have held: those pending, else the one being submitted."""
        return [c for c, _ in self.pending] if self.pending else list(self._drawn)


_shared: dict[int, tuple[Callable[..., Any], tuple[Any, ...]]] = {}
"""``fn`` and ``args`` of each open LocalExecutor's map, by key: set before its workers fork,
so they reach them without pickling (under ``spawn``, :func:`_install` sets them in the worker)."""
_keys = itertools.count()


def _install(key: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    _shared[key] = (fn, args)


def _call(key: int, item: Any) -> Any:
    fn, args = _shared[key]
    return fn(*args, item)


class LocalExecutor:
    """Worker processes on this machine (``workers`` of them, started with ``method``), or this
    process for ``workers <= 1``. ``window``: items ahead (default ``2 * workers``). ``tick``:
    called every :data:`TICK_S` while waiting for a result, and after each."""

    def __init__(
        self,
        *,
        workers: int,
        window: int | None = None,
        method: str | None = None,
        died: Died | None = None,
        what: str = "a parallel map",
        tick: Callable[[], None] | None = None,
    ) -> None:
        self.workers = workers
        self.window = window if window is not None else 2 * max(1, workers)
        self.method = method or default_method()
        self.died = died or stage_died(what)
        self.tick = tick
        self._pools: list[cf.ProcessPoolExecutor] = []

    def map(self, fn: Callable[..., R], items: Iterable[T], *, args: tuple[Any, ...] = ()) -> Iterator[tuple[T, R]]:
        """``(item, fn(*args, item))`` for each item, in order (see the module docstring)."""
        if self.workers <= 1:
            for item in items:
                yield item, fn(*args, item)
                if self.tick is not None:
                    self.tick()
            return
        key = next(_keys)
        fork = self.method == "fork"
        if fork:
            _install(key, fn, args)  # before the pool forks its workers
        if fork:
            pool = cf.ProcessPoolExecutor(max_workers=self.workers, mp_context=mp.get_context(self.method))
        else:  # spawn: fn and args are pickled once per worker, into its start
            pool = cf.ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=mp.get_context(self.method),
                initializer=_install,
                initargs=(key, fn, args),
            )
        self._pools.append(pool)
        ahead: Ahead[T, cf.Future[R]] = Ahead(items, self.window, lambda item: pool.submit(_call, key, item))
        try:
            for item, future in ahead:
                yield item, self._result(future)
        except cf.process.BrokenProcessPool as e:
            raise self.died(ahead.in_flight(), e) from e
        finally:
            for _, future in ahead.pending:
                future.cancel()
            _shared.pop(key, None)
            pool.shutdown(wait=True, cancel_futures=True)
            self._pools.remove(pool)

    def _result(self, future: cf.Future[R]) -> R:
        if self.tick is not None:
            while not cf.wait([future], timeout=TICK_S).done:
                self.tick()
            self.tick()
        return future.result()

    def close(self) -> None:
        """Stop every pool still open (a map left before its end)."""
        for pool in list(self._pools):
            pool.shutdown(wait=True, cancel_futures=True)
        self._pools.clear()

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
