"""The epoch and the resume point, in shared memory: what the main process tells the workers.

Persistent DataLoader workers hold a copy of the dataset made when they started, so
``set_epoch`` and ``resume_at`` in the main process reach them through one small
shared-memory tensor created with the dataset: the current epoch, the resume point (epoch,
batches) and the history of the resumed epoch (one
:class:`~shardify.reader.plan.resume.Segment` per earlier topology, at most
:data:`MAX_SEGMENTS`). Each process reads it when its iteration starts (:meth:`SharedEpoch.start`).

A resume point no iteration has started from yet is *pending*: ``set_epoch`` to an epoch that
would drop it (another than the saved one, or than the next one after a finished epoch) raises
:class:`~shardify.errors.ResumeError` naming the saved epoch and batches, rather than read a
whole epoch the caller did not mean to (a loop restarted from epoch 0 after loading a state).
``clear_resume`` drops a point on purpose.

:class:`EpochControl` is that API on a dataset (``ds.set_epoch``, ``ds.resume_at``, ...).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shardify.errors import ResumeError
from shardify.reader.plan.resume import Segment

__all__ = ["MAX_SEGMENTS", "SharedEpoch", "EpochControl"]

MAX_SEGMENTS = 16
"""Resumes of one epoch on another topology that a state can hold."""

_EPOCH, _RESUME_EPOCH, _RESUME_BATCHES, _SEGMENTS, _PENDING = range(5)
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
        """Select the epoch of the next iteration; a resume point of another epoch is dropped,
        unless it is pending (see the module docstring): then this raises ResumeError."""
        if epoch < 0:
            raise ValueError(f"{epoch=} should be >= 0")
        saved = int(self._cells[_RESUME_EPOCH])
        if saved != epoch and saved >= 0 and int(self._cells[_PENDING]):
            self._refuse_drop(epoch, saved)
        if saved != epoch:
            self.clear_resume()
        self._cells[_EPOCH] = epoch

    def _refuse_drop(self, epoch: int, saved: int) -> None:
        """Raise unless ``epoch`` is the one after ``saved``, a finished epoch stepped past."""
        batches = int(self._cells[_RESUME_BATCHES])
        if int(self._cells[_EPOCH]) == saved + 1:  # step_past: the saved epoch was read to its end
            if epoch == saved + 1:
                return
            raise ResumeError(
                f"the state loaded was saved at the end of epoch {saved} (after its last batch, {batches} batches): "
                f"the next epoch is {saved + 1}, but set_epoch({epoch}) was called. Call set_epoch({saved + 1}) "
                f"(or set_epoch({saved}) for its empty rest), or clear_resume() first to drop the state on purpose"
            )
        raise ResumeError(
            f"the state loaded resumes epoch {saved} after {batches} batches, but set_epoch({epoch}) would drop it "
            f"and read epoch {epoch} from its start. Call set_epoch({saved}) to resume there (start the epoch loop "
            f"at the saved epoch, state['epoch']), or clear_resume() first to drop the state on purpose"
        )

    def resume_at(self, epoch: int, batches: int, *, history: Sequence[Segment] = ()) -> None:
        """Select ``epoch`` and make its next iteration skip its first ``batches`` batches."""
        if epoch < 0 or batches < 0:
            raise ValueError(f"{epoch=} and {batches=} should be >= 0")
        if len(history) > MAX_SEGMENTS:
            raise ValueError(
                f"epoch {epoch} was resumed on another topology {len(history)} times; "
                f"a state holds at most {MAX_SEGMENTS}"
            )
        self._cells[_EPOCH] = epoch
        self._cells[_RESUME_EPOCH] = epoch
        self._cells[_RESUME_BATCHES] = batches
        self._cells[_SEGMENTS] = len(history)
        for i, seg in enumerate(history):
            self._cells[_HEADER + 3 * i : _HEADER + 3 * i + 3] = torch.tensor([seg.world, seg.workers, seg.batches])
        self._cells[_PENDING] = 1

    def step_past(self, epoch: int) -> None:
        """Select ``epoch + 1`` and keep the resume point (a resumed ``epoch`` read to its end)."""
        if epoch < 0:
            raise ValueError(f"{epoch=} should be >= 0")
        self._cells[_EPOCH] = epoch + 1

    def clear_resume(self) -> None:
        self._cells[_RESUME_EPOCH] = -1
        self._cells[_RESUME_BATCHES] = 0
        self._cells[_SEGMENTS] = 0
        self._cells[_PENDING] = 0

    @property
    def resume_history(self) -> tuple[Segment, ...]:
        """The segments of the pending resume point (none when there is none)."""
        if int(self._cells[_RESUME_EPOCH]) < 0:
            return ()
        n = int(self._cells[_SEGMENTS])
        v = self._cells[_HEADER : _HEADER + 3 * n].tolist()
        return tuple(Segment(*v[3 * i : 3 * i + 3]) for i in range(n))

    @property
    def resume_point(self) -> tuple[int, int] | None:
        """``(epoch, batches)`` the next iteration resumes from, if any."""
        e = int(self._cells[_RESUME_EPOCH])
        return None if e < 0 else (e, int(self._cells[_RESUME_BATCHES]))

    def start(self) -> tuple[int, int, tuple[Segment, ...]]:
        """``(epoch, batches consumed, history)`` of the iteration starting now: the
        resume point's when it is of the current epoch, else the epoch from its start. The
        resume point is no longer pending (see the module docstring)."""
        self._cells[_PENDING] = 0
        epoch = int(self._cells[_EPOCH])
        if int(self._cells[_RESUME_EPOCH]) != epoch:
            return epoch, 0, ()
        return epoch, int(self._cells[_RESUME_BATCHES]), self.resume_history


class EpochControl:
    """The epoch and resume point of a dataset, set in the main process: its ``_shared_epoch``'s."""

    _shared_epoch: SharedEpoch

    @property
    def epoch(self) -> int:
        return self._shared_epoch.epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next iteration (shard order, shuffle, augmentation).

        A resume point (``resume_at``, or the loader's ``load_state_dict``) survives only if it
        is for this same epoch; one that no iteration has started from yet is not dropped
        silently: another epoch raises :class:`~shardify.errors.ResumeError` naming the saved
        epoch and batches (the epoch after a finished one is allowed). ``clear_resume()`` drops it.
        """
        self._shared_epoch.set_epoch(epoch)

    def resume_at(self, epoch: int, batches: int, *, history: Sequence[Segment] = ()) -> None:
        """Make the next iteration of ``epoch`` skip its first ``batches`` batches (not decoded).

        ``history``: the parts of the epoch consumed before on other topologies (their samples
        are left out and the rest is planned anew).
        """
        self._shared_epoch.resume_at(epoch, batches, history=history)

    def resume_after_end(self, epoch: int) -> None:
        """Make the next iteration ``epoch + 1``'s: ``epoch`` was read to its end (a state saved
        after its last batch, as Lightning does). Its resume point stays, so ``set_epoch(epoch)``
        still asks for its (empty) rest."""
        self._shared_epoch.step_past(epoch)

    def clear_resume(self) -> None:
        self._shared_epoch.clear_resume()

    @property
    def resume_history(self) -> tuple[Segment, ...]:
        """The segments of the pending resume point (none when there is none)."""
        return self._shared_epoch.resume_history

    @property
    def resume_point(self) -> tuple[int, int] | None:
        """``(epoch, batches)`` the next iteration resumes from, if any."""
        return self._shared_epoch.resume_point
