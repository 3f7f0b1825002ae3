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

- :class:`NvImageCodecDecoding` (``DecodeOptions(device=..., decoder="nvimgcodec")``): the
  same worker side; its device stage (:class:`~shardify.reader.sample.codec_decode.CodecDecoder`)
  decodes only each crop's region with nvImageCodec, hardware engines first, then CUDA, then
  Pillow, image by image, counting each by kind (``strategy.tally``).

With ``DecodeOptions(worker_share=...)`` the two device strategies split each batch: the workers
decode a share of the images the device could take (:mod:`~shardify.reader.sample.worker_share`),
fixed or set by a controller from the measured rates.

All answer ``processors(streams, columns, options, epoch=...)`` (one per stream),
``collate(options, empty=...)`` (``empty``: the allocator of the batch tensors, the worker's
shared-memory slots under make_loader) and ``device_stage(device, ...)`` (None: nothing to
decode there); the device ones also ``default_decoder()`` (what make_loader decodes with unless
given ``jpeg_decoder=``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch

from shardify.reader.sample.codec_decode import CodecDecoder, DecodeTally
from shardify.reader.sample.collate import Empty, default_collate, private_empty, with_allocator
from shardify.reader.sample.device_decode import DeviceDecoder, nvjpeg_decoder
from shardify.reader.sample.device_prep import DevicePrep, PrepProcessor, checked_device, pack_samples
from shardify.reader.sample.image_decoders import ImageDecoder, nvimgcodec_decoders
from shardify.reader.sample.processor import stream_processors
from shardify.reader.sample.worker_share import ShareController, SharedSplit, SplitStage

__all__ = ["CpuDecoding", "DeviceDecoding", "NvImageCodecDecoding", "Decoding", "choose_decoding", "AUTO_START"]

AUTO_START = 0.1
"""The share ``worker_share="auto"`` starts from (both sides are timed from the first batches)."""

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
        share = options.decoding.worker_share
        # made before any worker starts: fork workers inherit it, spawn workers get it by handle
        auto = share == "auto"
        self.split = None if share is None else SharedSplit(AUTO_START if auto else share, timed=auto)
        self.tally = DecodeTally()
        split = self.split
        default = DevicePrep(options.transform, split=split) if options.transform is not None else None
        self._preps = [DevicePrep(s.transform, split=split) if s.transform is not None else default for s in streams]

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
        jpeg_decoder: Any = None,
        report: Any = None,
        epoch: int = 0,
        skip: bool = False,
    ) -> Any:
        """The device side: decodes each batch's ``EncodedBatch`` es on ``device`` (the prefetcher's)
        with ``jpeg_decoder`` (a :data:`JpegDecoder`; default nvJPEG), a :class:`DeviceDecoder`
        (under the hybrid split, inside a :class:`SplitStage`)."""
        self.tally.start(epoch)
        stage = DeviceDecoder(device, jpeg_decoder=jpeg_decoder, report=report, epoch=epoch, skip=skip)
        return self._split_stage(stage)

    def _split_stage(self, stage: Any) -> Any:
        """``stage``, under the hybrid split (if any): counted, and timed for its controller (``"auto"``)."""
        if self.split is None:
            return stage
        controller = ShareController(self.split) if self.split.timed else None
        return SplitStage(stage, tally=self.tally, controller=controller)

    def default_decoder(self) -> Any:
        """nvJPEG through torchvision (DeviceDecodeError naming torchvision without it)."""
        return nvjpeg_decoder()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={str(self.device)!r})"


class NvImageCodecDecoding(DeviceDecoding):
    """:class:`DeviceDecoding`'s worker side; on the device, nvImageCodec (module docstring)."""

    def device_stage(
        self,
        device: torch.device,
        *,
        jpeg_decoder: Any = None,
        report: Any = None,
        epoch: int = 0,
        skip: bool = False,
    ) -> Any:
        """A :class:`CodecDecoder` with ``jpeg_decoder`` (one decoder, or several tried in order;
        default :func:`nvimgcodec_decoders`)."""
        if jpeg_decoder is None:
            decoders: Sequence[ImageDecoder] = nvimgcodec_decoders(device)
        elif isinstance(jpeg_decoder, Sequence):
            decoders = jpeg_decoder
        else:
            decoders = (jpeg_decoder,)
        for d in decoders:
            if not (hasattr(d, "kind") and callable(getattr(d, "decode", None))):
                raise TypeError(
                    f'DecodeOptions(decoder="nvimgcodec") takes image decoders (a kind and decode(encoded, regions, '
                    f"device), e.g. image_decoders.PillowDecoder()) as make_loader(jpeg_decoder=...), got {d!r}"
                )
        stage = CodecDecoder(device, decoders=decoders, report=report, epoch=epoch, skip=skip, tally=self.tally)
        return self._split_stage(stage)

    def default_decoder(self) -> Any:
        """:func:`nvimgcodec_decoders` on the strategy's device (DeviceDecodeError naming nvImageCodec without it)."""
        return nvimgcodec_decoders(cast(torch.device, self.device))


Decoding = CpuDecoding | DeviceDecoding | NvImageCodecDecoding


def choose_decoding(options: Any, streams: Sequence[Any]) -> Decoding:
    """The strategy for ``options.decoding`` (``device`` None: in the workers; else by ``decoder``),
    checked against the options."""
    decoding = options.decoding
    if decoding.device is None:
        return CpuDecoding()
    if decoding.decoder == "nvimgcodec":
        return NvImageCodecDecoding(decoding.device, options, streams)
    return DeviceDecoding(decoding.device, options, streams)
