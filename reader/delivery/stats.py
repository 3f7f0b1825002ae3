"""Where an epoch's time goes: the training loop's waits, and the seconds of each stage.

Two sides meet here:

- In each process that makes batches (a DataLoader worker, or the main process reading
  in-process), :meth:`StageTable.timed` times each batch the dataset yields (the worker's busy
  time) and copies the process's :data:`~shardify.reader.sample.clock.CLOCK` into the
  process's row of a shared-memory table, once per batch, before yielding it. The table
  belongs to the dataset's :class:`~shardify.reader.delivery.report.SharedReport` and uses its
  slots, so it reaches the main process the way the skip report does, under any DataLoader;
  nothing is sent per sample.
- In the main process, :class:`LoaderMeter` times the training loop's side of an epoch: the
  seconds spent inside ``next()`` for each batch (waiting), split into waiting on the workers
  (inside the DataLoader's ``next()``) and the rest (the device copy or decode, with a device);
  the batch transport and the device prefetcher add their own stages to its
  :class:`MainClock`.

:func:`~shardify.reader.delivery.diagnosis.diagnose` turns the two into a
:class:`~shardify.reader.delivery.diagnosis.LoaderStats`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from shardify.progress import progress_bar
from shardify.reader.sample.clock import CLOCK

__all__ = ["StageTable", "WorkerTimes", "MainClock", "EpochClock", "LoaderMeter", "batch_samples"]

_STAMP, _BUSY, _FIRST_STAGE = 0, 1, 2
_BATCHES = _FIRST_STAGE + len(CLOCK.values())
_COLUMNS = _BATCHES + 1
_BAR_EVERY_S = 0.5


@dataclass(frozen=True)
class WorkerTimes:
    """One epoch's seconds in the processes that made batches, summed over them."""

    busy: float = 0.0
    read: float = 0.0
    process: float = 0.0
    augment: float = 0.0
    collate: float = 0.0
    transfer: float = 0.0
    batches: int = 0


class StageTable:
    """Per-slot stage seconds in shared memory (``float64 [slots, columns]``); made in the main process."""

    def __init__(self, slots: int) -> None:
        self._table = torch.zeros(slots, _COLUMNS, dtype=torch.float64).share_memory_()

    def start(self, slot: int, *, epoch: int) -> None:
        """Reset ``slot`` for ``epoch`` (as its process's iteration starts)."""
        self._table[slot] = 0
        self._table[slot, _STAMP] = epoch + 1

    def timed(
        self, slot: int, batches: Iterator[Any], *, base: tuple[float, ...] = (), busy: float = 0.0
    ) -> Iterator[Any]:
        """``batches``, each one's making timed and the clock's stages written to ``slot`` before it is
        yielded; ``base`` and ``busy``: the clock's values and the seconds already spent, when the
        first batches were made before (ahead, in another thread of this process)."""
        row = self._table.numpy()[slot]
        base = base or CLOCK.values()
        n = 0
        while True:
            t = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                return
            busy += time.perf_counter() - t
            n += 1
            row[_FIRST_STAGE:_BATCHES] = [v - b for v, b in zip(CLOCK.values(), base)]
            row[_BUSY], row[_BATCHES] = busy, n
            yield batch

    def read(self, slots: list[int], *, epoch: int) -> WorkerTimes:
        """The sums over ``slots`` of the rows stamped with ``epoch``."""
        rows = self._table[slots]
        rows = rows[rows[:, _STAMP] == epoch + 1]
        if not len(rows):
            return WorkerTimes()
        total = rows.sum(0).tolist()
        read, process, augment, collate, transfer = total[_FIRST_STAGE:_BATCHES]  # (the clock's STAGES)
        return WorkerTimes(total[_BUSY], read, process, augment, collate, transfer, batches=int(total[_BATCHES]))


@dataclass
class MainClock:
    """Seconds of the main process's stages (added by the batch transport and the prefetcher)."""

    transfer: float = 0.0  # a batch's tensors made over its shared-memory slots
    pin: float = 0.0  # copied to pinned memory (DataLoader's pin thread)
    copy: float = 0.0  # host time of the copy to the device and the normalisation
    device_decode: float = 0.0  # decoding and augmenting on the device: its thread's wall time
    device_gpu: float = 0.0  # the device's own time for the copy or decode (CUDA events on the side stream)
    _events: list[tuple[Any, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, stage: str, seconds: float) -> None:
        setattr(self, stage, getattr(self, stage) + seconds)

    def add_events(self, start: Any, end: Any) -> None:
        """A span of device work between two recorded CUDA events (``enable_timing=True``): added to
        ``device_gpu`` once it is done on the device (read without waiting for it)."""
        with self._lock:
            self._events.append((start, end))

    def _collect(self) -> None:
        done: list[tuple[Any, Any]] = []
        pending: list[tuple[Any, Any]] = []
        with self._lock:
            for pair in self._events:
                (done if pair[1].query() else pending).append(pair)
            self._events = pending
        self.device_gpu += sum(a.elapsed_time(b) for a, b in done) / 1000.0

    def values(self) -> dict[str, float]:
        if self._events:
            self._collect()
        return {
            "transfer": self.transfer,
            "pin": self.pin,
            "copy": self.copy,
            "device_decode": self.device_decode,
            "device_gpu": self.device_gpu,
        }


def batch_samples(batch: Any) -> int | None:
    """Samples in ``batch``: the first dimension of its first tensor (depth first), else None."""
    for _ in range(8):
        if isinstance(batch, torch.Tensor):
            return int(batch.shape[0]) if batch.dim() else None
        if isinstance(batch, dict):
            batch = next(iter(batch.values()), None)
        elif isinstance(batch, (tuple, list)):
            if batch and not isinstance(batch[0], (torch.Tensor, tuple, list, dict)):
                return len(batch)
            batch = batch[0] if batch else None
        else:
            keys = getattr(batch, "keys", None)  # an EncodedBatch: one key per sample
            return len(keys) if isinstance(keys, (tuple, list)) else None
    return None


@dataclass
class EpochClock:
    """The training loop's side of one epoch, in seconds of ``time.perf_counter``."""

    epoch: int
    started: float
    batch_size: int
    ended: float | None = None
    first_batch_s: float = 0.0
    wait: float = 0.0  # inside next()
    wait_workers: float = 0.0  # of which inside the DataLoader's next()
    batches: int = 0
    samples: int = 0
    main_base: dict[str, float] = field(default_factory=dict)
    main_end: dict[str, float] | None = None

    def wall(self) -> float:
        return (self.ended if self.ended is not None else time.perf_counter()) - self.started


class LoaderMeter:
    """The main process's measurements of a loader's epochs (see the module docstring)."""

    def __init__(self, *, progress: bool = False) -> None:
        self.main = MainClock()
        self.current: EpochClock | None = None
        self._progress = progress

    def begin(self, epoch: int, *, batch_size: int) -> EpochClock:
        """A new epoch's clock (the last one is kept until then)."""
        self.current = EpochClock(epoch, time.perf_counter(), batch_size, main_base=self.main.values())
        return self.current

    def main_stages(self, clock: EpochClock) -> dict[str, float]:
        now = clock.main_end if clock.main_end is not None else self.main.values()
        return {k: now[k] - clock.main_base.get(k, 0.0) for k in now}

    @staticmethod
    def workers(clock: EpochClock, batches: Iterator[Any]) -> Iterator[Any]:
        """``batches`` from the DataLoader, the time in each ``next()`` counted as waiting on the workers."""
        it = iter(batches)
        t = clock.started  # starting the workers is waiting on them
        while True:
            try:
                batch = next(it)
            except StopIteration:
                return
            clock.wait_workers += time.perf_counter() - t
            yield batch
            t = time.perf_counter()

    def loop(self, clock: EpochClock, batches: Iterator[Any], *, total: int | None = None) -> Iterator[Any]:
        """``batches`` as the training loop gets them: waits, batches and samples counted; a bar."""
        bar = progress_bar(
            total=total, desc=f"epoch {clock.epoch}", unit="batch", enabled=self._progress, unit_scale=False
        )
        shown = t = clock.started  # from the start: what the loop's first next() waited for
        try:
            while True:
                try:
                    batch = next(batches)
                except StopIteration:
                    clock.wait += time.perf_counter() - t
                    break
                now = time.perf_counter()
                clock.wait += now - t
                if not clock.batches:
                    clock.first_batch_s = now - clock.started  # worker start included
                clock.batches += 1
                n = batch_samples(batch)
                clock.samples += n if n is not None else clock.batch_size
                if clock.batches == total or clock.ended is not None:  # a loop that stops at len()
                    ended = clock.batches == total  # (Lightning) never asks for the end; a replanned
                    clock.ended = now if ended else None  # resume may hold more batches than that
                    clock.main_end = self.main.values() if ended else None
                if bar is not None:
                    bar.update(1)
                    if now - shown >= _BAR_EVERY_S:
                        shown = now
                        bar.set_postfix_str(_bar_text(clock, now), refresh=False)
                yield batch
                t = time.perf_counter()
            clock.ended = time.perf_counter()
            clock.main_end = self.main.values()
        finally:
            if bar is not None:
                bar.set_postfix_str(_bar_text(clock, time.perf_counter()), refresh=False)
                bar.close()
            close = getattr(batches, "close", None)
            if close is not None:  # the device prefetcher's thread ends here, as without the meter
                close()


def _bar_text(clock: EpochClock, now: float) -> str:
    wall = now - clock.started
    waiting = clock.wait / wall if wall > 0 else 0.0
    rate = clock.samples / wall if wall > 0 else 0.0
    return f"{rate:,.0f} samples/s, waiting {waiting:.0%}"
