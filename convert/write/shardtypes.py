"""The values a shard's writing takes and gives: its task (what to write, how) and its result
(the entry of the finished shard, and what a resume record keeps of it)."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from shardify.convert.inputs.inputs import Ignored
from shardify.convert.write.plan import ShardPlan

__all__ = ["ShardTask", "ShardResult", "Progress"]


class Progress(Protocol):
    def __call__(self, samples: int, nbytes: int) -> None: ...


@dataclass(frozen=True, slots=True)
class ShardTask:
    out_dir: str
    """A local folder or an fsspec URL."""
    root: str
    split: str
    plan: ShardPlan
    check_full: bool
    max_side: int | None
    quality: int
    strict: bool
    fsync: bool
    max_pixels: int | None = None
    version: str | None = None
    """The plan's version token, in the shard's file name."""
    max_image_bytes: int | None = None
    """Image files larger than this are reported as too large, without being read."""
    image_format: str = "keep"
    """``keep``, or ``jpg``/``png``: every image stored in that format (see ``imageformat``)."""
    storage_options: Mapping[str, Any] | None = None
    """The fsspec backend's options for a URL ``out_dir``."""
    raw_pixels: int | None = None
    """Store images pre-decoded, ``raw_side`` side at most this (see ``rawpixels``); None: encoded."""
    raw_side: str = "shorter"
    chunk: int | None = None
    """Samples per chunk (the chunked layout, :mod:`shardify.chunk`); None: one tar sample per sample."""


@dataclass(frozen=True, slots=True)
class ShardResult:
    index: int
    url: str
    nsamples: int
    filesize: int
    sha256: str
    fields: tuple[str, ...]
    skipped: tuple[Ignored, ...]
    notes: tuple[Ignored, ...] = ()
    """Inputs packed with decoder warnings (kind ``note``), for the report."""
    offsets: tuple[int, ...] = ()
    """Byte offset of samples 0, OFFSET_STRIDE, ... (see :data:`shardify.tarfmt.OFFSET_STRIDE`)."""
    samples: bytes = b""
    """The shard's per-sample table (:mod:`shardify.sampletable`); empty for a chunked shard."""
    tokens: bytes = b""
    """Each document's length in tokens, little-endian uint32 (a token split; empty otherwise)."""

    def to_record(self) -> dict[str, Any]:
        """What a resume record keeps of this result (JSON-ready; :meth:`from_record` reads it)."""
        return {
            "url": self.url,
            "nsamples": self.nsamples,
            "filesize": self.filesize,
            "sha256": self.sha256,
            "offsets": list(self.offsets),
            "samples": base64.b64encode(self.samples).decode(),
            "fields": list(self.fields),
            "skipped": [[s.path, s.reason] for s in self.skipped],
            "notes": [[s.path, s.reason] for s in self.notes],
            **({"tokens": base64.b64encode(self.tokens).decode()} if self.tokens else {}),
        }

    @classmethod
    def from_record(cls, index: int, r: Mapping[str, Any]) -> ShardResult:
        """The result of shard ``index`` as a record kept it; KeyError, TypeError or ValueError
        for a record that is not whole (one written before offsets were: its shard is rewritten)."""
        return cls(
            index=index,
            url=r["url"],
            nsamples=r["nsamples"],
            filesize=r["filesize"],
            sha256=r["sha256"],
            fields=tuple(r["fields"]),
            skipped=tuple(Ignored(p, why) for p, why in r["skipped"]),
            notes=tuple(Ignored(p, why, "note") for p, why in r.get("notes", [])),
            offsets=tuple(r["offsets"]),
            samples=base64.b64decode(r.get("samples", "")),
            tokens=base64.b64decode(r.get("tokens", "")),
        )
