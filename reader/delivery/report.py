"""The per-epoch report of skipped samples, shared between DataLoader workers and the trainer.

Workers are other processes, so each writes its counts and its first few (shard, key,
reason) entries into its own slot of shared-memory tensors created with the dataset; the
main process reads them after the epoch (``ShardedDataset.last_epoch_report``). Each worker
writes before it yields the batch the entry belongs to, so once the trainer has received
every batch of an epoch, the report is complete.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from shardify.reader.delivery.stats import StageTable, WorkerTimes

if TYPE_CHECKING:
    from shardify.reader.sample.bad import Bad

__all__ = ["EpochReport", "SharedReport", "MAX_WORKERS"]

log = logging.getLogger("shardify.reader")

MAX_WORKERS = 128
"""Most DataLoader workers a report can follow; one more slot is for reading in-process."""
_SLOTS = MAX_WORKERS + 2
_IN_PROCESS = MAX_WORKERS
_DEVICE = MAX_WORKERS + 1  # written by the main process's device decode (DecodeOptions.device)
_ENTRIES = 16
_ENTRY_BYTES = 320
_STAMP, _BAD, _LOST, _NUM, _CPU = range(5)


@dataclass(frozen=True)
class EpochReport:
    """What was skipped in one epoch on this rank.

    ``bad``: samples that failed to decode or transform; ``lost``: samples that could not be
    read from a damaged shard. Each was replaced by a good sample of the same batch, so
    ``padded == bad + lost`` and batch counts stay equal across ranks. ``entries`` holds the
    first few ``(shard, key, reason)`` of each worker (key None for a lost sample).
    ``cpu_decoded``: with ``DecodeOptions(device=...)``, images decoded on the CPU instead (not JPEGs
    nvJPEG takes, or refused by it); they are in the batches as usual. ``decoded_by``: with
    ``device``, the epoch's images by what decoded them, ``(kind, count)`` sorted by kind:
    ``hardware``, ``cuda``, ``cpu`` (the device stage's decoders), ``workers`` (images the device
    does not take), ``worker_share`` (the hybrid split's), ``bad``.
    """

    epoch: int
    bad: int = 0
    lost: int = 0
    entries: tuple[tuple[str, str | None, str], ...] = ()
    cpu_decoded: int = 0
    decoded_by: tuple[tuple[str, int], ...] = ()

    @property
    def padded(self) -> int:
        return self.bad + self.lost

    def __bool__(self) -> bool:
        return self.padded > 0

    def __str__(self) -> str:
        head = (
            f"epoch {self.epoch}: skipped {self.bad} bad samples and {self.lost} samples "
            f"of damaged shards (replaced by repeats of good samples of the same batch)"
        )
        if self.cpu_decoded:
            head += f"; {self.cpu_decoded} images decoded on the CPU instead of the device"
        if self.decoded_by:
            head += "; decoded by " + ", ".join(f"{kind} {n}" for kind, n in self.decoded_by)
        counts = Counter(self.entries)
        lines = [head]
        for (shard, key, reason), n in counts.items():
            where = reason if key is None else f"shard {shard}, key {key!r}: {reason}"
            lines.append(f"  {where}" + (_repeats(n, lost=key is None) if n > 1 else ""))
        return "\n".join(lines)


def _repeats(n: int, *, lost: bool) -> str:
    """What a repeated report line stands for: samples of a damaged shard, or one sample met again."""
    if lost:
        return (
            f" ({n} samples of this shard lost for this reason, of those counted above: each worker lists "
            f"its first {_ENTRIES})"
        )
    return f" ({n} times: the epoch reads this sample {n} times, repeated by samples_per_epoch, weights or padding)"


class SharedReport:
    """Shared-memory counters and entries, one slot per worker; create it in the main process."""

    def __init__(self) -> None:
        self._counts = torch.zeros(_SLOTS, 5, dtype=torch.int64).share_memory_()
        self._text = torch.zeros(_SLOTS, _ENTRIES, _ENTRY_BYTES, dtype=torch.uint8).share_memory_()
        self._workers = torch.zeros(1, dtype=torch.int64).share_memory_()
        self.stages = StageTable(_SLOTS)  # each process's stage seconds (the loader's stats())

    @staticmethod
    def slot(worker: int, workers: int, *, in_worker: bool) -> int:
        """The slot of worker ``worker`` (the in-process slot when not in a DataLoader worker)."""
        if not in_worker:
            return _IN_PROCESS
        if workers > MAX_WORKERS:
            raise ValueError(f"{workers=} should be <= {MAX_WORKERS} to report skipped samples")
        return worker

    def start(self, slot: int, *, epoch: int, workers: int) -> None:
        """Reset ``slot`` for ``epoch``; ``workers`` is 0 when reading in-process."""
        self._counts[slot] = 0
        self._counts[slot, _STAMP] = epoch + 1
        self._workers[0] = workers
        self.stages.start(slot, epoch=epoch)

    def begin(self, worker: int, workers: int, *, in_worker: bool, epoch: int) -> int:
        """The slot of this process's reading of ``epoch`` (see :meth:`slot`), reset for it."""
        slot = self.slot(worker, workers, in_worker=in_worker)
        self.start(slot, epoch=epoch, workers=workers if in_worker else 0)
        return slot

    def record(self, slot: int, *, shard: str, key: str | None, reason: str, lost: bool) -> None:
        """Count one skipped sample; keep its description while the slot has room."""
        self._counts[slot, _LOST if lost else _BAD] += 1
        n = int(self._counts[slot, _NUM])
        if n < _ENTRIES:
            text = f"{shard}\x1f{key if key is not None else ''}\x1f{reason}".encode("utf-8", "replace")
            text = text[:_ENTRY_BYTES]
            row = self._text[slot, n]
            row.zero_()
            row[: len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
            self._counts[slot, _NUM] = n + 1

    def record_bad(self, slot: int, bad: Bad) -> None:
        """Count the skipped sample ``bad`` (a worker's ``on_bad``, with its ``slot`` bound)."""
        self.record(slot, shard=bad.shard, key=bad.key, reason=bad.reason, lost=bad.lost)

    def start_device(self, epoch: int) -> None:
        """Reset the device decode's slot for ``epoch`` (the main process, as an iteration starts)."""
        self._counts[_DEVICE] = 0
        self._counts[_DEVICE, _STAMP] = epoch + 1

    def record_device(self, *, cpu: int = 0, shard: str = "", key: str | None = None, reason: str = "") -> None:
        """The device decode's counts: ``cpu`` images decoded on the CPU, or (with a reason) one bad sample."""
        self._counts[_DEVICE, _CPU] += cpu
        if reason:
            self.record(_DEVICE, shard=shard, key=key, reason=reason, lost=False)

    def warn(self, epoch: int) -> None:
        """Log the report of ``epoch`` as a warning, if anything was skipped."""
        report = self.read(epoch)
        if report:
            log.warning("%s", report)

    def stage_times(self, epoch: int) -> WorkerTimes:
        """The stage seconds of ``epoch`` summed over the slots of the last reading."""
        workers = int(self._workers[0])
        return self.stages.read([_IN_PROCESS] if workers == 0 else list(range(min(workers, MAX_WORKERS))), epoch=epoch)

    def read(self, epoch: int) -> EpochReport:
        """The report of ``epoch`` over the slots of the last reading (in-process or workers)."""
        workers = int(self._workers[0])
        slots = [_IN_PROCESS] if workers == 0 else list(range(min(workers, MAX_WORKERS)))
        slots.append(_DEVICE)
        bad = lost = cpu = 0
        entries: list[tuple[str, str | None, str]] = []
        for s in slots:
            if int(self._counts[s, _STAMP]) != epoch + 1:
                continue
            bad += int(self._counts[s, _BAD])
            lost += int(self._counts[s, _LOST])
            cpu += int(self._counts[s, _CPU])
            for i in range(int(self._counts[s, _NUM])):
                raw = bytes(self._text[s, i].numpy()).rstrip(b"\x00").decode("utf-8", "replace")
                shard, key, reason = (raw.split("\x1f", 2) + ["", ""])[:3]
                entries.append((shard, key or None, reason))
        return EpochReport(epoch=epoch, bad=bad, lost=lost, entries=tuple(entries), cpu_decoded=cpu)
