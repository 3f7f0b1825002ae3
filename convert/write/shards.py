"""Write the planned shards through one of the converter's executors: worker processes on this
machine, or Ray tasks (:mod:`shardify.convert.executor`).

Only executes; what to write was decided by the plan. Each task's samples are read
(:mod:`~shardify.convert.write.readsample`) and written by the one shard writer
(:class:`~shardify.convert.write.shardstream.ShardStream`), into one shard. Tasks are made lazily and at most a
window of them is in flight (two per local worker; :data:`MAX_IN_FLIGHT` on Ray), so memory
stays bounded. Results come back in task order and ``on_result`` records each in the driver.
Progress is counted where the shards are written (shared memory; a counter actor on Ray) and
shown by :class:`~shardify.convert.write.progressbar.ProgressBar`. The first failure cancels
the rest and is raised in the caller, with the task's own message.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Sequence
from typing import Any

from PIL import Image

from shardify.convert.executor import LocalExecutor, default_method, executor_kind
from shardify.convert.executor_ray import RayExecutor
from shardify.convert.inputs.inputs import Ignored
from shardify.convert.write.outfs import open_output
from shardify.convert.write.progressbar import ProgressBar
from shardify.convert.write.readsample import sample_members
from shardify.convert.write.shardstream import ShardStream
from shardify.convert.write.shardtypes import Progress, ShardResult, ShardTask
from shardify.errors import InputError

__all__ = ["write_shards", "write_shard", "MAX_IN_FLIGHT"]

MAX_IN_FLIGHT = 256
"""Ray tasks submitted and not finished at once: enough to fill a cluster, while the driver
holds only these tasks' samples."""
_REPORT_SAMPLES = 32
"""Samples a Ray task gathers before it tells the counter actor."""
_REPORT_EVERY = 16
"""Samples between two progress reports of a shard being written (each takes a lock shared by the workers)."""


def write_shards(
    tasks: Sequence[ShardTask],
    *,
    engine: str,
    workers: int,
    address: str | None,
    bar: ProgressBar,
    on_result: Callable[[ShardResult], None],
) -> None:
    """Write every task (``engine``: ``local`` or ``ray``), calling ``on_result`` as each shard is taken back."""
    if not tasks:
        return
    workers = min(workers, len(tasks))
    kind = executor_kind(engine=engine, workers=workers)
    if kind == "ray":
        _on_ray(tasks, address=address, bar=bar, on_result=on_result)
    elif kind == "this-process":
        done = [bar.samples, bar.nbytes]

        def progress(samples: int, nbytes: int) -> None:
            done[0] += samples
            done[1] += nbytes
            bar.set(done[0], done[1])

        for _, result in LocalExecutor(workers=1).map(lambda task: write_shard(task, progress), tasks):
            on_result(result)
    else:  # "processes" (shards have no per-item limits, so never "supervised")
        counters = mp.get_context(default_method()).Array("q", [bar.samples, bar.nbytes])
        executor = LocalExecutor(workers=workers, what="writing shards", tick=lambda: bar.set(counters[0], counters[1]))
        with executor:
            for _, result in executor.map(_write_counted, tasks, args=(counters,)):
                on_result(result)


def write_shard(task: ShardTask, progress: Progress | None = None) -> ShardResult:
    """Write ``task.plan`` to ``{split}-{version}-{index:06d}.tar`` in ``task.out_dir``; return its entry.

    Pillow's pixel limit is the task's while it runs, and restored after: a conversion in a
    training process must not change the limit its reader applies."""
    saved = Image.MAX_IMAGE_PIXELS
    if task.max_pixels is not None:
        Image.MAX_IMAGE_PIXELS = task.max_pixels
    try:
        return _write_shard(task, progress)
    finally:
        Image.MAX_IMAGE_PIXELS = saved


def _write_shard(task: ShardTask, progress: Progress | None) -> ShardResult:
    plan = task.plan
    stream = ShardStream(
        open_output(task.out_dir, storage_options=task.storage_options),
        task.split,
        shard_size=None,
        samples_per_shard=None,
        fsync=task.fsync,
        first=plan.index,
        version=task.version,
        chunk=task.chunk,
    )
    try:
        stream.open_shard()  # written even if every input is skipped: the plan lists it
        reported = (0, 0)  # samples and bytes told to ``progress``, every _REPORT_EVERY samples
        for n, sample in enumerate(plan.samples, 1):
            try:
                members = sample_members(sample.spec, sample.key, sample.meta, task, stream.notes)
            except InputError as e:
                if task.strict:
                    raise
                stream.skip(Ignored(e.path or sample.spec.identity, e.reason))
            else:
                stream.add(sample.key, members)
            if progress is not None and n % _REPORT_EVERY == 0:
                progress(n - reported[0], stream.written - reported[1])
                reported = (n, stream.written)
        if progress is not None and len(plan) > reported[0]:
            progress(len(plan) - reported[0], stream.written - reported[1])
        result = stream.close_shard()
    except BaseException:
        stream.abort()
        raise
    if result is None:  # pragma: no cover - opened above, so closing writes it
        raise RuntimeError(f"shard {plan.index} of {task.split} was not written")
    return result


def _write_counted(counters: Any, task: ShardTask) -> ShardResult:
    """In a worker: write the shard, adding its samples and bytes to the shared counters."""

    def report(samples: int, nbytes: int) -> None:
        with counters.get_lock():
            counters[0] += samples
            counters[1] += nbytes

    return write_shard(task, report)


class _Counter:
    """A Ray actor the tasks report their samples and bytes to."""

    def __init__(self) -> None:
        self.samples = 0
        self.nbytes = 0

    def add(self, samples: int, nbytes: int) -> None:
        self.samples += samples
        self.nbytes += nbytes

    def get(self) -> tuple[int, int]:
        return self.samples, self.nbytes


def _write_reported(counter: Any, task: ShardTask) -> ShardResult:
    """A Ray task: write the shard, telling ``counter`` every :data:`_REPORT_SAMPLES` samples."""
    pending = [0, 0]

    def progress(samples: int, nbytes: int) -> None:
        pending[0] += samples
        pending[1] += nbytes
        if pending[0] >= _REPORT_SAMPLES:
            counter.add.remote(*pending)
            pending[0] = pending[1] = 0

    result = write_shard(task, progress)
    counter.add.remote(*pending)
    return result


def _task_error(task: ShardTask, error: BaseException) -> None:
    """A failed Ray task is raised as its own error, with its own message."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, Exception):
        raise cause from None


def _on_ray(
    tasks: Sequence[ShardTask], *, address: str | None, bar: ProgressBar, on_result: Callable[[ShardResult], None]
) -> None:
    base_samples, base_bytes = bar.samples, bar.nbytes
    with RayExecutor(address=address, window=MAX_IN_FLIGHT, on_error=_task_error) as executor:
        counter = executor.ray.remote(num_cpus=0)(_Counter).remote()

        def tick() -> None:
            samples, nbytes = executor.ray.get(counter.get.remote())
            bar.set(base_samples + samples, base_bytes + nbytes)

        executor.tick = tick
        for _, result in executor.map(_write_reported, tasks, args=(counter,)):
            on_result(result)
