"""The training side: stream shards into a PyTorch training loop.

``ShardedDataset`` yields whole batches, the same number on every rank, exactly once per
epoch, from one source or weighted ``Stream``s, its rarer options in four small groups
(``BatchOptions``, ``SamplingOptions``, ``DecodeOptions``, ``CacheOptions``); ``make_loader`` wraps it in a
DataLoader with device prefetch and an exact ``state_dict``. ``transforms`` holds the built-in
augmentations (uint8 CHW output); ``split_keys`` lists a split's sample keys in stored order.
``MapDataset`` is the map-style view of a split: ``ds[i]``, ``ds.get(key)`` and batched
fetches, for any sampler; ``FetchAhead`` wraps a batch sampler so that its workers fetch
remote batches before they are asked for. ``TokenDataset`` packs a token split's documents into fixed-length
sequences for language-model training.
"""

from __future__ import annotations

from shardify.reader.dataset import ShardedDataset
from shardify.reader.delivery.diagnosis import LoaderStats, Measured
from shardify.reader.delivery.loader import Loader, make_loader
from shardify.reader.delivery.prefetch import IMAGENET_MEAN, IMAGENET_STD, DevicePrefetcher
from shardify.reader.delivery.report import EpochReport
from shardify.reader.mapahead import FetchAhead
from shardify.reader.mapview import MapDataset
from shardify.reader.options import (
    BatchOptions,
    CacheOptions,
    DecodeOptions,
    ReadOptions,
    SamplingOptions,
)
from shardify.reader.plan.shuffle import sample_rng
from shardify.reader.sample import transforms
from shardify.reader.sample.collate import bucket_batches, default_collate, pad_collate
from shardify.reader.splitkeys import split_keys
from shardify.reader.streams import Stream
from shardify.reader.tokens import PackOptions, TokenDataset, TokenLoader, varlen_args

__all__ = [
    "ShardedDataset",
    "MapDataset",
    "FetchAhead",
    "Stream",
    "ReadOptions",
    "BatchOptions",
    "SamplingOptions",
    "DecodeOptions",
    "CacheOptions",
    "make_loader",
    "Loader",
    "DevicePrefetcher",
    "EpochReport",
    "LoaderStats",
    "Measured",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "sample_rng",
    "transforms",
    "default_collate",
    "pad_collate",
    "bucket_batches",
    "split_keys",
    "TokenDataset",
    "TokenLoader",
    "PackOptions",
    "varlen_args",
]
