"""``loader.stats()``: is data loading the bottleneck, which stage dominates, and what to try.

:func:`diagnose` turns an epoch's measurements (:mod:`shardify.reader.delivery.stats`) into a
:class:`LoaderStats`. The rule: the training loop is limited by its input when it spends at
least :data:`INPUT_BOUND` of its time (the wait for the first batch included) waiting for the next batch,
else by its own compute. The dominant stage is the one with the most seconds on the side that
the loop waits for: the device (copy, device decode) when waiting there is the larger part,
else the workers' stages. :class:`Measured` gives the same to a loop over any DataLoader of a
dataset (torchdata's ``StatefulDataLoader``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from shardify.reader.delivery.stats import EpochClock, LoaderMeter, WorkerTimes
from shardify.remote import is_remote

__all__ = [
    "INPUT_BOUND",
    "DEVICE_SHARE",
    "WORKER_STAGES",
    "STAGES",
    "LoaderStats",
    "LoaderContext",
    "diagnose",
    "loader_context",
    "Measured",
]

INPUT_BOUND = 0.2
"""The share of its time the loop waits for data from which it is reported input-bound: making
data loading free would then speed the loop up by a quarter or more."""
WORKER_STAGES = ("read", "decode", "augment", "collate", "transfer")
STAGES = WORKER_STAGES + ("pin", "copy", "device_decode")
"""``LoaderStats.stages``' keys: seconds summed over the worker processes (``read`` with remote
waits and the shuffle buffer; ``decode`` with the crop and resize the fast path does while
decoding; ``augment``: what follows, and ``map=``; ``collate``; ``transfer``: copying into
shared memory there and unpacking here), then the main process's (``pin``; ``copy`` to the
device: the host's time to issue it and the normalisation; ``device_decode``: its thread's time)."""


@dataclass(frozen=True)
class LoaderContext:
    """What the advice depends on, besides the figures."""

    workers: int
    cores: int
    remote: bool
    cached: bool
    device: str | None
    device_decode: bool
    chunked: bool


DEVICE_SHARE = 0.1
"""The share of the epoch the device path (the copy to the device, device decode) may take in the
main process before the verdict names it, even when the loop does not wait: that work runs on
the device and in the training process, beside the training step, and slows it."""

IDLE_WORKERS = 0.5
"""Worker utilisation under which an input-bound epoch is not blamed on the workers' CPU."""


@dataclass(frozen=True)
class LoaderStats:
    """One epoch of a loader, so far (``finished`` False) or whole. Seconds and rates; see
    docs/bottleneck.md for what each figure measures."""

    epoch: int
    finished: bool
    wall_s: float
    first_batch_s: float
    wait_s: float
    wait_workers_s: float
    wait_device_s: float
    wait_fraction: float
    batches: int
    samples: int
    batches_per_s: float
    samples_per_s: float
    stages: dict[str, float]
    workers: int
    cores: int
    worker_busy_s: float
    worker_utilisation: float
    device_s: float
    device_fraction: float
    bottleneck: str
    dominant: str
    advice: str

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able values (for TensorBoard, W&B, a log line)."""
        return asdict(self)

    def __str__(self) -> str:
        state = "finished" if self.finished else "so far"
        stages = "  ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in self.stages.items())
        return "\n".join(
            [
                f"epoch {self.epoch} ({state}): {self.batches} batches, {self.samples} samples in {self.wall_s:.2f} s "
                f"(first batch after {self.first_batch_s:.2f} s)",
                f"  {self.batches_per_s:.1f} batches/s, {self.samples_per_s:.1f} samples/s",
                f"  the loop waited {self.wait_fraction:.0%} of its time for data: {self.wait_workers_s:.2f} s on the "
                f"workers, {self.wait_device_s:.2f} s on the device",
                f"  {self.workers} workers on {self.cores} cores, busy {self.worker_utilisation:.0%} of the time "
                f"({self.worker_busy_s:.2f} s); stage seconds, summed over the workers:",
                f"    {stages}",
                f"  the device path (copy, device decode) took {self.device_s:.2f} s, "
                f"{self.device_fraction:.0%} of the epoch, in this process and on the device",
                f"  bottleneck: {self.bottleneck} ({self.dominant})",
                f"  {self.advice}",
            ]
        )


def loader_context(dataset: Any, *, workers: int, device: str | None) -> LoaderContext:
    """The :class:`LoaderContext` of ``dataset`` read by ``workers`` processes for ``device``."""
    remote = any(is_remote(s.url) for s in dataset.source.shards)
    cached = any(getattr(getattr(s.source, "fetch", None), "cache_dir", None) for s in dataset.streams)
    decode_device = getattr(dataset, "decode_device", None)
    chunked = any(getattr(s, "chunk", None) for s in dataset.source.shards)
    return LoaderContext(
        workers=workers,
        cores=cores(),
        remote=remote,
        cached=bool(cached),
        device=device,
        device_decode=decode_device is not None,
        chunked=chunked,
    )


def cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _stages(times: WorkerTimes, main: dict[str, float]) -> dict[str, float]:
    return {
        "read": times.read,
        "decode": max(0.0, times.process - times.augment),
        "augment": times.augment,
        "collate": times.collate,
        "transfer": times.transfer + main["transfer"],
        "pin": main["pin"],
        "copy": main["copy"],
        "device_decode": main["device_decode"],
    }


def diagnose(meter: LoaderMeter, dataset: Any, context: LoaderContext, *, split_waits: bool = True) -> LoaderStats:
    """The :class:`LoaderStats` of ``meter``'s current (or last) epoch; ``split_waits``: whether
    the meter told waiting on the workers apart from the rest."""
    clock = meter.current
    if clock is None:
        clock = EpochClock(epoch=dataset.epoch, started=0.0, batch_size=dataset.options.batch_size, ended=0.0)
    times = dataset.shared_report.stage_times(clock.epoch)
    stages = _stages(times, meter.main_stages(clock))
    wall = clock.wall()
    wait_fraction = min(1.0, clock.wait / wall) if wall > 0 else 0.0
    wait_workers = clock.wait_workers if split_waits else clock.wait
    wait_device = max(0.0, clock.wait - wait_workers)
    utilisation = times.busy / (max(1, context.workers) * wall) if wall > 0 else 0.0
    bottleneck = "input" if wait_fraction >= INPUT_BOUND else "compute"
    main = meter.main_stages(clock)
    device = max(stages["copy"] + stages["device_decode"], main.get("device_gpu", 0.0))
    device_fraction = min(1.0, device / wall) if wall > 0 else 0.0
    on_device = (bottleneck == "input" and wait_device > wait_workers) or (
        bottleneck == "compute" and device_fraction >= DEVICE_SHARE
    )
    side = ("copy", "device_decode") if on_device else WORKER_STAGES
    dominant = max(side, key=lambda k: stages[k]) if bottleneck == "input" or on_device else "the training step"
    return LoaderStats(
        epoch=clock.epoch,
        finished=clock.ended is not None,
        wall_s=wall,
        first_batch_s=clock.first_batch_s,
        wait_s=clock.wait,
        wait_workers_s=wait_workers,
        wait_device_s=wait_device,
        wait_fraction=wait_fraction,
        batches=clock.batches,
        samples=clock.samples,
        batches_per_s=clock.batches / wall if wall > 0 else 0.0,
        samples_per_s=clock.samples / wall if wall > 0 else 0.0,
        stages=stages,
        workers=context.workers,
        cores=context.cores,
        worker_busy_s=times.busy,
        worker_utilisation=utilisation,
        device_s=device,
        device_fraction=device_fraction,
        bottleneck=bottleneck,
        dominant=dominant,
        advice=_advice(bottleneck, dominant, utilisation, wait_fraction, context, device_fraction),
    )


def _advice(
    bottleneck: str, dominant: str, utilisation: float, waiting: float, c: LoaderContext, on_device: float = 0.0
) -> str:
    """What to try, in plain words."""
    if bottleneck == "compute" and dominant in ("copy", "device_decode"):
        what = "decoding and augmenting on the device" if dominant == "device_decode" else "the copy to the device"
        tip = (
            "decoding on the CPU workers instead (no DecodeOptions(device=...)), with workers to spare, "
            "or --raw-pixels S"
            if dominant == "device_decode"
            else "uint8 batches (normalised on the device) through make_loader(device='cuda')"
        )
        return (
            f"try: {tip} (the loop does not wait for data, but {what} takes {on_device:.0%} of the epoch "
            f"in this process and on the device, beside the training step, which it slows)"
        )
    if bottleneck == "compute":
        tip = "data loading keeps up: the loop's own work (the training step) sets the pace"
        if c.workers > 1 and utilisation < 0.5:
            tip += f"; the workers are idle {1 - utilisation:.0%} of the time, fewer would do"
        return f"try: nothing on the loader side ({tip})"
    tips = []
    idle_cores = c.cores - c.workers - 1  # the training loop has a core of its own
    if dominant in WORKER_STAGES and idle_cores > 0:
        tips.append(f"more worker processes (num_workers={c.workers} on {c.cores} cores leaves {idle_cores} idle)")
    if dominant == "read":
        if c.remote:
            tips.append(
                "a cache on local disk large enough for the data (CacheOptions(dir=..., limit_bytes=...))"
                if not c.cached
                else "a larger cache (CacheOptions(limit_bytes=...))"
            )
            tips.append(
                "a larger block for remote reads (SamplingOptions(shuffle_block=...): fewer, longer ranged reads)"
            )
        if not c.chunked:
            tips.append("the compact layout for small samples (shardify convert --chunk N)")
    elif dominant == "decode":
        tips.append("decoded pixels in the shards (shardify convert --raw-pixels S)")
        if not c.device_decode:
            tips.append("decoding on the GPU (DecodeOptions(device='cuda'))")
        tips.append("the fast JPEG decode (fast_decode=True on the crop transform)")
    elif dominant == "augment":
        tips.append("a lighter augmentation on the CPU, or augmenting on the GPU")
    elif dominant in ("collate", "transfer"):
        tips.append("uint8 batches normalised on the device (make_loader(device=...)), recycle_batches=True")
    elif dominant == "device_decode":
        tips.append("decoding on the CPU workers instead (no DecodeOptions(device=...)) or --raw-pixels S")
    elif dominant == "copy":
        tips.append("make_loader(device='cuda') (pinned memory, one batch ahead) and uint8 batches")
    if dominant in WORKER_STAGES and c.workers > 1 and utilisation < IDLE_WORKERS:
        # The loop waited while the workers were mostly idle: not their CPU but the epoch's start
        # (every worker's first batch), too few batches per worker, or the main process.
        tips.insert(
            0,
            f"longer epochs or persistent workers (the workers were busy {utilisation:.0%} of the time "
            "while the loop waited: the epoch's start, or few batches per worker, sets the pace)",
        )
    busy = "every core is busy; " if idle_cores <= 0 and utilisation >= IDLE_WORKERS else ""
    return f"try: {'; '.join(tips)} ({busy}the loop waits {waiting:.0%} of its time; {dominant} dominates)"


class Measured:
    """``loader`` (any iterable over ``dataset``'s batches: torchdata's ``StatefulDataLoader``, a
    DataLoader) with each epoch measured as ``make_loader``'s loader measures it: iterate this,
    and call :meth:`stats`. Everything else (``state_dict``...) is ``loader``'s own.

    Here waiting on the workers is not told apart from the rest of ``loader``'s ``next()``, and
    the main process's transport stages are not measured (``loader`` owns them)."""

    def __init__(self, loader: Any, dataset: Any, *, progress: bool = False) -> None:
        self.loader, self.dataset = loader, dataset
        self.meter = LoaderMeter(progress=progress)

    def __iter__(self) -> Iterator[Any]:
        clock = self.meter.begin(self.dataset.epoch, batch_size=self.dataset.options.batch_size)
        total = len(self.loader) if hasattr(self.loader, "__len__") else None
        return self.meter.loop(clock, iter(self.loader), total=total)

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name in ("loader", "dataset", "meter"):  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)

    def stats(self) -> LoaderStats:
        """The epoch under way, else the last one iterated."""
        workers = getattr(self.loader, "num_workers", 0)
        return diagnose(
            self.meter, self.dataset, loader_context(self.dataset, workers=workers, device=None), split_waits=False
        )
