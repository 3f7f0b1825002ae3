"""What a loader's or a dataset's state must match to resume: :class:`ResumeBasis`, a plain value.

The dataset builds it once (``ShardedDataset.resume_basis``): the epoch plan's inputs, bucketing,
and each stream's data identity (:func:`data_identity`) and name. :mod:`~shardify.reader.delivery.state`
makes states from it and checks them against it.
"""

from __future__ import annotations

import array
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias
from urllib.parse import urlsplit

from shardify.reader.plan.epoch import EpochInputs

if TYPE_CHECKING:
    from shardify.reader.io.sources import Source

__all__ = ["ResumeBasis", "HasResumeBasis", "StateSource", "data_identity", "plan_fields", "identities", "basis_of"]

STATE_VERSION = 4
"""The version of the states written now (:mod:`~shardify.reader.delivery.state`)."""


@dataclass(frozen=True)
class ResumeBasis:
    """What a state must match to resume: a plain value, built once by the dataset."""

    inputs: EpochInputs
    """The plan's inputs: seed, plan options, each stream's shard sizes and samples per epoch."""
    bucketed: bool = False
    bucket_buffer: int | None = None
    data: tuple[tuple[str | None, str], ...] = ()
    """Each stream's ``(version, digest)`` (:func:`data_identity`)."""
    names: tuple[str, ...] = ()
    """Each stream's name, for messages."""

    @classmethod
    def of(
        cls, inputs: EpochInputs, sources: Sequence[Source], *, bucketed: bool, bucket_buffer: int | None
    ) -> ResumeBasis:
        """The basis of a dataset planned by ``inputs`` reading one stream from each of ``sources``."""
        identities = [data_identity(s) for s in sources]
        return cls(
            inputs=inputs,
            bucketed=bucketed,
            bucket_buffer=bucket_buffer if bucketed else None,
            data=tuple((d["version"], d["digest"]) for d in identities),
            names=tuple(s.name for s in sources),
        )

    @property
    def stream_samples(self) -> tuple[int, ...]:
        """Samples of each stream's data (one pass)."""
        return tuple(sum(sizes) for sizes in self.inputs.stream_sizes)

    @property
    def stream_counts(self) -> tuple[int, ...]:
        """Samples each stream gives an epoch."""
        return self.inputs.counts if self.inputs.counts is not None else self.stream_samples

    @property
    def num_samples(self) -> int:
        return sum(self.stream_samples)


class HasResumeBasis(Protocol):
    """A dataset: what states are made from, through its ``resume_basis``."""

    @property
    def resume_basis(self) -> ResumeBasis: ...


StateSource: TypeAlias = "ResumeBasis | HasResumeBasis"
"""What the functions here take: the basis, or a dataset holding one."""


def basis_of(source: StateSource) -> ResumeBasis:
    """The basis itself, or a dataset's ``resume_basis``."""
    return source if isinstance(source, ResumeBasis) else source.resume_basis


def plan_fields(basis: ResumeBasis) -> dict[str, Any]:
    """The plan options a state records and must match to resume."""
    o = basis.inputs
    return {
        "batch_size": o.batch_size,
        "drop_last": o.drop_last,
        "shuffle": o.shuffle,
        "shuffle_block": o.block,
        "shuffle_buffer": o.buffer,
        "streams": list(basis.stream_samples),
        "stream_counts": list(basis.stream_counts),
        "bucketed": basis.bucketed,
        "bucket_buffer": basis.bucket_buffer,
    }


def data_identity(source: Source) -> dict[str, Any]:
    """``{"version", "digest"}`` of the data a stream reads: its split's version token and 16 hex
    digits of SHA-256 over the split name, that token and each shard's file name and sample
    count, plus its size and SHA-256 when a split index gives them. File names, not paths: the
    same dataset copied to another folder or read over HTTP resumes the same state. A split with
    a sidecar root (:mod:`shardify.merkle`) has its root and counts hashed instead of a line per
    shard: the same value through its JSON or its compact index."""
    if source.sidecar_root is not None:  # the root stands for every shard's size and SHA-256
        counts = hashlib.sha256(array.array("q", source.sizes).tobytes()).hexdigest()
        text = json.dumps([source.split, source.version, source.sidecar_root, len(source.sizes), counts])
        return {"version": source.version, "digest": hashlib.sha256(text.encode()).hexdigest()[:16]}
    from_index = source.split is not None
    shards = [
        [
            os.path.basename(urlsplit(s.url).path) if "://" in s.url else os.path.basename(s.url),
            s.nsamples,
            s.filesize if from_index else None,
            s.sha256.lower() if from_index else "",
        ]
        for s in source.shards
    ]
    text = json.dumps([source.split, source.version, shards], separators=(",", ":"))
    return {"version": source.version, "digest": hashlib.sha256(text.encode()).hexdigest()[:16]}


def identities(basis: ResumeBasis) -> list[dict[str, Any]]:
    """Each stream's :func:`data_identity`, as a state holds them."""
    return [{"version": version, "digest": digest} for version, digest in basis.data]
