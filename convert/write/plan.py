"""Plan a split before writing anything: order, keys, and which samples go in which shard.

Planning is a pure function of the scan and the shaping options, so the same input gives
the same shards whatever the number of workers, and each shard can be written (or
rewritten after a crash) on its own. Without transcoding, the planned shard sizes are the
exact sizes of the tar files (minus inputs skipped as bad).
"""

from __future__ import annotations

import hashlib
import json
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
import random
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from shardify import FORMAT_VERSION, __version__
from shardify.convert.inputs.inputs import SampleSpec, SampleTable, Scan, total_payload_bytes
from shardify.convert.options import ConvertOptions
from shardify.keys import KeyList, assign_keys
from shardify.tarfmt import END_OF_ARCHIVE, VERSION_CHARS, member_size

__all__ = ["PlannedSample", "ShardPlan", "SplitPlan", "plan_split", "metadata_json", "metadata_needed",
           "shuffle_order"]


@dataclass(frozen=True, slots=True)
class PlannedSample:
    key: str
    spec: SampleSpec
    meta: bytes | None
    """The ``{key}.json`` member, or None when the sample has none (see :func:`metadata_needed`)."""


@dataclass(frozen=True)
class ShardPlan:
    """One shard's samples, made from the split plan when its task is (never all at once),
    and held compactly (records and keys in two buffers) until the writer reads them."""

    index: int
    specs: Sequence[SampleSpec]
    keys: Sequence[str]
    planned_bytes: int
    metadata: str = "auto"
    classes: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def samples(self) -> Iterator[PlannedSample]:
        """The samples in shard order, with their ``{key}.json`` members, made one at a time."""
        for spec, key in zip(self.specs, self.keys):
            yield PlannedSample(key, spec, _meta(spec, key, self.metadata, self.classes))


@dataclass(frozen=True)
class SplitPlan:
    """Which samples go in which shard, held compactly: the scan's samples, their keys, the
    order, and where each shard starts in it. :meth:`shard` makes one :class:`ShardPlan`."""

    split: str
    fingerprint: str
    """SHA-256 over the shaping options and every planned sample: equal plans, equal output."""
    shard_sizes: tuple[int, ...]
    """Samples in each shard."""
    shard_bytes: tuple[int, ...]
    """Planned bytes of each shard (exact without transcoding or skipped inputs)."""
    specs: Sequence[SampleSpec] = field(repr=False)
    keys: Sequence[str] = field(repr=False)
    order: Sequence[int] = field(repr=False)
    metadata: str = "auto"
    classes: tuple[str, ...] = ()

    @property
    def num_shards(self) -> int:
        return len(self.shard_sizes)

    @property
    def version(self) -> str:
        """The version token in the output's file names: the fingerprint's first hex digits.

        The same conversion of the same inputs gets the same names (so a rerun resumes and
        ends byte-identical); any other conversion gets new names, and never rewrites the
        files of a version a reader may be reading."""
        return self.fingerprint[:VERSION_CHARS]

    @property
    def num_samples(self) -> int:
        return sum(self.shard_sizes)

    def shard(self, index: int) -> ShardPlan:
        """The samples of shard ``index``, in order, with their keys."""
        start = sum(self.shard_sizes[:index])
        specs, keys = SampleTable(), KeyList()
        for pos in range(start, start + self.shard_sizes[index]):
            i = self.order[pos]
            specs.append(self.specs[i])
            keys.append(self.keys[i])
        return ShardPlan(index, specs, keys, self.shard_bytes[index], self.metadata, self.classes)

    @property
    def shards(self) -> list[ShardPlan]:
        """Every shard's plan (materializes all samples: for small plans and tests)."""
        return [self.shard(i) for i in range(self.num_shards)]


def metadata_json(spec: SampleSpec) -> bytes:
    """The ``{key}.json`` member: original path or ID, label name, and source files.

    Exactly ``json.dumps(meta, sort_keys=True, ensure_ascii=True, separators=(",", ":"))`` of
    ``{"path": ..., "label": ..., "files": {ext: path}}`` (see :func:`_metadata_reference`),
    written out by hand with json's own C string encoder: made once per sample, twice per
    conversion, it was the plan's largest cost at 1.3 M image files.
    """
    parts = []
    if spec.files and [f.path for f in spec.files] != [spec.identity]:
        files = {f.ext: f.path for f in spec.files}
        parts.append('"files":{' + ",".join(f"{_string(ext)}:{_string(files[ext])}" for ext in sorted(files)) + "}")
    label = spec.label_name
    if label is not None:
        parts.append('"label":' + (_string(label) if type(label) is str
                                   else str(label) if type(label) is int else _compact(label)))
    parts.append('"path":' + _string(spec.identity))
    return ("{" + ",".join(parts) + "}").encode("ascii")


_string: Callable[[str], str] = encode_basestring_ascii
"""A str as a JSON string, ASCII only (json.dumps' own C encoder)."""


def _compact(value: object) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=True, separators=(",", ":"))


def _metadata_reference(spec: SampleSpec) -> bytes:
    """:func:`metadata_json` through ``json.dumps`` (what it must equal; used by the tests)."""
    meta: dict[str, object] = {"path": spec.identity}
    if spec.label_name is not None:
        meta["label"] = spec.label_name
    if spec.files and [f.path for f in spec.files] != [spec.identity]:
        meta["files"] = {f.ext: f.path for f in spec.files}
    return _compact(meta).encode("ascii")


def metadata_needed(spec: SampleSpec, key: str, classes: Sequence[str]) -> bool:
    """Whether ``{key}.json`` holds anything the key, the other members and the split index
    do not: the key is not the name as given (rewritten, or a path), a label name is not
    ``classes[label]``, or a member came from a file (its original path)."""
    if key != spec.name or spec.identity != spec.name or spec.files:
        return True
    name = spec.label_name
    if name is None or name == spec.label:
        return False
    return not (isinstance(spec.label, int) and 0 <= spec.label < len(classes) and classes[spec.label] == name)


def _meta(spec: SampleSpec, key: str, mode: str, classes: Sequence[str]) -> bytes | None:
    if mode == "always" or metadata_needed(spec, key, classes):
        return metadata_json(spec)
    return None


def shuffle_order(n: int, *, seed: int, split: str) -> array[int]:
    """A permutation of ``range(n)`` from ``(seed, split)``, the same on every platform
    (8 bytes an entry)."""
    digest = hashlib.sha256(f"shardify-order:{seed}:{split}".encode()).digest()
    order = array("q", range(n))
    random.Random(int.from_bytes(digest[:16], "big")).shuffle(order)  # type: ignore[arg-type]
    return order


def _sample_bytes(spec: SampleSpec, meta: bytes | None) -> int:
    total = member_size(len(meta)) if meta is not None else 0
    if spec.label is not None:
        total += member_size(len(str(spec.label)))
    for f in spec.files:
        total += member_size(f.size)
    for _, data in spec.inline:
        total += member_size(len(data))
    return total


def plan_split(scan: Scan, options: ConvertOptions) -> SplitPlan:
    """Order the samples (seeded shuffle unless disabled), key them, and pack them into shards.

    Memory: the scan's samples are read one at a time; the plan adds the keys (~20 bytes
    each), the order (8 bytes each) and two numbers per shard.
    """
    specs: Sequence[SampleSpec] = scan.samples
    keys = assign_keys(_Column(specs, "name"), identities=_Column(specs, "identity"))
    order: Sequence[int] = (shuffle_order(len(specs), seed=options.seed, split=options.split)
                            if options.shuffle else range(len(specs)))
    hasher = hashlib.sha256()
    hasher.update(json.dumps({"format_version": FORMAT_VERSION, "converter": __version__,
                              "source": scan.source, "classes": scan.classes,
                              "options": options.shaping()}, sort_keys=True).encode())
    classes = tuple(scan.classes)
    limit = options.shard_bound(total_payload_bytes(specs))
    per_shard = options.samples_per_shard
    mode = options.metadata
    sha256 = hashlib.sha256
    sizes: list[int] = []
    shard_bytes: list[int] = []
    count = 0
    current_bytes = len(END_OF_ARCHIVE)
    hashed: list[bytes] = []  # the fingerprint's input, fed to the hasher in batches (same digest)
    picked = specs.take(order) if isinstance(specs, SampleTable) else (specs[i] for i in order)
    for spec, key in zip(picked, keys.take(order)):
        meta = _meta(spec, key, mode, classes)
        size = _sample_bytes(spec, meta)
        full = (per_shard is not None and count >= per_shard) or (
            limit is not None and count and current_bytes + size > limit)
        if full:
            sizes.append(count)
            shard_bytes.append(current_bytes)
            count, current_bytes = 0, len(END_OF_ARCHIVE)
        count += 1
        current_bytes += size
        hashed.append(f"{len(sizes)}\0{key}\0{spec.label}\0".encode())
        hashed.append(meta if meta is not None else b"\0")
        for f in spec.files:
            hashed.append(f"{f.ext}\0{f.path}\0{f.size}\0{f.mtime_ns}\0".encode("utf-8", "surrogateescape"))
        for ext, data in spec.inline:
            hashed.append(ext.encode() + b"\0" + sha256(data).digest())
        if len(hashed) >= 4096:
            hasher.update(b"".join(hashed))
            hashed.clear()
    hasher.update(b"".join(hashed))
    if count:
        sizes.append(count)
        shard_bytes.append(current_bytes)
    return SplitPlan(split=options.split, fingerprint=hasher.hexdigest(), shard_sizes=tuple(sizes),
                     shard_bytes=tuple(shard_bytes), specs=specs, keys=keys, order=order,
                     metadata=options.metadata, classes=classes)


class _Column(Sequence[str]):
    """One string attribute of every sample, read on demand."""

    def __init__(self, specs: Sequence[SampleSpec], attr: str) -> None:
        self.specs, self.attr = specs, attr

    def __len__(self) -> int:
        return len(self.specs)

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        return getattr(self.specs[i], self.attr)

    def __iter__(self) -> Iterator[str]:
        if self.attr == "name" and isinstance(self.specs, SampleTable):
            return self.specs.names()
        return map(attrgetter(self.attr), self.specs)
