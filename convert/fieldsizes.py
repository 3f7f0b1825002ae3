"""``field_bytes``: what each field of a split costs per sample, data and tar framing apart.

A tar member is a 512-byte header, its data, and padding up to the next multiple of 512. For
small fields (a label, a short caption) the framing outweighs the data; a layout that stores
one field of many samples in one member saves it. The split index lists no member sizes, so
the figures come from the headers of a few shards spread over the split (read with seeks,
not their data), and say so (``source``). In a chunked split (format 3) a tar sample is a
chunk of many samples: the bytes are divided by the samples the chunks hold (the index's
counts), and a field's ``present`` is the share of chunks holding it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from shardify.convert.dataset_files import DatasetFiles
from shardify.splitindex import SplitIndex
from shardify.tarfmt import BLOCK
from shardify.tario import scan_layout

__all__ = ["FieldBytes", "SplitFieldBytes", "field_bytes", "spread"]


@dataclass(frozen=True)
class FieldBytes:
    """Mean bytes per sample of one field (over all samples read, so a field present in half
    of them counts half): its ``data``, its tar ``headers`` and its ``padding``."""

    data: float
    headers: float
    padding: float
    present: float
    """Share of the samples read that hold this field."""


@dataclass(frozen=True)
class SplitFieldBytes:
    """Per-field bytes per sample of a split and where they come from."""

    source: str
    """How they were found, for people: ``"headers of 2 of 130 shards (20000 samples)"``."""
    samples: int
    fields: dict[str, FieldBytes] = field(default_factory=dict)
    chunk: int | None = None
    """Samples per chunk of a chunked split (its fields are already one member per chunk)."""

    @property
    def framing(self) -> float:
        """Tar headers and padding per sample, all fields."""
        return sum(f.headers + f.padding for f in self.fields.values())

    @property
    def data(self) -> float:
        return sum(f.data for f in self.fields.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "samples": self.samples,
            "chunk": self.chunk,
            "fields": {k: asdict(v) for k, v in self.fields.items()},
        }


def spread(n: int, k: int) -> list[int]:
    """``min(n, k)`` indices in ``range(n)`` spread evenly, first and last included."""
    if n <= 0 or k <= 0:
        return []
    if k >= n:
        return list(range(n))
    if k == 1:
        return [0]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def field_bytes(files: DatasetFiles, index: SplitIndex, *, shards: int = 2) -> SplitFieldBytes:
    """Per-field bytes per sample of ``index``'s split, from the headers of ``shards`` of its shards."""
    picked = spread(len(index.shards), shards)
    data: dict[str, int] = {}
    members: dict[str, int] = {}
    padding: dict[str, int] = {}
    holding: dict[str, int] = {}
    samples = units = 0
    for i in picked:
        url = index.shards[i].url
        with files.open_stream(url) as f:
            layout = scan_layout(f, shard=url)
        for s in range(len(layout)):
            seen = set()
            for name, _, size in layout.fields(s):
                data[name] = data.get(name, 0) + size
                members[name] = members.get(name, 0) + 1
                padding[name] = padding.get(name, 0) + (-size) % BLOCK
                seen.add(name)
            for name in seen:
                holding[name] = holding.get(name, 0) + 1
        units += len(layout)
        samples += index.shards[i].nsamples if index.chunk is not None else len(layout)
    n, u = max(samples, 1), max(units, 1)
    out = {
        name: FieldBytes(
            data=data[name] / n, headers=members[name] * BLOCK / n, padding=padding[name] / n, present=holding[name] / u
        )
        for name in sorted(data, key=lambda k: -data[k])
    }
    read = f"{samples} samples" if index.chunk is None else f"{samples} samples in {units} chunks"
    return SplitFieldBytes(
        source=f"headers of {len(picked)} of {len(index.shards)} shards ({read})",
        samples=samples,
        fields=out,
        chunk=index.chunk,
    )
