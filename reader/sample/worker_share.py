"""The hybrid split of device decode: the share of each batch's images the workers decode themselves.

With ``DecodeOptions(device=..., worker_share=...)`` each worker decodes a fraction ``f`` of its
JPEGs as the CPU path does (full decode and transform, with the sample's own RNG: the same crop
and flip) and prepares the rest for the device. ``f`` is fixed (a number, as DALI's
``hw_decoder_load`` is for its hardware decoder) or ``"auto"``: then a :class:`ShareController`
in the main process sets it from measured rates so that neither side waits.

The rule (:func:`worker_share`), per image: a worker spends ``other`` seconds on it whatever
happens (reading, collating, sending), plus ``prep`` when the device decodes it or ``decode``
when it decodes it itself; the device spends ``device`` seconds on each image it decodes. With
``W`` workers, a share ``f`` gives the workers ``W / (other + prep + f (decode - prep))`` images
per second and the device ``1 / ((1 - f) device)``; the pipeline runs at the smaller of the two,
which is largest where they are equal::

    f = (W device - other - prep) / (W device + decode - prep), clamped to [0, 1]

(0 when the workers are the limit even with nothing to decode; 1 when decoding costs a worker
no more than preparing).

The share and the workers' timings live in one shared-memory tensor (:class:`SharedSplit`),
made with the dataset before any worker starts: fork workers inherit it, spawn workers receive
it by handle with their pickled dataset. Row 0 holds the share; each worker adds its seconds and
images to its own row every :data:`FLUSH` images (no lock: one writer per row).
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from shardify.reader.sample.clock import CLOCK
from shardify.reader.sample.prepared import EncodedBatch

__all__ = ["worker_share", "SharedSplit", "ShareController", "SplitStage", "FLUSH", "SLOTS"]

SLOTS = 130
"""Rows for the workers' timings (row ``1 + worker id``, the in-process reader's last)."""
FLUSH = 16
"""Images a worker times before adding them to its row."""
_DECODE_S, _DECODE_N, _PREP_S, _PREP_N, _OTHER_S, _WORKERS = range(6)


def worker_share(*, workers: int, device_s: float, decode_s: float, prep_s: float, other_s: float = 0.0) -> float:
    """The share of images the workers should decode so that neither side waits (module docstring).

    ``workers``: how many decode in parallel; ``device_s``: device seconds per image it decodes;
    ``decode_s``/``prep_s``: a worker's seconds to decode and transform an image, or to prepare
    it for the device; ``other_s``: a worker's seconds per image either way.
    """
    values = (device_s, decode_s, prep_s, other_s)
    if workers < 1 or any(not math.isfinite(v) or v < 0 for v in values):
        raise ValueError(f"worker_share: {workers=} should be >= 1 and {values=} finite and >= 0")
    if decode_s <= prep_s:
        return 1.0  # decoding here costs a worker nothing more: the device need not wait for anything
    num = workers * device_s - other_s - prep_s
    if num <= 0:
        return 0.0
    return min(1.0, num / (workers * device_s + decode_s - prep_s))


class SharedSplit:
    """The share (fixed, or set by a :class:`ShareController`) and the workers' timings; see the
    module docstring. ``take()`` in a worker: whether to decode the next image there."""

    def __init__(self, share: float, *, timed: bool) -> None:
        self._table = torch.zeros(SLOTS + 1, 6, dtype=torch.float64).share_memory_()
        self._table[0, 0] = share
        self.timed = timed
        self._local()

    def _local(self) -> None:
        """This process's own state: a view of the table, the credit of images owed, unflushed times."""
        self._view: np.ndarray | None = None
        self._pid = os.getpid()  # a forked worker starts its own state (not its parent's row)
        self._credit = 0.0
        self._row = 0
        self._pending = np.zeros(4, dtype=np.float64)  # decode s, decode n, prep s, prep n

    def __getstate__(self) -> dict[str, Any]:
        return {"_table": self._table, "timed": self.timed}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local()

    @property
    def share(self) -> float:
        return float(self._table[0, 0])

    def set_share(self, share: float) -> None:
        self._table[0, 0] = min(1.0, max(0.0, share))

    def _opened(self) -> np.ndarray:
        """This process's view of the table, its row claimed on first use (again after a fork)."""
        if self._view is not None and self._pid == os.getpid():
            return self._view
        self._local()
        view: np.ndarray = self._table.numpy()
        info = get_worker_info()
        self._row = 1 + min(info.id, SLOTS - 2) if info is not None else SLOTS
        view[self._row, _WORKERS] = info.num_workers if info is not None else 1
        self._view = view
        return view

    def take(self) -> bool:
        """Whether this worker decodes its next image itself: a running credit of the share, so
        that over any run of images the worker decodes ``share`` of them, to within one."""
        view = self._opened()
        self._credit += float(view[0, 0])
        if self._credit >= 1.0 - 1e-9:  # (float sums of 0.3 fall short of 1 by an ulp)
            self._credit -= 1.0
            return True
        return False

    def record(self, seconds: float, *, decoded: bool) -> None:
        """One image's worker seconds: decoded here, or prepared for the device."""
        p = self._pending
        k = 0 if decoded else 2
        p[k] += seconds
        p[k + 1] += 1
        if p[1] + p[3] >= FLUSH:
            row = self._opened()[self._row]
            row[_DECODE_S : _PREP_N + 1] += p
            row[_OTHER_S] = CLOCK.read + CLOCK.collate + CLOCK.transfer
            p[:] = 0.0

    def totals(self) -> tuple[np.ndarray, int]:
        """``(sums, workers)``: the workers' decode s, decode n, prep s, prep n and other s summed
        over rows, and how many workers write (the largest count a worker saw)."""
        rows = self._table[1:].numpy()
        return rows[:, :_WORKERS].sum(axis=0), max(1, int(rows[:, _WORKERS].max()))


class ShareController:
    """Sets ``split``'s share from the device's time per image (``observe``) and the workers' (their
    rows of the split), every ``every`` batches, moving ``smoothing`` of the way to the rule's answer.

    Until both sides have timed some images it leaves the share where it is (``start``, e.g.
    0.1, lets both be timed); a side that timed nothing lately keeps its last rate.
    """

    def __init__(self, split: SharedSplit, *, every: int = 4, smoothing: float = 0.5) -> None:
        self.split, self.every, self.smoothing = split, every, smoothing
        self._last = split.totals()[0]  # what the workers timed before (an earlier epoch) is not this one's
        self._device = [0.0, 0]  # seconds, images since the last update
        self._batches = 0
        self._rates: dict[str, float] = {}  # the last known seconds per image of each kind
        self.history: list[float] = []  # the shares set, in order (for tests and stats)

    def observe(self, seconds: float, images: int) -> None:
        """The device spent ``seconds`` on a batch of ``images`` images it decoded."""
        self._device[0] += seconds
        self._device[1] += images
        self._batches += 1
        if self._batches % self.every == 0:
            self._update()

    def _update(self) -> None:
        sums, workers = self.split.totals()
        delta, self._last = sums - self._last, sums
        # (a worker started anew counts from 0 again: its row's other seconds may go back)
        decode_s, decode_n, prep_s, prep_n, other_s = (max(0.0, float(x)) for x in delta)
        rates = self._rates
        if decode_n:
            rates["decode"] = decode_s / decode_n
        if prep_n:
            rates["prep"] = prep_s / prep_n
        if decode_n + prep_n:
            rates["other"] = other_s / (decode_n + prep_n)
        if self._device[1]:
            rates["device"] = self._device[0] / self._device[1]
        self._device = [0.0, 0]
        if not {"decode", "prep", "device"} <= rates.keys():
            return
        target = worker_share(
            workers=workers,
            device_s=rates["device"],
            decode_s=rates["decode"],
            prep_s=rates["prep"],
            other_s=rates.get("other", 0.0),
        )
        share = self.split.share
        share += self.smoothing * (target - share)
        self.split.set_share(share)
        self.history.append(self.split.share)


class SplitStage:
    """A device stage under the hybrid split: calls ``stage``, counts the images the workers decoded
    by the split (``tally``'s ``worker_share``) and, with a ``controller``, tells it the device's
    seconds per batch: host time, or on CUDA the time between events around the call when longer
    (read once they are done, a batch or two later, never waiting for them)."""

    def __init__(self, stage: Any, *, tally: Any, controller: ShareController | None) -> None:
        self.stage, self.tally, self.controller = stage, tally, controller
        self.device = stage.device
        self._pending: list[tuple[Any, Any, float, int]] = []

    def __call__(self, batch: EncodedBatch) -> Any:
        self.tally.add("worker_share", batch.shared)
        if self.controller is None:
            return self.stage(batch)
        images = int((batch.offsets[1:] > batch.offsets[:-1]).sum())
        cuda = self.device.type == "cuda"
        begin = torch.cuda.Event(enable_timing=True) if cuda else None
        if begin is not None:
            begin.record()
        start = time.perf_counter()
        out = self.stage(batch)
        host = time.perf_counter() - start
        if begin is None:
            self.controller.observe(host, images)
            return out
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._pending.append((begin, end, host, images))
        while self._pending and self._pending[0][1].query():
            b, e, h, n = self._pending.pop(0)
            self.controller.observe(max(h, b.elapsed_time(e) / 1000), n)
        return out
