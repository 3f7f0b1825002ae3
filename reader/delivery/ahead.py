"""The next epoch's first batch, made in a persistent worker while the current epoch ends.

A persistent DataLoader worker that has yielded the last batch of its share waits, idle, until
the next ``iter(loader)``; then every worker builds its first batch from nothing, and the
training loop waits a whole batch build at each epoch's start. Instead, when its share ends,
the worker starts a thread (``shardify-ahead``) that builds the chain of the epoch that follows
(``epoch + 1``, from its start, same role and topology; the same epoch again for a loop seen
iterating without ``set_epoch``) and makes its first batch.

When the next iteration starts (:meth:`EpochAhead.take`), the worker's place in it
(:class:`~shardify.reader.delivery.state.IterPosition`: epoch, role, batches consumed, history,
topology) is compared with the one the batch was made for. The same place: the iteration goes on
with that chain, its first batch already made (the very batch the chain would have made then: it
is the same chain of the same pure plan). Another place (``set_epoch`` to another epoch, a resume
point loaded): the thread is waited for (at most the batch it is making), the batch made is given
back (its shared-memory slots freed) and its reader closed; the iteration starts afresh.

What the thread did is kept apart until it is taken: samples skipped as bad are recorded in the
report of the epoch they belong to, and the seconds spent go to that epoch's stage row, when the
iteration that uses them begins (see :func:`~shardify.reader.worker.share_batches`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from shardify.reader.delivery.state import IterPosition
from shardify.reader.plan.epoch import EpochPlan
from shardify.reader.sample.bad import Bad
from shardify.reader.sample.clock import CLOCK

__all__ = ["Made", "EpochAhead"]

MakeChain = Callable[[EpochPlan, Callable[[Bad], None]], tuple[Iterator[Any], Any]]
"""``make(plan, on_bad) -> (batches, reader)``: the share's chain from its place, and the reader it closes with."""


@dataclass
class Made:
    """A share's chain whose first batch was made ahead: what :func:`share_batches` goes on with."""

    place: IterPosition
    plan: EpochPlan | None = None
    made: list[Any] = field(default_factory=list)
    batches: Iterator[Any] | None = None  # the chain after the batches made
    reader: Any = None
    bad: list[Bad] = field(default_factory=list)
    base: tuple[float, ...] = ()  # CLOCK's values when the thread began
    busy: float = 0.0  # seconds the thread spent making them
    error: BaseException | None = None
    _sink: Callable[[Bad], None] | None = None

    def on_bad(self, bad: Bad) -> None:
        """The chain's ``on_bad``: kept until :meth:`report_to` names where they go."""
        if self._sink is not None:
            self._sink(bad)
        else:
            self.bad.append(bad)

    def report_to(self, on_bad: Callable[[Bad], None]) -> None:
        """Send the samples skipped so far, and from now on, to ``on_bad`` (the epoch's report)."""
        self._sink = on_bad
        for bad in self.bad:
            on_bad(bad)
        self.bad = []

    def chained(self) -> Iterator[Any]:
        """The batches made, then the rest of the chain."""
        yield from self.made
        self.made = []
        if self.batches is not None:
            yield from self.batches


class _Job:
    def __init__(self, made: Made, plan: Callable[[], EpochPlan], make: MakeChain) -> None:
        self.made = made
        self._plan, self._make = plan, make
        self.thread = threading.Thread(target=self._run, name="shardify-ahead", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        m = self.made
        m.base = CLOCK.values()
        start = time.perf_counter()
        try:
            m.plan = plan = self._plan()
            if plan.num_batches <= m.place.batches:
                return
            m.batches, m.reader = self._make(plan, m.on_bad)
            batch = next(m.batches, _NONE)
            if batch is not _NONE:
                m.made.append(batch)
        except BaseException as e:  # noqa: BLE001 - the iteration that would use it raises it itself
            m.error = e
        finally:
            m.busy = time.perf_counter() - start


_NONE = object()


class EpochAhead:
    """One worker process's batch made ahead (see the module docstring); ``enabled`` by make_loader
    for persistent workers, before they start (they take it with their copy of the dataset)."""

    def __init__(self) -> None:
        self.enabled = False
        self._job: _Job | None = None
        self.taken = 0  # iterations that went on with a batch made ahead
        self.dropped = 0  # batches made ahead and given back
        self._last: int | None = None  # the epoch of this process's last iteration
        self._step = 1  # from one iteration's epoch to the next's, as last seen

    def __getstate__(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "_job": None, "taken": 0, "dropped": 0, "_last": None, "_step": 1}

    def next_epoch(self, epoch: int) -> int:
        """The epoch the iteration after one of ``epoch`` is likely to read: ``epoch + 1``, or
        ``epoch`` again for a loop seen reading one epoch over and over (it never calls set_epoch)."""
        return epoch + self._step

    def start(
        self, place: IterPosition, plan: Callable[[], EpochPlan], make: MakeChain, release: Callable[[Any], None]
    ) -> None:
        """Make the first batch at ``place`` of the plan ``plan()`` makes, in a thread (an earlier
        one is dropped, its batches given to ``release``)."""
        self.drop(release)
        self._job = _Job(Made(place), plan, make)

    def take(self, place: IterPosition, release: Callable[[Any], None]) -> Made | None:
        """The batch made ahead for ``place``, its thread done; None, and the work dropped (its
        batches given to ``release``), when there is none for this place."""
        if self._last is not None:
            self._step = 0 if place.epoch == self._last else 1
        self._last = place.epoch
        job, self._job = self._job, None
        if job is None:
            return None
        job.thread.join()
        if job.made.place == place and job.made.error is None:
            self.taken += 1
            return job.made
        self._job = job
        self.drop(release)
        return None

    def drop(self, release: Callable[[Any], None]) -> None:
        """Wait for the thread (its batch under way), give its batches to ``release``, close its reader."""
        job, self._job = self._job, None
        if job is None:
            return
        job.thread.join()
        m = job.made
        for batch in m.made:
            release(batch)
        if m.made:
            self.dropped += 1
        m.made = []
        if m.reader is not None:
            m.reader.close()
