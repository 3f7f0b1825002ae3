"""Device side of ``DecodeOptions(decoder="nvimgcodec")``: an :class:`EncodedBatch` to uint8 [B, 3, h, w].

1. Each JPEG's region is worked out before decoding (:func:`~shardify.reader.sample.device_augment.read_regions`:
   the pixels the resize can read, from the crop box the workers drew), so only that region is
   decoded.
2. The :class:`~shardify.reader.sample.image_decoders.ImageDecoder` s are tried in order (by
   default nvImageCodec's hardware backend, its CUDA backend, Pillow), each given the images the
   ones before it could not decode; a decoder whose call raises passes its whole share on. Each
   image is counted under the kind that decoded it (:class:`DecodeTally`); those Pillow
   decoded also in the read report's ``cpu_decoded``. An image none decodes is a bad sample
   (a SampleError naming shard and key, or skipped and counted under ``on_error="skip"``).
3. The batched crop, resize and flip (:func:`~shardify.reader.sample.device_augment.augment_batch`)
   on the regions, its products in float16 on CUDA (every pixel within 1 of float32), then the
   workers' pixels take their rows.

On CUDA all of it runs on a stream of its own, created with the lowest priority CUDA has (0,
which is also the default stream's: it never preempts the model; a training loop that runs its
model on a higher-priority stream has its kernels go first), ordered after the caller's stream
and before it again.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter, deque
from collections.abc import Sequence
from typing import Any

import torch

from shardify.reader.sample.device_augment import MAX_CHUNK_BYTES, augment_batch, read_regions
from shardify.reader.sample.device_decode import assemble, encoded_images
from shardify.reader.sample.image_decoders import ImageDecoder, Region
from shardify.reader.sample.prepared import EncodedBatch

__all__ = ["CodecDecoder", "DecodeTally", "LOWEST_PRIORITY", "crop_regions"]

log = logging.getLogger("shardify.reader")

LOWEST_PRIORITY = 0
"""CUDA's lowest stream priority (lower numbers go first; the default stream has 0 too)."""


class DecodeTally:
    """How the images of the epoch under way were decoded, by kind: ``hardware``, ``cuda``,
    ``cpu`` (the decoders' kinds), ``workers`` (images the device does not take, decoded by the
    workers), ``worker_share`` (decoded by the workers under the hybrid split), ``bad``. Written by
    the decode thread, read by the training loop (``read()``)."""

    def __init__(self) -> None:
        self.epoch = -1
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "_counts": Counter()}  # a worker's copy (spawn) counts nothing

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def start(self, epoch: int) -> None:
        with self._lock:
            self.epoch, self._counts = epoch, Counter()

    def add(self, kind: str, n: int = 1) -> None:
        if n:
            with self._lock:
                self._counts[kind] += n

    def read(self) -> dict[str, int]:
        """The counts so far (kinds with none left out)."""
        with self._lock:
            return dict(self._counts)


def crop_regions(boxes: torch.Tensor, bounds: torch.Tensor, size: tuple[int, int]) -> list[Region]:
    """Each image's region to decode for its crop (``boxes``, ``bounds``: float64 [B, 4]) resized
    to ``size``; the bounds lie inside the image (the box itself, or the whole image), so their
    extent stands for the image's size."""
    extent = [(math.ceil(b), math.ceil(r)) for r, b in bounds[:, 2:].tolist()]
    return read_regions(boxes, bounds, extent, size)


class CodecDecoder:
    """Decode :class:`EncodedBatch` es on ``device`` with ``decoders`` tried in order; see the module docstring.

    ``report``/``epoch``/``skip``: as :class:`~shardify.reader.sample.device_decode.DeviceDecoder`'s;
    ``tally``: where each image is counted by kind.
    """

    def __init__(
        self,
        device: str | torch.device,
        *,
        decoders: Sequence[ImageDecoder],
        report: Any = None,
        epoch: int = 0,
        skip: bool = False,
        tally: DecodeTally | None = None,
        max_chunk_bytes: int = MAX_CHUNK_BYTES,
    ) -> None:
        if not decoders:
            raise ValueError("CodecDecoder needs at least one decoder")
        self.device = torch.device(device)
        self.decoders = tuple(decoders)
        self._report, self._skip, self._chunk = report, skip, max_chunk_bytes
        self.tally = tally if tally is not None else DecodeTally()
        self.tally.start(epoch)
        cuda = self.device.type == "cuda"
        self._stream = torch.cuda.Stream(device=self.device, priority=LOWEST_PRIORITY) if cuda else None
        self._dtype = torch.float16 if cuda else torch.float32
        self._failed: set[str] = set()  # kinds whose call raised (logged once)
        self._alive: deque[tuple[Any, list[Any]]] = deque()  # (event, decoded images) until the event
        if report is not None:
            report.start_device(epoch)

    def _count(self, *, cpu: int = 0, shard: str = "", key: str | None = None, reason: str = "") -> None:
        self.tally.add("workers", cpu)
        if reason:
            self.tally.add("bad")
        if self._report is not None:
            self._report.record_device(cpu=cpu, shard=shard, key=key, reason=reason)

    def _decode_all(self, encoded: list[torch.Tensor], regions: list[Region | None]) -> list[torch.Tensor | None]:
        """Each image decoded by the first decoder that can, or None."""
        out: list[torch.Tensor | None] = [None] * len(encoded)
        todo = list(range(len(encoded)))
        for decoder in self.decoders:
            if not todo:
                break
            try:
                got = decoder.decode([encoded[i] for i in todo], [regions[i] for i in todo], self.device)
            except Exception as e:  # noqa: BLE001 - this kind cannot run this call: the next one takes it
                if decoder.kind not in self._failed:
                    self._failed.add(decoder.kind)
                    log.warning("%r failed on a batch (%r); its images go to the next decoder", decoder, e)
                got = [None] * len(todo)
            rest = [i for i, im in zip(todo, got) if im is None]
            for i, im in zip(todo, got):
                out[i] = im
            done = len(todo) - len(rest)
            self.tally.add(decoder.kind, done)
            if decoder.kind == "cpu" and self._report is not None:
                self._report.record_device(cpu=done)
            todo = rest
        return out

    def _run(self, batch: EncodedBatch) -> tuple[torch.Tensor, torch.Tensor | None, list[Any]]:
        """``(images, rows, decoded)``: ``decoded``, the decoders' own images, must outlive the work
        queued on them (a decoder may free its memory outside torch's allocator)."""
        n = len(batch.keys)
        h, w = batch.size
        rows, encoded = encoded_images(batch)
        out = torch.empty((n, 3, h, w), dtype=torch.uint8, device=self.device)
        bad: dict[int, str] = {}
        decoded: list[torch.Tensor | None] = []
        if rows:
            idx = torch.tensor(rows)
            boxes, bounds = batch.boxes[idx], batch.bounds[idx]
            regions = crop_regions(boxes, bounds, (h, w))
            decoded = self._decode_all(encoded, list(regions))
            good = [k for k, im in enumerate(decoded) if im is not None]
            kinds = ", ".join(d.kind for d in self.decoders)
            bad = {rows[k]: f"no decoder ({kinds}) could read it" for k, im in enumerate(decoded) if im is None}
            if good:
                shift = torch.tensor([[regions[k][0], regions[k][1]] * 2 for k in good], dtype=torch.float64)
                sel = torch.tensor(good)
                out[idx[sel].to(self.device)] = augment_batch(
                    [decoded[k] for k in good],  # type: ignore[misc]  # the good ones are tensors
                    boxes[sel] - shift,
                    bounds[sel] - shift,
                    batch.flips[idx[sel]],
                    (h, w),
                    max_chunk_bytes=self._chunk,
                    dtype=self._dtype,
                )
        return (*assemble(out, batch, bad, skip=self._skip, count=self._count), decoded)

    def __call__(self, batch: EncodedBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(images, rows)`` as :class:`~shardify.reader.sample.device_decode.DeviceDecoder` gives them."""
        if self._stream is None:
            return self._run(batch)[:2]
        caller = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(caller)
        with torch.cuda.stream(self._stream):
            out, order, decoded = self._run(batch)
        self._alive.append((self._stream.record_event(), decoded))
        while self._alive and self._alive[0][0].query():  # their kernels are done: let them go
            self._alive.popleft()
        caller.wait_stream(self._stream)
        out.record_stream(caller)
        return out, order

    def __repr__(self) -> str:
        return f"CodecDecoder({str(self.device)!r}, decoders={self.decoders!r})"
