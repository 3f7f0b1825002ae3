"""Where images are decoded, chosen once per dataset: a strategy that plugs in its pair of stages.

- :class:`CpuDecoding` (the default): each worker decodes and transforms a sample
  (:class:`~shardify.reader.sample.processor.SampleProcessor`, ``map=`` included) and collates a
  batch with ``collate_fn`` (default :func:`~shardify.reader.sample.collate.default_collate`);
  nothing runs on the device but the copy.
- :class:`DeviceDecoding` (``DecodeOptions(device=...)``): each worker only prepares a sample
  (:class:`~shardify.reader.sample.device_prep.PrepProcessor`: JPEG header, crop and flip
  draws; the images nvJPEG cannot take decoded there) and packs a batch
  (:func:`~shardify.reader.sample.device_prep.pack_samples`: one ``EncodedBatch`` per image
  column); make_loader's prefetcher then runs its device stage
  (:class:`~shardify.reader.sample.device_decode.DeviceDecoder`). The preps never leave the
  strategy's own stages: ``map=``, a custom ``collate_fn=`` and ``bucket_length=``, which would
  see undecoded images, are refused when the dataset is made
  (:class:`~shardify.errors.DeviceDecodeOptionsError`).

Both answer ``processors(streams, columns, options, epoch=...)`` (one per stream),
``collate(options, empty=...)`` (``empty``: the allocator of the batch tensors, the worker's
shared-memory slots under make_loader) and ``device_stage(device, ...)`` (None: nothing to
decode there).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch

from shardify.reader.sample.collate import Empty, default_collate, private_empty, with_allocator
from shardify.reader.sample.device_decode import DeviceDecoder, JpegDecoder
from shardify.reader.sample.device_prep import DevicePrep, PrepProcessor, checked_device, pack_samples
from shardify.reader.sample.processor import stream_processors

__all__ = ["CpuDecoding", "DeviceDecoding", "Decoding", "choose_decoding"]

Processor = Callable[[Any], Any]


class CpuDecoding:
    """Decode and transform in the workers, then ``collate_fn``; no device stage."""

    device: torch.device | None = None

    def processors(
        self, streams: Sequence[Any], columns: Sequence[tuple[str, ...]], options: Any, *, epoch: int
    ) -> list[Processor]:
        return list(stream_processors(streams, columns, options, epoch=epoch))

    def collate(self, options: Any, *, empty: Empty = private_empty) -> Callable[[list[Any]], Any]:
        """``collate_fn`` (default ``default_collate``), drawing from ``empty`` if it is one of shardify's."""
        collate_fn = options.batching.collate_fn
        chosen = default_collate if collate_fn is None else collate_fn
        return with_allocator(cast(Callable[[list[Any]], Any], chosen), empty)

    def device_stage(self, device: torch.device, **_: Any) -> None:
        return None

    def __repr__(self) -> str:
        return "CpuDecoding()"


class DeviceDecoding:
    """Prepare in the workers, decode on ``device``; see the module docstring.

    Made with the dataset's options and streams: raises what :func:`checked_device` raises, and
    DeviceDecodeOptionsError for a transform the device cannot run.
    """

    def __init__(self, device: str | torch.device, options: Any, streams: Sequence[Any]) -> None:
        self.device: torch.device | None = checked_device(device, options, streams)
        default = DevicePrep(options.transform) if options.transform is not None else None
        self._preps = [DevicePrep(s.transform) if s.transform is not None else default for s in streams]

    def processors(
        self, streams: Sequence[Any], columns: Sequence[tuple[str, ...]], options: Any, *, epoch: int
    ) -> list[Processor]:
        return [
            PrepProcessor(
                prep=cast(DevicePrep, prep),  # checked_device: each stream has a transform
                fields=fields,
                seed=options.seed,
                epoch=epoch,
                allow_pickle=options.decoding.allow_pickle,
                skip_errors=options.skip_errors,
                unique_keys=s.source.unique_keys,
            )
            for s, fields, prep in zip(streams, columns, self._preps)
        ]

    def collate(self, options: Any, *, empty: Empty = private_empty) -> Callable[[list[Any]], Any]:
        """The strategy's own packing (:func:`pack_samples`), drawing from ``empty``."""
        return functools.partial(pack_samples, empty=empty)

    def device_stage(
        self,
        device: torch.device,
        *,
        jpeg_decoder: JpegDecoder | None = None,
        report: Any = None,
        epoch: int = 0,
        skip: bool = False,
    ) -> DeviceDecoder:
        """The device side: decodes each batch's ``EncodedBatch`` es on ``device`` (the prefetcher's)."""
        return DeviceDecoder(device, jpeg_decoder=jpeg_decoder, report=report, epoch=epoch, skip=skip)

    def __repr__(self) -> str:
        return f"DeviceDecoding(device={str(self.device)!r})"


Decoding = CpuDecoding | DeviceDecoding


def choose_decoding(options: Any, streams: Sequence[Any]) -> Decoding:
    """The strategy for ``options.decoding.device`` (None: in the workers), checked against the options."""
    device = options.decoding.device
    return CpuDecoding() if device is None else DeviceDecoding(device, options, streams)
