"""Options of a conversion, in one typed dataclass, and the size parser for ``256MB``."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from shardify.suggest import suggest_keywords

__all__ = [
    "ConvertOptions",
    "parse_size",
    "worker_count",
    "check_chunk",
    "MAX_CHUNK",
    "DEFAULT_SHARD_SIZE",
    "DEFAULT_MAX_IMAGE_BYTES",
    "DEFAULT_SAMPLES_PER_SHARD",
    "MIN_SMALL_SHARD",
]

DEFAULT_SHARD_SIZE = 256 * 1000**2
"""Default shard size bound: 256 MB (ImageNet train gives ~550 shards: enough to spread
over ranks x workers, few enough to list and open cheaply)."""

DEFAULT_MAX_IMAGE_BYTES = 1 << 30
"""Default bound on an image file's size: 1 GiB (above any image under Pillow's default pixel
limit in a usual format; a larger file is reported as too large without being read)."""

DEFAULT_SAMPLES_PER_SHARD = 10_000
"""Default bound on samples per shard: a reader that starts in the middle of a shard scans
its tar headers first (two or three per sample), so small samples get shards of at most
10,000 (ImageNet's ~2,300 per 256 MB shard are unaffected)."""

MIN_SMALL_SHARD = 16 * 1000**2
"""Shards are never shrunk below this for ``min_shards`` (16 MB: still few files to list)."""

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*\Z")


def parse_size(text: str | int) -> int:
    """Bytes in ``text``: ``"256MB"``, ``"1.5GiB"``, ``"4096"`` (decimal and binary units)."""
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE_RE.match(text)
        unit = m.group(2).lower() if m else ""
        if not m or unit not in _UNITS:
            raise ValueError(f"size {text!r} should be a number with an optional unit (KB, MB, GB, MiB, ...)")
        value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"size {text!r} should be positive")
    return value


MAX_CHUNK = 1 << 20
"""Most samples a chunk may hold."""


def check_chunk(chunk: int | None) -> None:
    """Raise ValueError unless ``chunk`` is None or a sample count for the chunked layout."""
    if chunk is not None and (type(chunk) is not int or not 1 <= chunk <= MAX_CHUNK):
        raise ValueError(f"chunk={chunk!r} should be None or an int in 1..{MAX_CHUNK} (samples per chunk)")


def worker_count(workers: int) -> int:
    """``workers``, or one per core this process may use when 0."""
    if workers:
        return workers
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


@suggest_keywords
@dataclass(frozen=True, kw_only=True)
class ConvertOptions:
    """How to convert. Only the fields in :meth:`shaping` change the bytes written."""

    split: str = "train"
    shard_size: int | None = DEFAULT_SHARD_SIZE
    samples_per_shard: int | None = DEFAULT_SAMPLES_PER_SHARD
    min_shards: int = 32
    """A dataset that would make fewer shards than this gets smaller ones (down to 16 MB),
    so that a small dataset is still written by every core and read by many workers. It
    depends on the data only, never on ``workers``: the output stays the same everywhere."""
    shuffle: bool = True
    seed: int = 0
    check: Literal["header", "full"] = "header"
    max_side: int | None = None
    quality: int = 90
    max_pixels: int | None = None
    max_image_bytes: int | None = DEFAULT_MAX_IMAGE_BYTES
    follow_symlinks: bool = True
    num_classes: int | None = None
    strict: bool = False
    overwrite: bool = False
    workers: int = 0
    fsync: bool = True
    progress: bool = True
    engine: Literal["local", "ray"] = "local"
    ray_address: str | None = None
    image_format: Literal["keep", "jpg", "png"] = "keep"
    """``keep`` each image's own format, or store every image as ``jpg`` (non-JPEGs re-encoded
    at ``quality``) or ``png`` (lossless), so all samples have the same image field."""
    raw_pixels: int | None = None
    """Store every image pre-decoded (:mod:`shardify.pixels`): 8-bit RGB pixels as a ``ppm``
    member, resized so that its ``raw_side`` side is at most this many pixels (never enlarged);
    the reader then crops without decoding. None: images are stored encoded."""
    raw_side: Literal["shorter", "longer"] = "shorter"
    """Which side ``raw_pixels`` bounds: ``shorter`` (as torchvision's ``Resize(S)``) or ``longer``."""
    allow_empty: bool = False
    """Finish a split even when no sample was written (every input skipped); else an error."""
    metadata: Literal["auto", "always"] = "auto"
    """``{key}.json`` per sample: ``auto`` only when it holds something the key, the members
    and the split index do not (a rewritten name, a file path, a label name not in the
    classes); ``always`` for every sample."""
    chunk: int | None = None
    """Samples per chunk: the chunked layout (docs/format.md), for small samples; None: one
    tar sample per sample (what webdataset and Hugging Face read)."""
    storage_options: Mapping[str, Any] | None = None
    """Options of the fsspec backend of a URL output (``s3://``: ``key``, ``secret``,
    ``endpoint_url``, ...); default: the backend's usual places (environment, config files)."""

    def __post_init__(self) -> None:
        if self.shard_size is None and self.samples_per_shard is None:
            raise ValueError("one of shard_size and samples_per_shard should be set")
        if self.shard_size is not None and self.shard_size < 4096:
            raise ValueError(f"shard_size={self.shard_size} should be at least 4096 bytes")
        if self.min_shards < 1:
            raise ValueError(f"min_shards={self.min_shards} should be >= 1 (1: never shrink shards)")
        if self.samples_per_shard is not None and self.samples_per_shard < 1:
            raise ValueError(f"samples_per_shard={self.samples_per_shard} should be >= 1")
        if self.check not in ("header", "full"):
            raise ValueError(f"check={self.check!r} should be 'header' or 'full'")
        if self.max_side is not None and self.max_side < 8:
            raise ValueError(f"max_side={self.max_side} should be >= 8")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality={self.quality} should be in 1..100")
        if self.workers < 0:
            raise ValueError(f"workers={self.workers} should be >= 0 (0: one per core)")
        if self.engine not in ("local", "ray"):
            raise ValueError(f"engine={self.engine!r} should be 'local' or 'ray'")
        if self.max_image_bytes is not None and self.max_image_bytes < 1:
            raise ValueError(f"max_image_bytes={self.max_image_bytes} should be >= 1 (None: no limit)")
        if self.image_format not in ("keep", "jpg", "png"):
            raise ValueError(f"image_format={self.image_format!r} should be 'keep', 'jpg' or 'png'")
        if self.raw_pixels is not None:
            if type(self.raw_pixels) is not int or self.raw_pixels < 8:
                raise ValueError(f"raw_pixels={self.raw_pixels!r} should be an int >= 8 (pixels)")
            if self.max_side is not None or self.image_format != "keep":
                raise ValueError(
                    f"raw_pixels={self.raw_pixels} stores decoded pixels: it cannot be combined with "
                    f"max_side={self.max_side!r} or image_format={self.image_format!r}"
                )
        if self.raw_side not in ("shorter", "longer"):
            raise ValueError(f"raw_side={self.raw_side!r} should be 'shorter' or 'longer'")
        if self.metadata not in ("auto", "always"):
            raise ValueError(f"metadata={self.metadata!r} should be 'auto' or 'always'")
        check_chunk(self.chunk)
        if self.num_classes is not None and self.num_classes < 1:
            raise ValueError(f"num_classes={self.num_classes} should be >= 1")

    @property
    def num_workers(self) -> int:
        """Worker processes to use: ``workers``, or one per available core when 0."""
        return worker_count(self.workers)

    def shard_bound(self, payload_bytes: int) -> int | None:
        """The byte bound of a shard for a dataset of about ``payload_bytes``: ``shard_size``,
        or less so that it makes ``min_shards`` shards, never below 16 MB (or ``shard_size``)."""
        if self.shard_size is None:
            return None
        even = -(-payload_bytes // self.min_shards)
        return max(min(self.shard_size, even), min(self.shard_size, MIN_SMALL_SHARD))

    def shaping(self) -> dict[str, Any]:
        """The options that decide the output bytes; recorded in the split index."""
        return {
            "split": self.split,
            "shard_size": self.shard_size,
            "samples_per_shard": self.samples_per_shard,
            "min_shards": self.min_shards,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "check": self.check,
            "max_side": self.max_side,
            "quality": self.quality if self.max_side is not None or self.image_format == "jpg" else None,
            "image_format": self.image_format,
            "max_pixels": self.max_pixels,
            "max_image_bytes": self.max_image_bytes,
            "follow_symlinks": self.follow_symlinks,
            "num_classes": self.num_classes,
            "metadata": self.metadata,
            **({"raw_pixels": self.raw_pixels, "raw_side": self.raw_side} if self.raw_pixels is not None else {}),
            **({} if self.chunk is None else {"chunk": self.chunk}),
        }
