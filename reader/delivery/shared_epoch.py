"""The epoch and the resume point, in shared memory: what the main process tells the workers.

Persistent DataLoader workers hold a copy of the dataset made when they started, so
``set_epoch`` and ``resume_at`` in the main process reach them through one small
shared-memory tensor created with the dataset: the current epoch, the resume point (epoch,
batches, plan layout) and the history of the resumed epoch (one
:class:`~shardify.reader.plan.resume.Segment` per earlier topology, at most
:data:`MAX_SEGMENTS`). Each process reads it when its iteration starts (:meth:`SharedEpoch.start`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shardify.reader.plan.resume import LAYOUT, LAYOUTS, Segment

__all__ = ["MAX_SEGMENTS", "SharedEpoch"]

MAX_SEGMENTS = 16
"""Resumes of one epoch on another topology that a state can hold."""

_EPOCH, _RESUME_EPOCH, _RESUME_BATCHES, _LAYOUT, _SEGMENTS = range(5)
_HEADER = 5


class SharedEpoch:
    """The epoch and resume point cells; create it in the main process (workers share them)."""

    def __init__(self) -> None:
        self._cells = torch.zeros(_HEADER + 3 * MAX_SEGMENTS, dtype=torch.int64).share_memory_()
        self._cells[_RESUME_EPOCH] = -1

    @property
    def epoch(self) -> int:
        return int(self._cells[_EPOCH])

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next iteration; a resume point of another epoch is dropped."""
        if epoch < 0:
            raise ValueError(f"{epoch=} should be >= 0")
        if int(self._cells[_RESUME_EPOCH]) != epoch:
            self.clear_resume()
        self._cells[_EPOCH] = epoch

    def resume_at(self, epoch: int, batches: int, *, history: Sequence[Segment] = (), layout: int = LAYOUT) -> None:
        """Select ``epoch`` and make its next iteration skip its first ``batches`` batches."""
        if epoch < 0 or batches < 0:
            raise ValueError(f"{epoch=} and {batches=} should be >= 0")
        if len(history) > MAX_SEGMENTS:
            raise ValueError(f"epoch {epoch} was resumed on another topology {len(history)} times; "
                             f"a state holds at most {MAX_SEGMENTS}")
        if layout not in LAYOUTS:
            raise ValueError(f"{layout=} should be one of {LAYOUTS}")
        self._cells[_EPOCH] = epoch
        self._cells[_RESUME_EPOCH] = epoch
        self._cells[_RESUME_BATCHES] = batches
        self._cells[_LAYOUT] = layout
        self._cells[_SEGMENTS] = len(history)
        for i, seg in enumerate(history):
            self._cells[_HEADER + 3 * i: _HEADER + 3 * i + 3] = torch.tensor([seg.world, seg.workers, seg.batches])

    def step_past(self, epoch: int) -> None:
        """Select ``epoch + 1`` and keep the resume point (a resumed ``epoch`` read to its end)."""
        if epoch < 0:
            raise ValueError(f"{epoch=} should be >= 0")
        self._cells[_EPOCH] = epoch + 1

    def clear_resume(self) -> None:
        self._cells[_RESUME_EPOCH] = -1
        self._cells[_RESUME_BATCHES] = 0
        self._cells[_LAYOUT] = LAYOUT
        self._cells[_SEGMENTS] = 0

    @property
    def resume_history(self) -> tuple[tuple[Segment, ...], int]:
        """``(segments, layout)`` of the pending resume point (``((), LAYOUT)`` when none)."""
        if int(self._cells[_RESUME_EPOCH]) < 0:
            return (), LAYOUT
        n = int(self._cells[_SEGMENTS])
        v = self._cells[_HEADER: _HEADER + 3 * n].tolist()
        return tuple(Segment(*v[3 * i: 3 * i + 3]) for i in range(n)), int(self._cells[_LAYOUT]) or LAYOUT

    @property
    def resume_point(self) -> tuple[int, int] | None:
        """``(epoch, batches)`` the next iteration resumes from, if any."""
        e = int(self._cells[_RESUME_EPOCH])
        return None if e < 0 else (e, int(self._cells[_RESUME_BATCHES]))

    def start(self) -> tuple[int, int, tuple[Segment, ...], int]:
        """``(epoch, batches consumed, history, layout)`` of the iteration starting now: the
        resume point's when it is of the current epoch, else the epoch from its start."""
        epoch = int(self._cells[_EPOCH])
        if int(self._cells[_RESUME_EPOCH]) != epoch:
            return epoch, 0, (), LAYOUT
        history, layout = self.resume_history
        return epoch, int(self._cells[_RESUME_BATCHES]), history, layout
