"""Device decode, device side: an :class:`EncodedBatch` to a uint8 [B, 3, h, w] batch there.

1. The JPEGs' bytes go to the batch decoder in one call (``jpeg_decoder(list_of_uint8_cpu_tensors,
   device) -> list of uint8 [3, H, W]``; by default nvJPEG through
   ``torchvision.io.decode_jpeg(..., device="cuda")``, which fails the whole call when one image
   fails). When the call fails, each image is tried alone, and one that still fails is decoded
   on the CPU with Pillow (counted in the read report as decoded on the CPU). torchvision's
   CUDA decoder (read in its source, ``decode_jpegs_cuda.cpp``) uses nvJPEG's hardware backend
   where the GPU has one (A100, H100) for the baseline JPEGs of a batch, in one batched call,
   and the hybrid software decoder one image at a time otherwise; it decodes on a stream of
   its own and makes the caller's current stream (the prefetcher's side stream) wait for it.
2. :func:`~shardify.reader.sample.device_augment.augment_batch` crops, resizes and flips them.
3. The images the workers decoded themselves (pixels) take their rows.

An image no decoder can read is a bad sample: :class:`~shardify.errors.SampleError` naming the
shard and key, or under ``on_error="skip"`` its row (and the same row of every other column)
is replaced by a good row of the batch and counted, as the workers do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch

from shardify.errors import DeviceDecodeError, SampleError
from shardify.reader.sample.decode import decode_image, pil_to_tensor
from shardify.reader.sample.device_augment import MAX_CHUNK_BYTES, augment_batch
from shardify.reader.sample.prepared import EncodedBatch

__all__ = ["JpegDecoder", "nvjpeg_decoder", "pil_decoder", "DeviceDecoder", "encoded_images", "fill_rows", "assemble"]

JpegDecoder = Callable[[list[torch.Tensor], torch.device], list[torch.Tensor]]
"""``decoder(encoded, device)``: 1-D uint8 CPU tensors to uint8 [3, H, W] RGB tensors on ``device``."""


def nvjpeg_decoder() -> JpegDecoder:
    """torchvision's batched ``decode_jpeg`` (nvJPEG on CUDA); DeviceDecodeError without torchvision."""
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except ImportError as e:
        raise DeviceDecodeError(
            f"DecodeOptions(device=...) decodes with torchvision.io.decode_jpeg, "
            f"and torchvision cannot be imported ({e}); "
            "install it with `pip install shardify[gpu]` (a torchvision matching your torch), or pass "
            "make_loader(..., jpeg_decoder=...)"
        ) from e

    def decode(encoded: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        return cast(list[torch.Tensor], decode_jpeg(encoded, mode=ImageReadMode.RGB, device=device))

    return decode


def pil_decoder(encoded: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Pillow on the CPU, then moved: the CPU stand-in for nvJPEG (tests, machines without a GPU)."""
    return [pil_to_tensor(decode_image(t.numpy().tobytes())).to(device) for t in encoded]


def encoded_images(batch: EncodedBatch) -> tuple[list[int], list[torch.Tensor]]:
    """``(rows, encoded)``: the rows of ``batch`` that hold JPEG bytes (the others were decoded
    in the workers) and each one's bytes, a view of ``batch.data``."""
    offsets = batch.offsets.tolist()
    rows = [i for i in range(len(batch.keys)) if offsets[i + 1] > offsets[i]]
    return rows, [batch.data[offsets[i] : offsets[i + 1]] for i in rows]


def fill_rows(obj: Any, rows: torch.Tensor, batch: int) -> Any:
    """Every tensor or list of ``batch`` rows in ``obj`` with its rows taken in the order ``rows``."""
    if isinstance(obj, torch.Tensor):
        return obj[rows.to(obj.device)] if obj.dim() >= 1 and obj.shape[0] == batch else obj
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(fill_rows(x, rows, batch) for x in obj))
    if isinstance(obj, (list, tuple)):
        if isinstance(obj, list) and len(obj) == batch:
            return [obj[int(i)] for i in rows]
        return type(obj)(fill_rows(x, rows, batch) for x in obj)
    if isinstance(obj, dict):
        return {k: fill_rows(v, rows, batch) for k, v in obj.items()}
    return obj


class DeviceDecoder:
    """Decode and augment :class:`EncodedBatch` es on ``device``; see the module docstring.

    ``report``/``epoch``: where CPU-decoded and bad samples are counted (the dataset's
    :class:`~shardify.reader.delivery.report.SharedReport`); ``skip``: ``on_error="skip"``.
    """

    def __init__(
        self,
        device: str | torch.device,
        *,
        jpeg_decoder: JpegDecoder | None = None,
        report: Any = None,
        epoch: int = 0,
        skip: bool = False,
        max_chunk_bytes: int = MAX_CHUNK_BYTES,
    ) -> None:
        self.device = torch.device(device)
        self._decode = jpeg_decoder if jpeg_decoder is not None else nvjpeg_decoder()
        self._report, self._skip, self._chunk = report, skip, max_chunk_bytes
        if report is not None:
            report.start_device(epoch)

    def _decode_all(
        self, encoded: list[torch.Tensor], rows: Sequence[int], batch: EncodedBatch, bad: dict[int, str]
    ) -> list[torch.Tensor | None]:
        try:
            return list(self._decode(encoded, self.device))
        except Exception:  # noqa: BLE001 - one bad image fails the whole call: find it below
            pass
        out: list[torch.Tensor | None] = []
        for t, row in zip(encoded, rows):
            try:
                out.append(self._decode([t], self.device)[0])
                continue
            except Exception:  # noqa: BLE001 - not for this decoder: try the CPU
                pass
            try:
                out.append(pil_decoder([t], self.device)[0])
                self._count(cpu=1)
            except Exception as e:  # noqa: BLE001 - no decoder reads it: a bad sample
                bad[row] = f"{type(e).__name__}: {e}"
                out.append(None)
        return out

    def _count(self, *, cpu: int = 0, shard: str = "", key: str | None = None, reason: str = "") -> None:
        if self._report is not None:
            self._report.record_device(cpu=cpu, shard=shard, key=key, reason=reason)

    def __call__(self, batch: EncodedBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(images, rows)``: uint8 [B, 3, h, w] on the device, and None, or under the skip
        policy the row order that replaces bad rows: apply it to every column (:func:`fill_rows`),
        these images included."""
        n = len(batch.keys)
        h, w = batch.size
        rows, encoded = encoded_images(batch)
        bad: dict[int, str] = {}
        decoded = self._decode_all(encoded, rows, batch, bad) if rows else []
        out = torch.empty((n, 3, h, w), dtype=torch.uint8, device=self.device)
        good = [(r, im) for r, im in zip(rows, decoded) if im is not None]
        if good:
            idx = torch.tensor([r for r, _ in good])
            out[idx.to(self.device)] = augment_batch(
                [im for _, im in good],
                batch.boxes[idx],
                batch.bounds[idx],
                batch.flips[idx],
                (h, w),
                max_chunk_bytes=self._chunk,
            )
        return assemble(out, batch, bad, skip=self._skip, count=self._count)


def assemble(
    out: torch.Tensor, batch: EncodedBatch, bad: dict[int, str], *, skip: bool, count: Callable[..., None]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The device side's last step: ``out`` (the decoded rows filled) with the workers' pixels in
    their rows (those the device could not take counted as ``count(cpu=n)``), and the ``bad`` rows
    (row -> reason): a SampleError naming shard and key, or under ``skip`` each counted and the
    row order that replaces them by a neighbour (None when nothing is bad)."""
    n = len(batch.keys)
    if len(batch.pixel_rows):
        out[batch.pixel_rows.to(out.device)] = batch.pixels.to(out.device, non_blocking=True)
        if len(batch.pixel_rows) > batch.shared:
            count(cpu=len(batch.pixel_rows) - batch.shared)
    if not bad:
        return out, None
    for row, reason in bad.items():
        if not skip:
            raise SampleError(
                f"cannot decode image on {out.device} or the CPU: {reason}",
                shard=batch.shards[row],
                key=batch.keys[row],
            )
        count(shard=batch.shards[row], key=batch.keys[row], reason=reason)
    ok = [i for i in range(n) if i not in bad]
    if not ok:
        first = next(iter(bad))
        raise SampleError(
            f"every image of this batch failed to decode (first: {bad[first]})",
            shard=batch.shards[first],
            key=batch.keys[first],
        )
    order = torch.tensor([i if i not in bad else min(ok, key=lambda j: (abs(j - i), j)) for i in range(n)])
    return out, order
