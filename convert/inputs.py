"""What every input scanner produces: samples to pack, and files it chose not to pack."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from shardify.errors import InputError

__all__ = ["SourceFile", "SampleSpec", "Ignored", "Scan", "IMAGE_EXTENSIONS", "IMAGE_EXTS", "list_input_dir"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
"""torchvision's ``IMG_EXTENSIONS``: the files an ImageFolder takes (case-insensitive)."""
IMAGE_EXTS = frozenset(e[1:] for e in IMAGE_EXTENSIONS)
"""The same, as lower-case extensions without the dot: a file with one is checked as an image."""


@dataclass(frozen=True, slots=True)
class SourceFile:
    """One file of a sample: the extension it will be stored under, where it is, its size."""

    ext: str
    path: str
    """Path relative to the scan's root."""
    size: int
    mtime_ns: int
    is_image: bool
    transcode: str | None = None
    """How the writer turns the file's bytes into the member's (a tag of
    :func:`shardify.convert.tensors.transcode_file`); None: stored unchanged."""


@dataclass(frozen=True, slots=True)
class SampleSpec:
    """One sample as planned: the name its key comes from, its files, label and inline fields."""

    name: str
    """Original relative path (image folder, listing) or ID; recorded in ``{key}.json``."""
    identity: str
    """Full original name (with extension); hashed into rewritten keys."""
    label: int | None
    label_name: str | int | None
    files: tuple[SourceFile, ...] = ()
    inline: tuple[tuple[str, bytes], ...] = ()


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
    samples: list[SampleSpec]
    classes: list[str] = field(default_factory=list)
    problems: list[Ignored] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def list_input_dir(path: str | os.PathLike[str]) -> list[os.DirEntry[str]]:
    """The entries of an input directory, sorted by name; InputError naming it if unreadable."""
    try:
        return sorted(os.scandir(path), key=lambda e: e.name)
    except OSError as e:
        raise InputError(f"cannot list directory: {e.strerror}", path=str(path)) from e
