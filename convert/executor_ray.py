"""The Ray implementation of :class:`~shardify.convert.executor.Executor`: each item is a Ray
task, on a cluster or on a local Ray started for the run (and shut down after it).

A task that died (node lost, worker killed) is retried by Ray (:data:`MAX_RETRIES`); an
error of ``fn`` itself, or retries exhausted, is raised in the driver through ``on_error``
(by default the Ray error as is). Ray is imported only when an executor is entered.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any, TypeVar

from shardify.convert.executor import TICK_S, Ahead

__all__ = ["RayExecutor", "ray_session", "MAX_RETRIES"]

T = TypeVar("T")
R = TypeVar("R")

MAX_RETRIES = 3
"""Ray retries a task that died (node lost, worker killed) this many times."""


def _ray() -> Any:
    try:
        import ray  # deferred: Ray is an optional dependency, heavy to import
    except ImportError as e:
        raise ImportError("--engine ray needs Ray: pip install 'shardify[ray]'") from e
    return ray


@contextlib.contextmanager
def ray_session(address: str | None) -> Iterator[Any]:
    """The ``ray`` module, joined to ``address`` (None: a local Ray started for this run and
    shut down after it); a Ray the caller had already initialised is used and left running."""
    ray = _ray()
    started_here = False
    if not ray.is_initialized():
        ray.init(
            address=address,
            include_dashboard=False,
            log_to_driver=False,
            ignore_reinit_error=True,
            configure_logging=False,
        )
        started_here = True
    try:
        yield ray
    finally:
        if started_here:
            ray.shutdown()


class RayExecutor:
    """Ray tasks, ``window`` in flight (default: twice the larger of ``workers`` and the
    cluster's CPUs). ``tick``: called every :data:`TICK_S` while waiting for a result, and
    after each. ``on_error(item, error)``: raise what a failed task is to the caller.
    Use it in a ``with`` block (it joins or starts Ray); :attr:`ray` is the module there."""

    def __init__(
        self,
        *,
        address: str | None,
        workers: int = 0,
        window: int | None = None,
        tick: Callable[[], None] | None = None,
        on_error: Callable[[Any, BaseException], None] | None = None,
    ) -> None:
        self.address, self.workers, self.window = address, workers, window
        self.tick, self.on_error = tick, on_error
        self.ray: Any = None
        self._session: contextlib.ExitStack | None = None

    def __enter__(self) -> RayExecutor:
        stack = contextlib.ExitStack()
        self.ray = stack.enter_context(ray_session(self.address))
        self._session = stack
        if self.window is None:
            self.window = 2 * max(self.workers, int(self.ray.cluster_resources().get("CPU", 1)))
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Leave Ray (shut down when it was started here)."""
        session, self._session = self._session, None
        if session is not None:
            session.close()

    def put(self, value: Any) -> Any:
        """``value`` in Ray's object store once, for every task to take as an argument."""
        return self.ray.put(value)

    def map(self, fn: Callable[..., R], items: Iterable[T], *, args: tuple[Any, ...] = ()) -> Iterator[tuple[T, R]]:
        """``(item, fn(*args, item))`` for each item, in order, each call a Ray task."""
        ray = self.ray
        if ray is None:
            raise RuntimeError("RayExecutor.map outside its with block")
        remote = ray.remote(max_retries=MAX_RETRIES, retry_exceptions=False)(fn)
        ahead: Ahead[T, Any] = Ahead(items, self.window or 1, lambda item: remote.remote(*args, item))
        try:
            for item, ref in ahead:
                yield item, self._get(item, ref)
        finally:
            for _, ref in ahead.pending:
                ray.cancel(ref, force=True)

    def _get(self, item: Any, ref: Any) -> Any:
        ray = self.ray
        if self.tick is not None:
            while not ray.wait([ref], num_returns=1, timeout=TICK_S)[0]:
                self.tick()
            self.tick()
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as e:
            if self.on_error is not None:
                self.on_error(item, e)
            raise
