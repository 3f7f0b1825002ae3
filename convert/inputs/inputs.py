"""What every input scanner produces: samples to pack, and files it chose not to pack.

A scan of ImageNet's 1.3 M inputs must not hold 1.3 M Python objects: :class:`SpecTable`
keeps each sample as one compact ``marshal`` record in a single buffer (about 100 bytes
for a listing row with a short text) and gives a :class:`SampleSpec` back on indexing.
"""

from __future__ import annotations

import marshal
import os
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, cast, overload

import numpy as np

from shardify.errors import InputError
from shardify.records import Records
from shardify.tarfmt import BLOCK, member_size

__all__ = [
    "SourceFile",
    "SampleSpec",
    "SpecTable",
    "pack_record",
    "payload_bytes",
    "total_payload_bytes",
    "Ignored",
    "Scan",
    "IMAGE_EXTENSIONS",
    "IMAGE_EXTS",
    "list_input_dir",
]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
"""torchvision's ``IMG_EXTENSIONS``: the files an ImageFolder takes (case-insensitive)."""
IMAGE_EXTS = frozenset(e[1:] for e in IMAGE_EXTENSIONS)
"""The same, as lower-case extensions without the dot: a file with one is checked as an image."""


class SourceFile(NamedTuple):
    """One file of a sample: the extension it will be stored under, where it is, its size.

    (A NamedTuple, like :class:`SampleSpec`: made millions of times, it costs a tuple.)"""

    ext: str
    path: str
    """Path relative to the scan's root."""
    size: int
    mtime_ns: int
    is_image: bool
    transcode: str | None = None
    """How the writer turns the file's bytes into the member's (a tag of
    :func:`shardify.convert.inputs.tensors.transcode_file`); None: stored unchanged."""


class SampleSpec(NamedTuple):
    """One sample as planned: the name its key comes from, its files, label and inline fields."""

    name: str
    """Original relative path (image folder, listing) or ID; recorded in ``{key}.json``."""
    identity: str
    """Full original name (with extension); hashed into rewritten keys."""
    label: int | None
    label_name: str | int | None
    files: tuple[SourceFile, ...] = ()
    inline: tuple[tuple[str, bytes], ...] = ()


def payload_bytes(spec: SampleSpec) -> int:
    """Tar bytes of a sample's files, inline fields and label (not its ``.json``): what sizes
    a dataset before planning."""
    _, _, label, _, files, inline = spec
    total = 2 * BLOCK if label is not None else 0
    for f in files:
        total += member_size(f.size)
    for _, data in inline:
        total += member_size(len(data))
    return total


def total_payload_bytes(samples: Sequence[SampleSpec]) -> int:
    """:func:`payload_bytes` of every sample (kept by a SpecTable as it fills)."""
    if isinstance(samples, SpecTable):
        return samples.payload_bytes
    return sum(payload_bytes(s) for s in samples)


class SpecTable(Sequence[SampleSpec]):
    """Samples in scan order, each stored as one ``marshal`` record in a shared buffer.

    Appending and indexing are O(1). Memory is the records plus 8 bytes of offset each up
    to ``spill_bytes`` (default :data:`shardify.records.SPILL_BYTES`, 8 MiB), and no more
    beyond it: older records go to a temporary file (:class:`~shardify.records.Records`),
    so a scan of a billion inputs holds as much memory as one of a million.
    """

    def __init__(self, samples: Iterable[SampleSpec] = (), *, spill_bytes: int | None = None) -> None:
        self._records = Records(spill_bytes=spill_bytes)
        self._last: tuple[int, SampleSpec | None] = (-1, None)
        self.payload_bytes = 0
        """Sum of :func:`payload_bytes` of the samples appended."""
        self.label_counts: Counter[int] | None = Counter()
        """How many samples have each label (not None), so that no one reads every sample
        again to count them; None once records came without their counts."""
        for spec in samples:
            self.append(spec)

    def append(self, spec: SampleSpec) -> None:
        name, identity, label, label_name, files, inline = spec
        self.payload_bytes += payload_bytes(spec)
        if label is not None and self.label_counts is not None:
            self.label_counts[label] += 1
        # plain tuples (marshal takes no NamedTuple); tuple() of a SourceFile types as
        # tuple[object, ...], its fields are pack_record's 6-tuple
        plain = cast(
            "tuple[tuple[str, str, int, int, bool, str | None], ...]", tuple(map(tuple, files)) if files else ()
        )
        self._records.append(pack_record(name, identity, label, label_name, plain, inline))

    def extend_records(
        self, data: bytes, ends: array[int] | np.ndarray, payload: int, labels: Counter[int] | None = None
    ) -> None:
        """Append records made by :func:`pack_record` elsewhere (a scanner's worker process):
        ``data`` is them back to back, ``ends`` where each ends in ``data``, ``payload`` the
        sum of their samples' :func:`payload_bytes`, ``labels`` their :attr:`label_counts`
        (None: not counted)."""
        self._records.extend(data, ends)
        self.payload_bytes += payload
        if labels is None or self.label_counts is None:
            self.label_counts = None
        else:
            self.label_counts.update(labels)

    def __len__(self) -> int:
        return len(self._records)

    @overload
    def __getitem__(self, i: int) -> SampleSpec: ...
    @overload
    def __getitem__(self, i: slice) -> list[SampleSpec]: ...

    def __getitem__(self, i: int | slice) -> SampleSpec | list[SampleSpec]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self._records)
        if self._last[0] == i:  # a sample is often read twice in a row (name, then identity)
            return self._last[1]  # type: ignore[return-value]
        spec = _unpack(self._records[i])  # IndexError for i out of range
        self._last = (i, spec)
        return spec

    def __iter__(self) -> Iterator[SampleSpec]:
        i = 0
        for data, ends in self._records.spans():
            begin = 0
            for end in ends.tolist():
                spec = _unpack(data[begin:end])
                self._last = (i, spec)
                yield spec
                begin, i = end, i + 1

    def names(self, start: int = 0, stop: int | None = None) -> Iterator[str]:
        """The ``name`` of samples ``start..stop`` (default: all), in order, without making
        the samples (half the time)."""
        loads = marshal.loads
        for data, ends in self._records.spans(start, stop):
            begin = 0
            for end in ends.tolist():
                yield loads(data[begin:end])[0]
                begin = end

    def take(self, indices: Iterable[int]) -> Iterator[SampleSpec]:
        """The samples at ``indices`` (each in ``range(len(self))``), in that order: faster than
        indexing one at a time."""
        return map(_unpack, self._records.take(indices))

    def spans(self, *, chunk: int = 1 << 14) -> Iterator[tuple[bytes | bytearray, np.ndarray]]:
        """The records in order, ``chunk`` at a time, as ``(records back to back, where each
        ends)``: what :meth:`extend_records` takes."""
        return self._records.spans(chunk=chunk)

    @property
    def nbytes(self) -> int:
        """Bytes held by the records and offsets, in memory and spilled to disk."""
        return self._records.nbytes

    @property
    def resident_bytes(self) -> int:
        """Bytes of records and offsets held in memory (at most the spill budget)."""
        return self._records.resident_bytes


def pack_record(
    name: str,
    identity: str,
    label: int | None,
    label_name: str | int | None,
    files: tuple[tuple[str, str, int, int, bool, str | None], ...] = (),
    inline: tuple[tuple[str, bytes], ...] = (),
) -> bytes:
    """The :class:`SpecTable` record of a sample, its files given as plain 6-tuples (every
    field of :class:`SourceFile`): what a scanner that makes no :class:`SampleSpec` stores."""
    return marshal.dumps((name, None if identity == name else identity, label, label_name, files, inline))


_new_tuple = tuple.__new__  # SampleSpec(...) and SourceFile(...) run Python code; this does not


def _unpack(record: bytes | bytearray) -> SampleSpec:
    """The sample of one :class:`SpecTable` record (made millions of times by a plan)."""
    name, identity, label, label_name, files, inline = marshal.loads(record)
    if files:
        files = tuple([_new_tuple(SourceFile, f) for f in files])
    return _new_tuple(SampleSpec, (name, name if identity is None else identity, label, label_name, files, inline))


@dataclass(frozen=True, slots=True)
class Ignored:
    """An input not packed: ``kind`` is ``skipped`` (bad input) or ``ignored`` (not an input)."""

    path: str
    reason: str
    kind: str = "skipped"


@dataclass(slots=True)
class Scan:
    """The result of scanning a source for one split."""

    root: str
    source: str
    samples: Sequence[SampleSpec]
    """A list, or a :class:`SpecTable` for scans that may be large."""
    classes: list[str] = field(default_factory=list)
    problems: list[Ignored] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def list_input_dir(path: str | os.PathLike[str]) -> list[os.DirEntry[str]]:
    """The entries of an input directory, sorted by name; InputError naming it if unreadable."""
    try:
        return sorted(os.scandir(path), key=lambda e: e.name)
    except OSError as e:
        raise InputError(f"cannot list directory: {e.strerror}", path=str(path)) from e
