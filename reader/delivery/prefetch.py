"""Device prefetch: the next batch is copied and normalised while the current one is in use.

On CUDA the copy runs on a side stream from pinned memory (``non_blocking=True``); before a
batch is handed out, the consumer's stream waits for the side stream, and every tensor is
``record_stream``-ed on the consumer's stream so the caching allocator does not reuse its
memory while work queued there may still read it. Image batches (uint8, ``N x C x H x W``
with ``C == len(mean)``) become ``dtype`` and are normalised on the device; other tensors
are only moved. Without CUDA the same code runs with no stream (tested on the CPU).

With ``decode``, an :class:`~shardify.reader.sample.device_plan.EncodedBatch` (from a dataset
with ``DecodeOptions(device=...)``) is decoded and augmented on the device by ``decode`` (a
:class:`~shardify.reader.sample.device_decode.DeviceDecoder`), on the same side stream and
one batch ahead, then normalised like any image batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from shardify.reader.sample.device_plan import EncodedBatch

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "DevicePrefetcher"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_END = object()


class DevicePrefetcher:
    """Iterate ``batches`` moved to ``device``, one batch ahead; see the module docstring."""

    def __init__(
        self,
        batches: Iterable[Any],
        *,
        device: str | torch.device,
        dtype: torch.dtype = torch.float32,
        normalize: bool = True,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        channels_last: bool = False,
        decode: Callable[[EncodedBatch], tuple[torch.Tensor, torch.Tensor | None]] | None = None,
    ) -> None:
        if not dtype.is_floating_point:
            raise ValueError(f"{dtype=} should be a floating point dtype")
        if len(mean) != len(std) or not mean or any(s <= 0 for s in std):
            raise ValueError(f"{mean=} and {std=} should have the same length, std > 0")
        self._batches = batches
        self.device = torch.device(device)
        self._dtype, self._normalize, self._channels_last = dtype, normalize, channels_last
        channels = len(mean)
        shape = (1, channels, 1, 1)
        # (x / 255 - mean) / std  ==  x * scale + shift, computed in float32
        std_t = torch.tensor(std, dtype=torch.float32)
        self._scale = (1.0 / (255.0 * std_t)).reshape(shape).to(self.device)
        self._shift = (-torch.tensor(mean, dtype=torch.float32) / std_t).reshape(shape).to(self.device)
        self._channels = channels
        self._cuda = self.device.type == "cuda"
        self._decode = decode
        self._rows: tuple[torch.Tensor, int] | None = None  # bad rows replaced by decode (skip policy)

    def _is_image(self, t: torch.Tensor) -> bool:
        return t.dtype == torch.uint8 and t.dim() == 4 and t.shape[1] == self._channels

    def _convert(self, t: torch.Tensor) -> torch.Tensor:
        t = t.to(self.device, non_blocking=True)
        if not self._is_image(t):
            return t
        if self._channels_last:
            t = t.contiguous(memory_format=torch.channels_last)
        x = t.to(torch.float32)
        if self._normalize:
            x = x.mul_(self._scale).add_(self._shift)
        else:
            x = x.div_(255.0)
        return x if self._dtype == torch.float32 else x.to(self._dtype)

    def _apply(self, obj: Any, fn: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return fn(obj)
        if isinstance(obj, EncodedBatch):
            if self._decode is None:
                raise ValueError("a batch planned for device decode reached a DevicePrefetcher without decode=...; "
                                 "iterate the dataset through make_loader")
            images, rows = self._decode(obj)
            if rows is not None:
                self._rows = (rows, len(obj.keys))
            return fn(images)
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return type(obj)(*(self._apply(x, fn) for x in obj))
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._apply(x, fn) for x in obj)
        if isinstance(obj, dict):
            return {k: self._apply(v, fn) for k, v in obj.items()}
        return obj

    def _preload(self, it: Iterator[Any], stream: Any) -> Any:
        batch = next(it, _END)
        if batch is _END:
            return _END
        if stream is None:
            return self._filled(self._apply(batch, self._convert))
        with torch.cuda.stream(stream):
            return self._filled(self._apply(batch, self._convert))

    def _filled(self, batch: Any) -> Any:
        """``batch`` with the rows of samples the device could not decode replaced (skip policy)."""
        if self._rows is None:
            return batch
        from shardify.reader.sample.device_decode import fill_rows

        (rows, n), self._rows = self._rows, None
        return fill_rows(batch, rows, n)

    def __iter__(self) -> Iterator[Any]:
        it = iter(self._batches)
        stream = torch.cuda.Stream(device=self.device) if self._cuda else None
        upcoming = self._preload(it, stream)
        while upcoming is not _END:
            batch = upcoming
            if stream is not None:
                current = torch.cuda.current_stream(self.device)
                current.wait_stream(stream)
                self._apply(batch, lambda t: t.record_stream(current))
            upcoming = self._preload(it, stream)
            yield batch
