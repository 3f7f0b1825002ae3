"""``make_loader``: a DataLoader over a ShardedDataset, device prefetch, and exact resume.

The loader counts the batches it has handed to the training loop in the current epoch.
``state_dict()`` saves that count with the epoch and the topology (see
:mod:`shardify.reader.delivery.state`); ``load_state_dict()`` tells the dataset to resume
there, and each worker works out from the deterministic plan which of its batches the
trainer already had and skips their samples without reading or decoding them. The resumed
run yields exactly the remaining batches: same samples, order and augmentation. Under
another world size or worker count, the rest of the epoch is planned anew (every sample not
yet consumed once over all ranks).

Worker processes end with the loader: ``close()`` (or ``with make_loader(...) as loader``, or
dropping the loader) stops persistent workers; an iteration left early stops its own workers
when it is closed. A worker that dies (killed, out of memory) raises :class:`WorkerError`
(or torch's own ``RuntimeError``, when it dies while the loop runs its own code); either way
``loader.load_state_dict(loader.state_dict())`` then a new iteration starts new workers and
resumes exactly.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader

from shardify.errors import ShardifyError, WorkerError
from shardify.reader.dataset import ShardedDataset
from shardify.reader.delivery import batchpool
from shardify.reader.delivery.batchpool import BatchChannel, unpack
from shardify.reader.delivery.diagnosis import LoaderStats, diagnose, loader_context
from shardify.reader.delivery.place import require_state
from shardify.reader.delivery.prefetch import IMAGENET_MEAN, IMAGENET_STD, DevicePrefetcher, resolve_device
from shardify.reader.delivery.state import STATE_VERSION, epoch_batches, load_state, make_state
from shardify.reader.delivery.stats import LoaderMeter
from shardify.reader.delivery.workers import fork_frozen, how_died, release_frames, stop_workers
from shardify.reader.plan.resume import Segment
from shardify.reader.plan.world import detect_rank_world
from shardify.suggest import suggest_keywords

__all__ = ["Loader", "make_loader", "STATE_VERSION"]

log = logging.getLogger("shardify.reader")


def _identity(batch: Any) -> Any:
    return batch


class Loader:
    """Iterates a :class:`ShardedDataset` through ``dataloader`` (and ``prefetch``, if any).

    ``close()`` stops the worker processes (also on leaving a ``with`` block, or when the
    loader is garbage-collected); iterating again starts new ones.
    """

    def __init__(
        self,
        dataset: ShardedDataset,
        dataloader: DataLoader[Any],
        *,
        prefetch: dict[str, Any] | None,
        recycle_batches: bool = True,
        progress: bool = False,
        epoch_ahead: bool = True,
    ) -> None:
        self.dataset = dataset
        self._ahead = epoch_ahead
        self.dataloader = dataloader
        self._prefetch = prefetch
        self._recycle = recycle_batches and dataloader.num_workers > 0
        self._channels: weakref.WeakKeyDictionary[Any, BatchChannel] = weakref.WeakKeyDictionary()
        self._epoch = -1
        self._batches = 0
        self._resume_started = False
        self._history: tuple[Segment, ...] = ()
        self._live: Any = None  # the DataLoader iterator of the iteration under way
        self._iteration: weakref.ref[Any] | None = None  # the generator of the last iteration (see _end_iteration)
        self._meter = LoaderMeter(progress=progress)  # the epoch's waits and stages: stats()

    def __len__(self) -> int:
        return len(self.dataset)

    def close(self) -> None:
        """Stop every worker process of this loader now (persistent ones too)."""
        self._end_iteration()
        for workers in (self._live, getattr(self.dataloader, "_iterator", None)):
            if workers is not None:
                self._shut_down(workers)
        self._live = None

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit, torch's own finaliser takes over
            pass

    def _end_iteration(self) -> None:
        """Close the generator of the last iteration if it is still suspended (a loop that kept its
        iterator, or stopped by an error raised in its own body): its clean-up runs now, not at
        interpreter shutdown, when the modules it needs are gone ("Exception ignored in ... _run")."""
        gen = self._iteration() if self._iteration is not None else None
        self._iteration = None
        if gen is not None:
            gen.close()

    def __iter__(self) -> Iterator[Any]:
        self._end_iteration()
        ds = self.dataset
        if self._resume_started:  # an earlier iteration began from the resume point already
            ds.clear_resume()
            self._resume_started = False
        point = ds.resume_point
        self._epoch = ds.epoch
        self._batches = point[1] if point is not None and point[0] == self._epoch else 0
        self._history = ds.resume_history if point is not None and point[0] == self._epoch else ()
        self._resume_started = point is not None
        gen = self._run()
        self._iteration = weakref.ref(gen)
        return gen

    def _start(self) -> Any:
        """``iter(dataloader)``; new worker processes get a new batch channel (see batchpool).

        Persistent workers are reused, unless one of them died: that happens unseen when it dies
        while the training loop runs its own code (torch's SIGCHLD handler raises there, not
        here), and torch would wait on the dead worker again. Then the set is stopped and a new
        one started, so ``load_state_dict(state_dict())`` and a new iteration resume exactly.
        """
        running = getattr(self.dataloader, "_iterator", None)
        if running is not None and how_died(running) is not None:
            log.warning("DataLoader %s; starting new workers", how_died(running))
            self._shut_down(running)
        # New persistent workers make each next epoch's first batch ahead (delivery/ahead.py)
        self.dataset.epoch_ahead.enabled = self._ahead and self.dataloader.persistent_workers
        try:
            return self._fork()
        finally:
            self.dataset.epoch_ahead.enabled = False  # the workers took their copy

    def _fork(self) -> Any:
        if not self._recycle or getattr(self.dataloader, "_iterator", None) is not None:
            return fork_frozen(self.dataloader)  # persistent workers already running keep theirs
        # Enough slots for the batches prefetched, the one in use, one kept and the one being made;
        # a loop that keeps more gets fresh memory for the rest.
        slots = min(batchpool.MAX_SLOTS, (self.dataloader.prefetch_factor or 2) + 3)
        channel = BatchChannel(self.dataloader.num_workers, max_slots=slots)
        channel.clock = self._meter.main
        channel.register()
        try:
            with self.dataset.batch_slots.attached(channel):  # the workers take it with their copy
                workers = fork_frozen(self.dataloader)
        except BaseException:
            channel.close()
            raise
        self._channels[workers] = channel
        weakref.finalize(workers, channel.close)
        return workers

    def _run(self) -> Iterator[Any]:
        clock = self._meter.begin(self._epoch, batch_size=self.dataset.options.batch_size)  # worker start included
        workers = self._start()  # workers read the epoch and resume point from here
        self._live = workers
        batches: Iterator[Any] | None  # (None once an error drops it: the traceback keeps this frame)
        batches = map(unpack, workers) if self._recycle else workers
        batches = self._meter.workers(clock, batches)
        if self._prefetch is not None:
            options = dict(self._prefetch)
            decode = self.dataset.decode_strategy.device_stage(  # the strategy's device side, if it has one
                resolve_device(self._prefetch["device"]),
                jpeg_decoder=options.pop("jpeg_decoder", None),
                report=self.dataset.shared_report,
                epoch=self._epoch,
                skip=self.dataset.options.skip_errors,
            )
            if decode is not None:
                options["decode"] = decode
            batches = iter(DevicePrefetcher(batches, clock=self._meter.main, **options))
        batches = self._meter.loop(clock, batches, total=len(self) - self._batches)
        batch = None
        asked = time.monotonic()  # when the loop last asked for a batch (a wait past timeout= is the timeout)
        try:
            for batch in batches:
                self._batches += 1
                yield batch
                asked = time.monotonic()
        except Exception as e:
            died = None if isinstance(e, ShardifyError) else how_died(workers)
            timeout = self.dataloader.timeout
            waited = time.monotonic() - asked
            if died is None and timeout and isinstance(e, RuntimeError) and waited >= timeout:
                died = (
                    f"workers made no batch in {timeout:g} s (timeout=): one may hang, e.g. in a transform "
                    f"or map= that never returns"
                )
            self._shut_down(workers)
            if hasattr(workers, "_workers"):
                release_frames(e)
            workers = batches = batch = None  # this frame stays in the traceback too
            if died is not None:
                raise WorkerError(
                    f"DataLoader {died} in epoch {self._epoch} after {self._batches} batches; the loader "
                    f"stopped its workers. To go on from there: loader.load_state_dict(loader.state_dict()) "
                    f"and iterate again ({e})"
                ) from e
            raise
        finally:
            close = getattr(batches, "close", None)
            if close is not None:  # the device prefetcher: its decode thread ends before the workers
                close()
            # Left early (break), or failed: non-persistent workers stop now, not at garbage collection.
            if workers is not None and workers is not getattr(self.dataloader, "_iterator", None):
                self._shut_down(workers)
            if self._live is workers or workers is None:
                self._live = None
        self.dataset.clear_resume()
        self._resume_started = False
        report = self.dataset.last_epoch_report
        if report and self.dataloader.num_workers > 0:  # in-process, the dataset logged it already
            log.warning("%s", report)

    def _shut_down(self, workers: Any) -> None:
        """After an error, stop the workers now (not at garbage collection) and start afresh next time."""
        stop_workers(workers)
        channel = self._channels.pop(workers, None)
        if channel is not None:
            channel.close()
        if getattr(self.dataloader, "_iterator", None) is workers:
            self.dataloader._iterator = None

    def stats(self) -> LoaderStats:
        """The epoch under way so far, else the last one iterated: waits, rates, stage seconds and
        the bottleneck (:mod:`shardify.reader.delivery.diagnosis`; ``.as_dict()`` for loggers)."""
        device = str(self._prefetch["device"]) if self._prefetch is not None else None
        return diagnose(
            self._meter, self.dataset, loader_context(self.dataset, workers=self.dataloader.num_workers, device=device)
        )

    def state_dict(self) -> dict[str, Any]:
        """Where the epoch stands (see :mod:`shardify.reader.delivery.state`): small, versioned."""
        ds = self.dataset
        if self._epoch == ds.epoch:
            batches, history = self._batches, self._history
        else:
            point = ds.resume_point
            batches = point[1] if point is not None and point[0] == ds.epoch else 0
            history = ds.resume_history if point is not None and point[0] == ds.epoch else ()
        return make_state(
            ds.resume_basis,
            epoch=ds.epoch,
            batches=batches,
            history=history,
            world=detect_rank_world()[1],
            workers=max(1, self.dataloader.num_workers),
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state``: the next iteration yields the rest of the saved epoch.

        Same world and workers: exactly the batches the saved run had left. Another topology:
        every sample the saved run had not consumed, once over all ranks, in new batches.
        Anything but a state (None, a list, a string) is refused with ResumeError, changing nothing.
        """
        require_state(state, owner="loader")
        self._end_iteration()
        ds = self.dataset
        epoch, batches, history = load_state(
            ds.resume_basis, state, world=detect_rank_world()[1], workers=max(1, self.dataloader.num_workers)
        )
        ds.resume_at(epoch, batches, history=history)
        if batches and batches == epoch_batches(ds.resume_basis, epoch, history=history, world=detect_rank_world()[1]):
            # Saved after the epoch's last batch (Lightning checkpoints there, before the loader
            # ends): the next iteration is the next epoch's, unless set_epoch(epoch) asks for the
            # (empty) rest of this one, which the resume point above still holds.
            ds.resume_after_end(epoch)
        self._epoch, self._batches, self._resume_started = -1, 0, False


@suggest_keywords
def make_loader(
    dataset: ShardedDataset,
    *,
    num_workers: int = 0,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    normalize: bool = True,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    channels_last: bool = False,
    persistent_workers: bool | None = None,
    prefetch_factor: int | None = None,
    multiprocessing_context: Any = None,
    recycle_batches: bool = True,
    jpeg_decoder: Any = None,
    timeout: float = 0,
    progress: bool = False,
    epoch_ahead: bool = True,
) -> Loader:
    """A :class:`Loader` of ``dataset``: batches made in ``num_workers`` worker processes.

    ``device``: None yields the collated batches as they are; otherwise batches are moved
    there one ahead (pinned memory and a side stream on CUDA) and uint8 image batches become
    ``dtype``, normalised with ``mean``/``std`` (ImageNet's by default; ``normalize=False``
    only scales to 0..1), optionally channels_last. Workers are persistent by default.
    ``recycle_batches``: batch tensors made by the collate functions of
    :mod:`shardify.reader.sample.collate` reach this process through shared-memory slots that each
    worker reuses once the training loop has dropped the batch (:mod:`shardify.reader.delivery.batchpool`);
    False sends a fresh shared-memory tensor per batch, as torch does.

    ``timeout``: seconds to wait for a batch from the workers (0: forever, as torch's
    DataLoader); past it the loader stops them and raises :class:`WorkerError`, and
    ``load_state_dict(state_dict())`` then a new iteration resumes exactly. Set it above the
    slowest batch (the first one of an epoch included).

    ``epoch_ahead``: persistent workers that have made their last batch of an epoch make their first
    batch of the next one (``epoch + 1`` from its start) while the epoch ends, so the next epoch's
    first batches are waiting for it; ``set_epoch`` to another epoch, or a resume, drops that work
    (:mod:`shardify.reader.delivery.ahead`).

    ``progress``: one bar per epoch on stderr (when it is a terminal) with samples/s and the share
    of time the loop waits for data; ``loader.stats()`` gives the figures (docs/bottleneck.md).

    A dataset made with ``DecodeOptions(device=...)`` is decoded there (``device`` defaults to it and must
    be it): ``jpeg_decoder`` (default: the strategy's, nvJPEG through torchvision or, with
    ``decoder="nvimgcodec"``, nvImageCodec's chain; see :mod:`shardify.reader.sample.decoders`)
    decodes each batch's JPEGs.
    """
    if not isinstance(dataset, ShardedDataset):
        raise TypeError(f"make_loader wants a ShardedDataset, got {type(dataset).__name__}")
    if num_workers < 0:
        raise ValueError(f"{num_workers=} should be >= 0")
    if timeout < 0 or (timeout and num_workers == 0):
        raise ValueError(f"{timeout=} should be >= 0, and 0 without worker processes ({num_workers=})")
    if dataset.decode_device is not None:
        if device is not None and torch.device(device).type != dataset.decode_device.type:
            raise ValueError(f"{device=} but the dataset decodes on device={str(dataset.decode_device)!r}")
        device = dataset.decode_device
        if jpeg_decoder is None:  # the strategy's own (nvJPEG, nvImageCodec): fails now, naming what is missing
            jpeg_decoder = dataset.decode_strategy.default_decoder()  # type: ignore[union-attr]
    target = torch.device(device) if device is not None else None
    if target is not None and target.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{device=} but CUDA is not available here")
    workers_options: dict[str, Any] = {}
    if num_workers > 0:
        workers_options = {
            "persistent_workers": True if persistent_workers is None else persistent_workers,
            "prefetch_factor": 2 if prefetch_factor is None else prefetch_factor,
            "multiprocessing_context": multiprocessing_context,
            "timeout": timeout,
        }
    pin = target is not None and target.type == "cuda"
    dataloader = DataLoader(
        dataset, batch_size=None, num_workers=num_workers, collate_fn=_identity, pin_memory=pin, **workers_options
    )
    prefetch = None
    if target is not None:
        prefetch = {
            "device": target,
            "dtype": dtype,
            "normalize": normalize,
            "mean": tuple(mean),
            "std": tuple(std),
            "channels_last": channels_last,
            "jpeg_decoder": jpeg_decoder,
        }
    return Loader(
        dataset,
        dataloader,
        prefetch=prefetch,
        recycle_batches=recycle_batches,
        progress=progress,
        epoch_ahead=epoch_ahead,
    )
