"""One process's place in its share of an epoch, for torchdata's ``StatefulDataLoader`` protocol.

A dataset's ``state_dict`` is the place of the process that calls it (one DataLoader worker,
or the main process without workers; the state itself is
:func:`~shardify.reader.delivery.state.make_iter_state`'s): the iteration under way, else a
place loaded for the next one. A loaded place resumes only the process it was loaded in, and
only an iteration of its own epoch: an iteration of another epoch drops it if its share was
finished, and refuses it otherwise.

A place saved after the epoch's last batch (its share finished, and that batch its own) met by
an iteration of that same epoch is refused too, with :class:`~shardify.errors.ResumeError`: the
process cannot tell a loop that asks for the (empty) rest of the epoch from one that means the
next epoch (PyTorch Lightning checkpoints there, then iterates without setting the next epoch),
and reading nothing would skip an epoch without a word. ``set_epoch(epoch + 1)`` goes on.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from typing import Any

from shardify.errors import ResumeError
from shardify.reader.delivery.state import IterPosition, ResumeBasis, load_iter_state, make_iter_state
from shardify.reader.plan.assign import resumed_role
from shardify.reader.plan.epoch import EpochInputs, EpochPlan
from shardify.reader.plan.resume import Segment
from shardify.reader.plan.world import World

__all__ = ["ProcessPlace", "loaded_place", "require_state"]


def require_state(state: object, *, owner: str) -> None:
    """Raise :class:`ResumeError` unless ``state`` is a state (a dict, as ``{owner}.state_dict()``
    returns it): ``ckpt.get("loader")`` of a checkpoint saved without one gives None."""
    if isinstance(state, Mapping):
        return
    hint = " (a checkpoint saved without this state? ckpt.get(...) gives None then)" if state is None else ""
    raise ResumeError(
        f"{owner}.load_state_dict: got {type(state).__name__} {str(state)[:60]!r}{hint}; a state is the dict "
        f"that {owner}.state_dict() returns, with keys such as 'version', 'epoch', 'batches' and 'seed'"
    )


class ProcessPlace:
    """Where this process's iteration stands (``position``), and a place loaded for its next."""

    def __init__(self) -> None:
        self.position: IterPosition | None = None  # the iteration under way (or last)
        self._pending: tuple[int, IterPosition] | None = None  # (pid, place) loaded, for the next iteration

    def __getstate__(self) -> dict[str, Any]:
        # Sent to a spawned worker: it has no iteration under way; a place loaded here stays
        # (and is refused there, see take).
        return {"position": None, "_pending": self._pending}

    def saved(self) -> IterPosition | None:
        """What a state taken now holds: the iteration under way (or last), else the place loaded."""
        if self.position is not None:
            return self.position
        return self._pending[1] if self._pending is not None else None

    def load(self, place: IterPosition) -> None:
        """Keep ``place`` (checked by ``load_iter_state``) for this process's next iteration."""
        self._pending = (os.getpid(), place)

    def state_dict(self, basis: ResumeBasis, *, epoch: int, world: World) -> dict[str, Any]:
        """The state of this process's place (the dataset's ``state_dict``): the iteration under
        way, else the place loaded, else the start of ``epoch`` as ``world.worker``."""
        place = self.saved()
        if place is None:
            place = IterPosition(epoch=epoch, role=world.worker, workers=world.workers, world=world.world, batches=0)
        return make_iter_state(basis, place)

    def load_state_dict(self, basis: ResumeBasis, state: dict[str, Any], *, world: World) -> None:
        """Check ``state`` against ``basis`` and this process's topology now; keep it for the next iteration."""
        self.load(load_iter_state(basis, state, world=world.world, workers=world.workers))

    def begin(
        self, inputs: EpochInputs, *, world: World, epoch: int, consumed: int, history: tuple[Segment, ...]
    ) -> tuple[IterPosition, EpochPlan | Callable[[], EpochPlan]]:
        """Where this process's iteration of ``epoch`` starts, and its share's plan (or what makes
        it, when the first batch is asked for): a place loaded for it, else DataLoader worker
        ``world.worker``'s role after the ``consumed`` batches of the resume point, from
        ``history`` (:meth:`SharedEpoch.start`)."""
        role, skip = resumed_role(world.worker, workers=world.workers, consumed=consumed)
        loaded = self.take_planned(inputs, epoch=epoch, world=world)
        plan: EpochPlan | Callable[[], EpochPlan]
        if loaded is not None:
            place, plan = loaded
            role, skip, history = place.role, place.batches, place.history
        else:
            ranks = dict(rank=world.rank, world=world.world, workers=world.workers)
            plan = functools.partial(inputs.worker, epoch, worker=role, history=history, **ranks)
        self.position = IterPosition(
            epoch=epoch,
            role=role,
            workers=world.workers,
            world=world.world,
            batches=skip,
            history=history,
        )
        return self.position, plan

    def take_planned(self, inputs: EpochInputs, *, epoch: int, world: World) -> tuple[IterPosition, EpochPlan] | None:
        """The place loaded for an iteration of ``epoch`` starting now, with its share's plan,
        if one was loaded and is of that epoch (see :func:`loaded_place`)."""
        place = self.take()
        if place is None:
            return None
        plan = inputs.worker(
            place.epoch,
            rank=world.rank,
            world=world.world,
            worker=place.role,
            workers=world.workers,
            history=place.history,
        )
        loaded = loaded_place(place, epoch=epoch, total=plan.num_batches, holds_last=plan.holds_last)
        return None if loaded is None else (loaded, plan)

    def take(self) -> IterPosition | None:
        """The place loaded for the iteration starting now, once; it must be this process's."""
        if self._pending is None:
            return None
        (pid, place), self._pending = self._pending, None
        if pid != os.getpid():
            raise ValueError(
                "ShardedDataset.load_state_dict was called in the main process, and the dataset is "
                "iterated in DataLoader workers: a dataset state resumes the process it is loaded "
                "in. Load it through torchdata's StatefulDataLoader.load_state_dict (it hands each "
                "worker its own), or save and load make_loader's loader.state_dict()"
            )
        return place


def loaded_place(place: IterPosition, *, epoch: int, total: int, holds_last: bool = False) -> IterPosition | None:
    """``place`` for an iteration of ``epoch``, its share holding ``total`` batches (``holds_last``:
    the epoch's last batch among them): ``place`` when it is of that epoch, unless it ends the
    epoch (raises ResumeError); None (start afresh) when it finished its own; else raises."""
    if place.batches > total:
        raise ValueError(
            f"the dataset state loaded has {place.batches} batches of epoch {place.epoch} taken by "
            f"worker {place.role} of {place.workers}, whose share has {total}"
        )
    if place.epoch == epoch and holds_last and total and place.batches == total:
        raise ResumeError(
            f"the dataset state loaded was saved after the last batch of epoch {epoch} (worker {place.role} of "
            f"{place.workers} had yielded all {total} of its batches, the epoch's last among them), and the dataset "
            f"is set to epoch {epoch} again, whose rest is empty. Call set_epoch({epoch + 1}) before iterating, to "
            f"go on with the next epoch. Under PyTorch Lightning (it checkpoints there, then iterates without "
            f"on_train_epoch_start), return make_loader's loader from train_dataloader: it resumes such a "
            f"checkpoint at the next epoch"
        )
    if place.epoch == epoch:
        return place
    if place.batches < total:
        raise ValueError(
            f"the dataset state loaded is {place.batches} of {total} batches into epoch {place.epoch} "
            f"(worker {place.role} of {place.workers}), but the dataset is set to epoch {epoch}: "
            f"call set_epoch({place.epoch}) before iterating, to resume"
        )
    return None  # a finished epoch: the next one starts afresh
