"""The image decoders of ``DecodeOptions(decoder="nvimgcodec")``, one per kind, tried in order.

Each is an :class:`ImageDecoder`: ``decode(encoded, regions, device)`` takes a batch's JPEGs
(1-D uint8 CPU tensors) and, per image, the region to decode ((left, top, right, bottom) pixels,
or None for the whole image), and returns per image a uint8 [3, h, w] RGB tensor of that region
on ``device``, or None where it could not decode that image (the next kind gets it). Its
``kind`` is what the epoch's counts call the images it decoded.

- :class:`NvImageCodecDecoder` (``"hardware"``, ``"cuda"``): nvImageCodec
  (``nvidia.nvimgcodec``, the ``gpu`` extra) with one backend: the GPU's hardware JPEG engines
  (NVJPG; they refuse some images, e.g. grayscale and CMYK), or CUDA kernels. Regions are
  decoded as such (``DecodeSource(..., region=Region(...))``); a decoder that returns nothing
  for a batch with regions is asked again without them, and, if it then decodes, is not given
  regions again (the images are cut on the device instead); one that decodes nothing of a few
  batches in a row is not asked again (:data:`IDLE_LIMIT`).
- :class:`PillowDecoder` (``"cpu"``): Pillow, then the copy: the last resort, and the CPU
  tests' stand-in for the others.

:func:`nvimgcodec_decoders` is the default chain: hardware, CUDA, CPU.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from shardify.errors import DeviceDecodeError
from shardify.reader.sample.decode import decode_image, pil_to_tensor

__all__ = ["Region", "ImageDecoder", "PillowDecoder", "NvImageCodecDecoder", "nvimgcodec_decoders", "KINDS"]

log = logging.getLogger("shardify.reader")

Region = tuple[int, int, int, int]
"""(left, top, right, bottom) pixels of an image, right and bottom excluded."""

KINDS = ("hardware", "cuda", "cpu")
"""The kinds of :func:`nvimgcodec_decoders`, in the order they are tried."""
IDLE_BATCH, IDLE_LIMIT = 8, 3
"""An nvImageCodec backend that decodes none of the images of ``IDLE_LIMIT`` batches in a row of at
least ``IDLE_BATCH`` images each (the workers keep the images it may refuse, such as grayscale) is
not asked again: a GPU without hardware JPEG engines would otherwise cost two calls a batch."""


class ImageDecoder(Protocol):
    """Decodes a batch's JPEGs (or the given region of each) on a device; see the module docstring."""

    kind: str

    def decode(
        self, encoded: Sequence[torch.Tensor], regions: Sequence[Region | None], device: torch.device
    ) -> list[torch.Tensor | None]: ...


def cut(image: torch.Tensor, region: Region | None) -> torch.Tensor:
    """``region`` of a uint8 [3, H, W] image (a view), or the image itself."""
    if region is None:
        return image
    left, top, right, bottom = region
    return image[:, top:bottom, left:right]


class PillowDecoder:
    """Pillow on the CPU, each image whole then cut to its region and moved to the device."""

    kind = "cpu"

    def decode(
        self, encoded: Sequence[torch.Tensor], regions: Sequence[Region | None], device: torch.device
    ) -> list[torch.Tensor | None]:
        out: list[torch.Tensor | None] = []
        for data, region in zip(encoded, regions):
            try:
                image = pil_to_tensor(decode_image(data.numpy().tobytes()))
            except Exception:  # noqa: BLE001 - not an image Pillow reads: the caller's bad sample
                out.append(None)
                continue
            out.append(cut(image, region).to(device))
        return out

    def __repr__(self) -> str:
        return "PillowDecoder()"


def _nvimgcodec() -> Any:
    """The ``nvidia.nvimgcodec`` module, or DeviceDecodeError saying how to install it."""
    try:
        from nvidia import nvimgcodec  # deferred: an optional dependency (the gpu extra)
    except ImportError as e:
        raise DeviceDecodeError(
            f'DecodeOptions(decoder="nvimgcodec") decodes with nvImageCodec, and nvidia.nvimgcodec cannot be '
            f"imported ({e}); install it with `pip install shardify[gpu]` (nvidia-nvimgcodec-cu12[nvjpeg]; "
            "nvidia-nvimgcodec-cu13[nvjpeg] for a torch built with CUDA 13), or leave decoder unset (torchvision)"
        ) from e
    return nvimgcodec


def _region_of(hwc: torch.Tensor, region: Region | None) -> torch.Tensor | None:
    """A decoded HWC image as the CHW pixels of ``region``: itself when it has the region's size,
    cut when it is larger (the whole image, however the backend treated the region), else None."""
    chw = hwc.permute(2, 0, 1)  # interleaved -> CHW, a view
    if region is None:
        return chw
    left, top, right, bottom = region
    h, w = chw.shape[-2:]
    if (h, w) == (bottom - top, right - left):
        return chw
    return cut(chw, region) if h >= bottom and w >= right else None


class NvImageCodecDecoder:
    """nvImageCodec with one backend (``kind``: ``"hardware"`` or ``"cuda"``) on ``device``;
    DeviceDecodeError when nvImageCodec is missing. Decodes on the caller's current CUDA stream."""

    def __init__(self, kind: str, device: torch.device) -> None:
        nv = _nvimgcodec()
        backends = {"hardware": nv.BackendKind.HW_GPU_ONLY, "cuda": nv.BackendKind.GPU_ONLY}
        if kind not in backends:
            raise ValueError(f"NvImageCodecDecoder: {kind=} should be one of {sorted(backends)}")
        self.kind, self.device = kind, device
        self._nv = nv
        cuda = device.type == "cuda"
        index = device.index if device.index is not None else (torch.cuda.current_device() if cuda else -1)
        # fancy_upsampling=1: chroma upsampled as libjpeg-turbo does by default (the CPU path's Pillow)
        self._decoder = nv.Decoder(device_id=index, backend_kinds=[backends[kind]], options=":fancy_upsampling=1")
        self._params = nv.DecodeParams(apply_exif_orientation=False, color_spec=nv.ColorSpec.RGB)
        self.regions = True  # cleared when this backend decodes whole images but not regions
        self.idle = 0  # batches of at least IDLE_BATCH images in a row of which it decoded none

    def _run(self, encoded: Sequence[torch.Tensor], regions: Sequence[Region | None]) -> list[Any]:
        nv = self._nv
        sources = []
        for data, region in zip(encoded, regions):
            if region is None or not self.regions:
                sources.append(nv.DecodeSource(data.numpy()))
            else:
                left, top, right, bottom = region
                sources.append(nv.DecodeSource(data.numpy(), region=nv.Region(top, left, bottom, right)))
        stream = torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else 0
        return list(self._decoder.decode(sources, params=self._params, cuda_stream=stream))

    def decode(
        self, encoded: Sequence[torch.Tensor], regions: Sequence[Region | None], device: torch.device
    ) -> list[torch.Tensor | None]:
        if self.idle >= IDLE_LIMIT:  # this GPU has no such backend, or it takes none of these images
            return [None] * len(encoded)
        images = self._run(encoded, regions)
        cropped = self.regions and any(r is not None for r in regions)
        if cropped and encoded and all(im is None for im in images):
            self.regions = False
            images = self._run(encoded, regions)
            if any(im is not None for im in images):
                log.info("nvImageCodec's %s backend decodes whole images, not regions: cutting them after", self.kind)
            else:
                self.regions = True  # nothing decodes at all: not a question of regions
        if len(encoded) >= IDLE_BATCH:
            self.idle = self.idle + 1 if all(im is None for im in images) else 0
            if self.idle == IDLE_LIMIT:
                log.warning(
                    "nvImageCodec's %s backend decoded no image of %d batches: not asked again", self.kind, IDLE_LIMIT
                )
        return [
            None if im is None else _region_of(torch.as_tensor(im, device=device), r) for im, r in zip(images, regions)
        ]

    def __repr__(self) -> str:
        return f"NvImageCodecDecoder({self.kind!r}, {str(self.device)!r})"


def nvimgcodec_decoders(device: torch.device) -> tuple[ImageDecoder, ...]:
    """The default chain on ``device``: nvImageCodec's hardware backend, its CUDA backend, Pillow;
    a backend nvImageCodec cannot make here (a GPU without hardware JPEG engines) is left out,
    with a warning. DeviceDecodeError without nvImageCodec."""
    _nvimgcodec()
    chain: list[ImageDecoder] = []
    for kind in ("hardware", "cuda"):
        try:
            chain.append(NvImageCodecDecoder(kind, device))
        except Exception as e:  # noqa: BLE001 - not on this GPU: the next kind decodes its images
            log.warning("nvImageCodec's %s backend cannot run on %s (%r): decoding without it", kind, device, e)
    return (*chain, PillowDecoder())
