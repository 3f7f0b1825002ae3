"""Plan a split before writing anything: order, keys, and which samples go in which shard.

Planning is a pure function of the scan and the shaping options, so the same input gives
the same shards whatever the number of workers, and each shard can be written (or
rewritten after a crash) on its own. Without transcoding, the planned shard sizes are the
exact sizes of the tar files (minus inputs skipped as bad).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass

from shardify import FORMAT_VERSION, __version__
from shardify.convert.inputs import SampleSpec, Scan
from shardify.convert.options import ConvertOptions
from shardify.keys import assign_keys
from shardify.tarfmt import END_OF_ARCHIVE, VERSION_CHARS, member_size

__all__ = ["PlannedSample", "ShardPlan", "SplitPlan", "plan_split", "metadata_json", "shuffle_order"]


@dataclass(frozen=True, slots=True)
class PlannedSample:
    key: str
    spec: SampleSpec
    meta: bytes
    """The ``{key}.json`` member."""


@dataclass(frozen=True, slots=True)
class ShardPlan:
    index: int
    samples: tuple[PlannedSample, ...]
    planned_bytes: int


@dataclass(frozen=True)
class SplitPlan:
    split: str
    shards: tuple[ShardPlan, ...]
    fingerprint: str
    """SHA-256 over the shaping options and every planned sample: equal plans, equal output."""

    @property
    def version(self) -> str:
        """The version token in the output's file names: the fingerprint's first hex digits.

        The same conversion of the same inputs gets the same names (so a rerun resumes and
        ends byte-identical); any other conversion gets new names, and never rewrites the
        files of a version a reader may be reading."""
        return self.fingerprint[:VERSION_CHARS]

    @property
    def num_samples(self) -> int:
        return sum(len(s.samples) for s in self.shards)


def metadata_json(spec: SampleSpec) -> bytes:
    """The ``{key}.json`` member: original path or ID, label name, and source files."""
    meta: dict[str, object] = {"path": spec.identity}
    if spec.label_name is not None:
        meta["label"] = spec.label_name
    if spec.files and [f.path for f in spec.files] != [spec.identity]:
        meta["files"] = {f.ext: f.path for f in spec.files}
    return json.dumps(meta, sort_keys=True, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def shuffle_order(n: int, *, seed: int, split: str) -> list[int]:
    """A permutation of ``range(n)`` from ``(seed, split)``, the same on every platform."""
    digest = hashlib.sha256(f"shardify-order:{seed}:{split}".encode()).digest()
    order = list(range(n))
    random.Random(int.from_bytes(digest[:16], "big")).shuffle(order)
    return order


def _sample_bytes(spec: SampleSpec, meta: bytes) -> int:
    total = member_size(len(meta))
    if spec.label is not None:
        total += member_size(len(str(spec.label)))
    total += sum(member_size(f.size) for f in spec.files)
    total += sum(member_size(len(data)) for _, data in spec.inline)
    return total


def plan_split(scan: Scan, options: ConvertOptions) -> SplitPlan:
    """Order the samples (seeded shuffle unless disabled), key them, and pack them into shards."""
    specs: Sequence[SampleSpec] = scan.samples
    keys = assign_keys([s.name for s in specs], identities=[s.identity for s in specs])
    order = shuffle_order(len(specs), seed=options.seed, split=options.split) if options.shuffle else range(len(specs))
    hasher = hashlib.sha256()
    hasher.update(json.dumps({"format_version": FORMAT_VERSION, "converter": __version__,
                              "source": scan.source, "classes": scan.classes,
                              "options": options.shaping()}, sort_keys=True).encode())
    limit = options.shard_size
    per_shard = options.samples_per_shard
    shards: list[ShardPlan] = []
    current: list[PlannedSample] = []
    current_bytes = len(END_OF_ARCHIVE)
    for i in order:
        spec = specs[i]
        meta = metadata_json(spec)
        size = _sample_bytes(spec, meta)
        full = (per_shard is not None and len(current) >= per_shard) or (
            limit is not None and current and current_bytes + size > limit)
        if full:
            shards.append(ShardPlan(len(shards), tuple(current), current_bytes))
            current, current_bytes = [], len(END_OF_ARCHIVE)
        current.append(PlannedSample(keys[i], spec, meta))
        current_bytes += size
        hasher.update(f"{len(shards)}\0{keys[i]}\0{spec.label}\0".encode())
        hasher.update(meta)
        for f in spec.files:
            hasher.update(f"{f.ext}\0{f.path}\0{f.size}\0{f.mtime_ns}\0".encode("utf-8", "surrogateescape"))
        for ext, data in spec.inline:
            hasher.update(ext.encode() + b"\0" + hashlib.sha256(data).digest())
    if current:
        shards.append(ShardPlan(len(shards), tuple(current), current_bytes))
    return SplitPlan(split=options.split, shards=tuple(shards), fingerprint=hasher.hexdigest())


