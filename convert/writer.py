"""Write one planned shard: read, check (and maybe transcode) each input, pack, hash, rename.

Runs in worker processes. The shard is written to a hidden temporary name and renamed
into place only when whole (after fsync), and the checksum is computed from the bytes as
they are written, so finished shards are never read back.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, BinaryIO, Protocol

from PIL import Image

from shardify.convert.inputs import Ignored, SampleSpec
from shardify.convert.outfs import OutputFS, open_output
from shardify.convert.plan import ShardPlan
from shardify.convert.sniff import ImageCheckError, check_image, transcode_jpeg
from shardify.errors import InputError, OutputError
from shardify.keys import member_name
from shardify.tarfmt import END_OF_ARCHIVE, padding, shard_name, ustar_header

__all__ = ["ShardTask", "ShardResult", "write_shard", "temp_name", "Progress"]


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
    storage_options: Mapping[str, Any] | None = None
    """The fsspec backend's options for a URL ``out_dir``."""


@dataclass(frozen=True, slots=True)
class ShardResult:
    index: int
    url: str
    nsamples: int
    filesize: int
    sha256: str
    fields: tuple[str, ...]
    skipped: tuple[Ignored, ...]


def temp_name(split: str, index: int) -> str:
    """The hidden name a shard is written under until it is whole."""
    return f".{shard_name(split, index)}.tmp"


class _HashingWriter:
    """Writes to a file and feeds the same bytes to SHA-256; counts them."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> None:
        self.f.write(data)
        self.hash.update(data)
        self.size += len(data)


def _members(spec: SampleSpec, key: str, meta: bytes | None, task: ShardTask) -> list[tuple[str, bytes]]:
    """The (extension, bytes) members of one sample, sorted; raises InputError to skip it."""
    members: list[tuple[str, bytes]] = [("json", meta)] if meta is not None else []
    if spec.label is not None:
        members.append(("cls", str(spec.label).encode("ascii")))
    for source in spec.files:
        path = os.path.join(task.root, source.path)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise InputError(f"cannot read: {e.strerror or e}", path=source.path, key=key) from e
        ext = source.ext
        if source.is_image:
            try:
                info = check_image(data, full=task.check_full)
            except ImageCheckError as e:
                raise InputError(str(e), path=source.path, key=key) from e
            ext = info.ext
            if task.max_side is not None:
                try:
                    small = transcode_jpeg(data, info, max_side=task.max_side, quality=task.quality)
                except Exception as e:  # Pillow's decoder errors have many types
                    raise InputError(f"cannot transcode: {type(e).__name__}: {e}", path=source.path, key=key) from e
                if small is not None:
                    data, ext = small, "jpg"
        members.append((ext, data))
    members.extend(spec.inline)
    members.sort(key=lambda m: m[0])
    for a, b in zip(members, members[1:]):
        if a[0] == b[0]:
            raise InputError(f"two files would be stored as field {a[0]!r}", path=spec.identity, key=key)
    return members


def write_shard(task: ShardTask, progress: Progress | None = None) -> ShardResult:
    """Write ``task.plan`` to ``{split}-{index:06d}.tar`` in ``task.out_dir``; return its entry."""
    plan = task.plan
    if task.max_pixels is not None:
        Image.MAX_IMAGE_PIXELS = task.max_pixels
    fs = open_output(task.out_dir, storage_options=task.storage_options)
    final = shard_name(task.split, plan.index)
    tmp = temp_name(task.split, plan.index)
    skipped: list[Ignored] = []
    fields: set[str] = set()
    written = 0
    try:
        with fs.open_write(tmp) as f:
            out = _HashingWriter(f)
            for sample in plan.samples:
                before = out.size
                try:
                    members = _members(sample.spec, sample.key, sample.meta, task)
                except InputError as e:
                    if task.strict:
                        raise
                    skipped.append(Ignored(e.path or sample.spec.identity, e.reason))
                    members = []
                for ext, data in members:
                    out.write(ustar_header(member_name(sample.key, ext), len(data)))
                    out.write(data)
                    out.write(padding(len(data)))
                    fields.add(ext)
                if members:
                    written += 1
                if progress is not None:
                    progress(1, out.size - before)
            out.write(END_OF_ARCHIVE)
            fs.finish_write(f, fsync=task.fsync)
        fs.replace(tmp, final)
    except OSError as e:
        _discard(fs, tmp)
        raise OutputError(f"{fs.location}/{final}: cannot write shard: {e.strerror or e}") from e
    except BaseException:
        _discard(fs, tmp)
        raise
    return ShardResult(index=plan.index, url=final, nsamples=written, filesize=out.size,
                       sha256=out.hash.hexdigest(), fields=tuple(sorted(fields)), skipped=tuple(skipped))


def _discard(fs: OutputFS, name: str) -> None:
    try:
        fs.remove(name)
    except OSError:
        pass
