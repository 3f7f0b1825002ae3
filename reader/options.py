"""The options of a ``ShardedDataset``: a few small frozen groups, and ``ReadOptions``, which holds them.

What a user passes most stays a keyword of :class:`~shardify.reader.ShardedDataset` itself
(``split``, ``batch_size``, ``shuffle``, ``seed``, ``transform``, ``fields``, ``map``); the rest
comes in four groups named by what they are for::

    ShardedDataset(path, split="train", batch_size=256, shuffle=True,
                   batching=BatchOptions(drop_last=True), sampling=SamplingOptions(shuffle_buffer=4096),
                   decoding=DecodeOptions(on_error="skip"),
                   cache=CacheOptions(dir="/local/ssd/cache", limit_bytes=200 * 10**9))

``batching`` (:class:`BatchOptions`): how samples become batches, the last partial one
included; ``sampling`` (:class:`SamplingOptions`): which samples an epoch holds and in what
order (with ``batch_size``, ``seed`` and the data, what an epoch's plan is a function of);
``decoding`` (:class:`DecodeOptions`): how members are checked and decoded, and what a bad one
does; ``cache`` (:class:`CacheOptions`): how remote shards are fetched.

Each group checks its own values, and only there. :class:`ReadOptions` is what the dataset
keeps and its workers receive: the dataset's direct keywords (checked there) and the four
groups as they were given (``options.sampling.shuffle_buffer``), each option stored once.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from shardify.reader.io.checksums import ChecksumSpec
from shardify.remote import RetryPolicy
from shardify.suggest import suggest_keywords
from shardify.tario import DEFAULT_MAX_MEMBER

__all__ = [
    "ReadOptions",
    "BatchOptions",
    "SamplingOptions",
    "DecodeOptions",
    "CacheOptions",
    "GROUPS",
    "with_defaults",
]


@suggest_keywords
@dataclass(frozen=True)
class BatchOptions:
    """How samples become batches: ``collate_fn`` (default: ``default_collate``); with
    ``bucket_length(output) -> int``, batches of samples of similar length, grouped within
    ``bucket_buffer`` samples (default: 16 batches; a resume then needs the same topology).
    ``drop_last``: each rank drops the samples of its last partial batch (else the ranks' last
    batches are evened out with a few repeated samples, see ``SamplingOptions.mark_repeats``)."""

    collate_fn: Callable[[list[Any]], Any] | None = None
    bucket_length: Callable[[Any], int] | None = None
    bucket_buffer: int | None = None
    drop_last: bool = False

    def __post_init__(self) -> None:
        if self.bucket_buffer is not None and self.bucket_buffer < 1:
            raise ValueError(f"BatchOptions: bucket_buffer={self.bucket_buffer} should be >= 1")


@suggest_keywords
@dataclass(frozen=True)
class SamplingOptions:
    """Which samples an epoch holds and in what order. ``samples_per_epoch`` over all ranks
    (default: every sample of every stream once; fewer: a new subset each epoch, more:
    oversampling); ``mark_repeats``: the ``__valid__`` field, False for the few samples repeated
    so every rank yields as many batches (only without ``drop_last``), for exact evaluation.
    How ``shuffle=True`` mixes: ``shuffle_buffer`` encoded samples per worker, visited in random
    blocks of ``shuffle_block`` samples; the epoch's sequence is cut into blocks of
    ``shuffle_block`` samples too, each read with one seek (larger: longer runs per seek, less
    mixing)."""

    samples_per_epoch: int | None = None
    mark_repeats: bool = False
    shuffle_buffer: int = 1024
    shuffle_block: int = 4

    def __post_init__(self) -> None:
        if self.samples_per_epoch is not None and self.samples_per_epoch < 0:
            raise ValueError(f"SamplingOptions: samples_per_epoch={self.samples_per_epoch} should be >= 0")
        if self.shuffle_buffer < 1 or self.shuffle_block < 1:
            raise ValueError(
                f"SamplingOptions: shuffle_buffer={self.shuffle_buffer} and shuffle_block={self.shuffle_block} "
                "should be >= 1"
            )


@suggest_keywords
@dataclass(frozen=True)
class DecodeOptions:
    """How members are checked and decoded, and what a bad one does: pickle fields only with
    ``allow_pickle``; a shard holding a member over ``max_member_bytes`` (default 2 GiB) is
    damaged. ``device``: where images are decoded; None (default) in the workers, ``"cuda"`` on
    the GPU, the workers only drawing each image's crop and flip (see
    :mod:`shardify.reader.sample.decoders`), with ``decoder``: ``"torchvision"`` (default,
    nvJPEG through ``torchvision.io.decode_jpeg``) or ``"nvimgcodec"`` (nvImageCodec: the GPU's
    hardware JPEG engines, then CUDA, then the CPU, image by image; only the crop's region).
    ``worker_share`` (with ``device``): the fraction of each batch's images the workers decode
    themselves, as without ``device``, while the device decodes the rest: a number in [0, 1], or
    ``"auto"``, set from the measured rates so that neither side waits. ``on_error``:
    ``"raise"`` (naming the shard and key) or ``"skip"`` (bad samples and the rest of a damaged
    shard are counted and replaced by good samples of the same batch). ``verify``: check each
    shard's SHA-256 before use (again when its file changed since); True takes them from the
    split index, or give them: ``{shard: sha256}`` or a ``sha256sum`` file. ``check_samples``
    (default True): check each sample's bytes against the CRC-32 the split index's per-sample
    table records, as it is read; a sample that does not match is a ``SampleChecksumError``
    naming the shard and key (or, with ``on_error="skip"``, counted and skipped). Shards without
    a table (a list of tar files, webdataset shards, gzip and chunked shards) are not checked
    sample by sample; remote ranged reads are always checked. False reads only the fields asked
    for, unchecked."""

    allow_pickle: bool = False
    max_member_bytes: int = DEFAULT_MAX_MEMBER
    device: str | Any | None = None
    on_error: Literal["raise", "skip"] = "raise"
    verify: bool | ChecksumSpec = False
    check_samples: bool = True
    decoder: Literal["torchvision", "nvimgcodec"] = "torchvision"
    worker_share: float | Literal["auto"] | None = None

    def __post_init__(self) -> None:
        if self.max_member_bytes < 0:
            raise ValueError(f"DecodeOptions: max_member_bytes={self.max_member_bytes} should be >= 0")
        if self.decoder not in ("torchvision", "nvimgcodec"):
            raise ValueError(f"DecodeOptions: decoder={self.decoder!r} should be 'torchvision' or 'nvimgcodec'")
        if self.decoder != "torchvision" and self.device is None:
            raise ValueError(f"DecodeOptions: decoder={self.decoder!r} decodes on a device: it needs device=...")
        share = self.worker_share
        if share is not None and share != "auto" and (isinstance(share, (str, bool)) or not 0.0 <= share <= 1.0):
            raise ValueError(f"DecodeOptions: worker_share={share!r} should be a number in [0, 1] or 'auto'")
        if share is not None and self.device is None:
            raise ValueError(
                f"DecodeOptions: worker_share={share!r} splits each batch between the workers and the device: "
                "it needs device=... (without it, the workers decode everything)"
            )
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"DecodeOptions: on_error={self.on_error!r} should be 'raise' or 'skip'")


@suggest_keywords
@dataclass(frozen=True)
class CacheOptions:
    """How remote shards are read (docs/remote.md).

    ``ranged`` (default True): each worker fetches only the byte ranges of the samples it
    reads, checked against the index's per-sample checksums, ``requests`` ranged requests in
    flight per worker ahead of use; shards whose index has no per-sample table (written by
    an older shardify), gzip and chunked shards are fetched whole. ``ranged=False``: every
    remote shard is fetched whole into ``dir`` (shared safely by the workers and ranks of a
    node; default: two shards per process in a temporary folder), least recently used shards
    removed above ``limit_bytes``; better when a node's cache holds the whole dataset for
    many epochs. ``allow_locations``: URL or path prefixes a manifest or split index may send the
    reader to besides its own folder (by default only there: no other host, no local path; a
    local dataset's files once links are resolved).
    ``retry``: how long each request may take and how often a failed one is tried again, for
    every fetch (manifest, indexes, sidecars, shards, ranges); its ``worst_case_s`` is the
    longest one fetch can take (docs/remote.md)."""

    dir: str | os.PathLike[str] | None = None
    limit_bytes: int | None = None
    ranged: bool = True
    requests: int = 64
    allow_locations: tuple[str, ...] = ()
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if self.requests < 1:
            raise ValueError(f"CacheOptions: requests={self.requests} should be >= 1")
        if not isinstance(self.retry, RetryPolicy):
            raise TypeError(f"CacheOptions: retry= should be a RetryPolicy, got {type(self.retry).__name__}")
        if isinstance(self.allow_locations, str):
            raise TypeError("CacheOptions: allow_locations should be a tuple of prefixes, not one string")
        object.__setattr__(self, "allow_locations", tuple(self.allow_locations))
        if self.limit_bytes is not None and self.limit_bytes < 0:
            raise ValueError(f"CacheOptions: limit_bytes={self.limit_bytes} should be >= 0")
        if self.limit_bytes is not None and self.dir is None:
            raise ValueError(
                f"CacheOptions: limit_bytes={self.limit_bytes} needs dir=... (without it, each process "
                "keeps two shards in a temporary folder)"
            )


GROUPS: dict[str, type] = {
    "batching": BatchOptions,
    "sampling": SamplingOptions,
    "decoding": DecodeOptions,
    "cache": CacheOptions,
}
"""Each group keyword of ``ShardedDataset`` and its class."""


def with_defaults(groups: dict[str, Any]) -> dict[str, Any]:
    """``groups`` (group keyword -> object or None) with each None replaced by the group's
    defaults (:class:`ReadOptions` checks the types)."""
    return {name: GROUPS[name]() if value is None else value for name, value in groups.items()}


@suggest_keywords
@dataclass(frozen=True)
class ReadOptions:
    """Every option of a :class:`ShardedDataset`, stored once: its direct keywords and its four
    groups (each group's own object, as given or its defaults); picklable to workers."""

    batch_size: int
    shuffle: bool = False
    seed: int = 0
    transform: Callable[..., Any] | None = None
    fields: tuple[str, ...] | None = None
    map: Callable[[dict[str, Any]], Any] | None = None
    batching: BatchOptions = field(default_factory=BatchOptions)
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    decoding: DecodeOptions = field(default_factory=DecodeOptions)
    cache: CacheOptions = field(default_factory=CacheOptions)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size} should be >= 1")
        if self.fields is not None and self.map is not None:
            raise ValueError("pass fields=... or map=..., not both")
        for name, cls in GROUPS.items():
            value = getattr(self, name)
            if not isinstance(value, cls):
                raise TypeError(f"ShardedDataset(): {name}= should be a {cls.__name__}, got {type(value).__name__}")

    @property
    def skip_errors(self) -> bool:
        """Whether bad samples are skipped (``DecodeOptions(on_error="skip")``) rather than raised."""
        return self.decoding.on_error == "skip"
