"""Run shard-writing tasks as Ray tasks, on a cluster or on a local Ray started for the run.

The plan is made once by the driver; each Ray task writes whole shards into the output
(a shared path or an fsspec URL every node can reach) and returns the shard's entry. The
driver records each finished shard and, at the end, writes the manifest. Progress comes
from a small counter actor the tasks report to; a failed task is retried by Ray
(``max_retries``), and an input error or exhausted retries is raised in the driver with
the task's own message.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from shardify.convert.write.engine import ProgressBar
from shardify.convert.write.writer import ShardResult, ShardTask, write_shard

__all__ = ["run_ray", "ray_session", "MAX_RETRIES", "MAX_IN_FLIGHT"]

MAX_RETRIES = 3
"""Ray retries a task that died (node lost, worker killed) this many times."""
MAX_IN_FLIGHT = 256
"""Tasks submitted and not finished at once: enough to fill a cluster, while the driver
holds only these tasks' samples."""


def _ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise ImportError("--engine ray needs Ray: pip install 'shardify[ray]'") from e
    return ray


def run_ray(
    tasks: Sequence[ShardTask],
    *,
    address: str | None,
    bar: ProgressBar,
    on_result: Callable[[ShardResult], None],
) -> None:
    """Write every task on Ray, calling ``on_result`` in the driver as each shard finishes."""
    if not tasks:
        return
    with ray_session(address) as ray:
        _run(ray, tasks, bar, on_result)


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


@functools.lru_cache(maxsize=1)
def _remote_parts(ray: Any) -> tuple[Any, Any]:
    @ray.remote(num_cpus=0)
    class Counter:
        def __init__(self) -> None:
            self.samples = 0
            self.nbytes = 0

        def add(self, samples: int, nbytes: int) -> None:
            self.samples += samples
            self.nbytes += nbytes

        def get(self) -> tuple[int, int]:
            return self.samples, self.nbytes

    @ray.remote(max_retries=MAX_RETRIES, retry_exceptions=False)
    def write(task: ShardTask, counter: Any) -> ShardResult:
        pending = [0, 0]

        def progress(samples: int, nbytes: int) -> None:
            pending[0] += samples
            pending[1] += nbytes
            if pending[0] >= 32:
                counter.add.remote(*pending)
                pending[0] = pending[1] = 0

        result = write_shard(task, progress)
        counter.add.remote(*pending)
        return result

    return Counter, write


def _run(ray: Any, tasks: Sequence[ShardTask], bar: ProgressBar, on_result: Callable[[ShardResult], None]) -> None:
    counter_cls, write = _remote_parts(ray)
    counter = counter_cls.remote()
    base_samples, base_bytes = bar.samples, bar.nbytes
    queued = iter(tasks)  # tasks are made (and their samples held) only when submitted
    pending: dict[Any, ShardTask] = {}
    try:
        while True:
            while len(pending) < MAX_IN_FLIGHT and (task := next(queued, None)) is not None:
                pending[write.remote(task, counter)] = task
            if not pending:
                break
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.2)
            samples, nbytes = ray.get(counter.get.remote())
            bar.set(base_samples + samples, base_bytes + nbytes)
            for ref in ready:
                pending.pop(ref)
                try:
                    on_result(ray.get(ref))
                except ray.exceptions.RayTaskError as e:
                    cause = getattr(e, "cause", None)
                    if isinstance(cause, Exception):
                        raise cause from None  # the task's own error, with its own message
                    raise
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
