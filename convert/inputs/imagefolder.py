"""Scan ``root/<class>/**/<file>`` the way torchvision's ImageFolder does.

Classes are the sorted names of the non-hidden folders directly under the root; class
``i`` is the i-th name. Files are taken by torchvision's extensions, case-insensitive, in
``sorted(os.walk(...))`` order. Hidden folders and files (leading ``.``) are skipped and
counted; other files are counted and reported, not packed. Symbolic links are followed
only when they stay inside the root (and never twice into the same folder).
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterator
from itertools import accumulate
from pathlib import Path

from shardify.convert.executor import LocalExecutor, default_method
from shardify.convert.inputs.inputs import IMAGE_EXTENSIONS, Ignored, Scan, SpecTable, list_input_dir, pack_record
from shardify.convert.options import worker_count
from shardify.errors import InputError
from shardify.tarfmt import BLOCK, member_size

__all__ = ["scan_imagefolder"]


def scan_imagefolder(root: str | os.PathLike[str], *, follow_symlinks: bool = True, workers: int = 0) -> Scan:
    """List the images of an image folder with their ImageFolder labels.

    ``workers`` processes (0: one per core) list and stat the class folders when the tree
    is big (estimated from the first class: :data:`POOL_MIN_FILES`); the scan is the same
    with any number."""
    root_path = Path(root)
    if not root_path.is_dir():
        raise InputError("not a directory (expected root/<class>/<image>)", path=str(root_path))
    real_root = os.path.realpath(root_path)
    problems: list[Ignored] = []
    classes: list[str] = []
    entries = list_input_dir(root_path)
    for entry in entries:
        if entry.name.startswith("."):
            problems.append(Ignored(entry.name, "hidden", "ignored"))
        elif _is_dir(entry, entry.name, real_root, follow_symlinks, problems):
            classes.append(entry.name)
        elif not entry.is_dir():
            problems.append(Ignored(entry.name, "not inside a class folder", "ignored"))
    if not classes:
        raise InputError("no class folders found (expected root/<class>/<image>)", path=str(root_path))

    samples = SpecTable()  # compact: 8 MiB in memory, the rest of ImageNet's 1.3 M in a temporary file
    notes: list[str] = []
    jobs = [(str(root_path), name, index, real_root, follow_symlinks) for index, name in enumerate(classes)]
    for (_, name, index, _, _), (data, ends, payload, found) in zip(jobs, _scan_classes(jobs, workers)):
        if not ends:
            notes.append(f"class {name!r} (label {index}) has no images")
        samples.extend_records(data, ends, payload)
        problems += found
    return Scan(
        root=str(root_path), source="imagefolder", samples=samples, classes=classes, problems=problems, notes=notes
    )


POOL_MIN_FILES = 20_000
"""Trees of fewer images (estimated as the first class's times the classes) are scanned in
this process: forking workers would cost more than it saves."""

_ClassJob = tuple[str, str, int, str, bool]
"""``(root, class name, label, real root, follow symlinks)``."""
_ClassScan = tuple[bytes, "array[int]", int, list[Ignored]]
"""A class's :class:`SpecTable` records back to back, where each ends, their payload
bytes, and the inputs not packed."""


def _scan_classes(jobs: list[_ClassJob], workers: int) -> Iterator[_ClassScan]:
    """:func:`_scan_class` of every job, in order: the first here, the rest in a pool of
    ``workers`` processes when the tree looks big enough to pay for it."""
    first = _scan_class(jobs[0])
    yield first
    rest = jobs[1:]
    workers = min(worker_count(workers), len(rest))
    if workers < 2 or len(first[1]) * len(jobs) < POOL_MIN_FILES:
        yield from map(_scan_class, rest)
        return
    executor = LocalExecutor(
        workers=workers, window=4 * workers + 1, method=default_method(), what=f"scanning {jobs[0][0]}"
    )
    with executor:
        for _, scanned in executor.map(_scan_class, rest):
            yield scanned


def _inside(real: str, real_root: str) -> bool:
    return real == real_root or real.startswith(real_root + os.sep)


def _link_allowed(entry: os.DirEntry[str], rel: str, real_root: str, follow: bool, problems: list[Ignored]) -> bool:
    """Whether the symbolic link ``entry`` may be followed; reports why not."""
    if not follow:
        problems.append(Ignored(rel, "symbolic link not followed (--no-follow-symlinks)", "ignored"))
        return False
    if not _inside(os.path.realpath(entry.path), real_root):
        problems.append(Ignored(rel, "symbolic link points outside the source root", "skipped"))
        return False
    return True


def _is_dir(entry: os.DirEntry[str], rel: str, real_root: str, follow: bool, problems: list[Ignored]) -> bool:
    """Whether to descend into ``entry``; reports links that are not followed."""
    if not entry.is_symlink():
        return entry.is_dir(follow_symlinks=False)
    return entry.is_dir(follow_symlinks=True) and _link_allowed(entry, rel, real_root, follow, problems)


def _scan_class(job: _ClassJob) -> _ClassScan:
    """The images of one class folder in ``sorted(os.walk)`` order, as SpecTable records.

    The hot loop of a scan (ImageNet: 1.3 M files): one stat and one ``marshal`` record
    per image, made from strings and numbers without a SampleSpec on the way."""
    root, name, label, real_root, follow = job
    problems: list[Ignored] = []
    listing: list[tuple[str, str, list[os.DirEntry[str]]]] = []
    visited: set[tuple[int, int]] = set()
    stack = [os.path.join(root, name)]
    while stack:
        folder = stack.pop()
        rel_folder = os.path.relpath(folder, root)
        try:
            st = os.stat(folder)
            if (st.st_dev, st.st_ino) in visited:
                problems.append(Ignored(rel_folder, "folder reached twice through symbolic links", "ignored"))
                continue
            visited.add((st.st_dev, st.st_ino))
            entries = sorted(os.scandir(folder), key=_by_name)
        except OSError as e:
            problems.append(Ignored(rel_folder, f"cannot list folder: {e.strerror}", "skipped"))
            continue
        files = []
        for entry in entries:
            if entry.name.startswith("."):
                problems.append(Ignored(os.path.join(rel_folder, entry.name), "hidden", "ignored"))
            elif entry.is_dir(follow_symlinks=False) or (entry.is_symlink() and entry.is_dir()):
                if _is_dir(entry, os.path.join(rel_folder, entry.name), real_root, follow, problems):
                    stack.append(entry.path)
            else:
                files.append(entry)
        listing.append((folder, rel_folder, files))
    listing.sort(key=lambda item: item[0])
    records: list[bytes] = []
    payload = 0
    label_bytes = 2 * BLOCK  # payload_bytes of the label member
    for _folder, rel_folder, files in listing:
        prefix = rel_folder + os.sep  # not os.path.join per file: the scan's slowest step at 1.3 M files
        for entry in files:
            lower = entry.name.lower()
            rel = prefix + entry.name
            if not lower.endswith(IMAGE_EXTENSIONS):
                problems.append(Ignored(rel, "not an image file (extension)", "ignored"))
                continue
            if entry.is_symlink() and not _link_allowed(entry, rel, real_root, follow, problems):
                continue
            try:
                st = entry.stat(follow_symlinks=True)
            except OSError as e:
                problems.append(Ignored(rel, f"cannot stat: {e.strerror}", "skipped"))
                continue
            size, dot = st.st_size, rel.rfind(".")
            # what SpecTable.append stores for SampleSpec(name=stem, identity=rel, label, class
            # name, files=(SourceFile(ext, rel, size, mtime, is_image=True),))
            records.append(
                pack_record(
                    rel[:dot], rel, label, name, ((rel[dot + 1 :].lower(), rel, size, st.st_mtime_ns, True, None),)
                )
            )
            payload += label_bytes + member_size(size)
    return b"".join(records), array("q", accumulate(map(len, records))), payload, problems


def _by_name(entry: os.DirEntry[str]) -> str:
    return entry.name
