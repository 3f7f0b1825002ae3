"""Background threads for fetches: a small pool of daemon threads, so that a fetch still running
when its reader is dropped (a trickling server, a request being aborted) never holds the
process at exit, and a pool that is shut down ends its threads once their task is done.

:class:`concurrent.futures.ThreadPoolExecutor` joins its threads at interpreter exit (and at a
worker process's end), waiting for every running task; these threads are not waited for.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["DaemonPool"]

T = TypeVar("T")
_Task = tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]


class DaemonPool:
    """Up to ``threads`` daemon threads named ``name-N``, started as tasks arrive."""

    def __init__(self, threads: int, name: str) -> None:
        self._max, self._name = threads, name
        self._tasks: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self._name}: submit after shutdown")
            self._tasks.put((future, fn, args))
            if self._idle:
                self._idle -= 1
            elif len(self._threads) < self._max:
                t = threading.Thread(target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True)
                self._threads.append(t)
                t.start()
        return future

    def _run(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            future, fn, args = task
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as e:  # noqa: BLE001 - raised again where the result is taken
                    future.set_exception(e)
            with self._lock:
                self._idle += 1

    def shutdown(self) -> None:
        """Cancel the tasks not started; each thread ends once its running task is done."""
        with self._lock:
            self._closed = True
            threads = len(self._threads)
        while True:  # cancel what is queued
            try:
                task = self._tasks.get_nowait()
            except queue.Empty:
                break
            if task is not None:
                task[0].cancel()
        for _ in range(threads):
            self._tasks.put(None)
