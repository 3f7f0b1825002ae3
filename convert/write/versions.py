"""The versions in one output folder: which files are current, which belong to an unfinished
conversion, which to earlier versions, and which are leftovers of a killed write.

A conversion never deletes a version the manifest listed, because a reader may still be
reading it (on this machine or another); ``shardify gc`` (:func:`collect_garbage`) removes
earlier versions when the user says none is read any more. What no reader can be using is
removed by the converter itself: temporary files, and the shards of an unfinished
conversion that a different conversion replaced before it was ever listed.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field

from shardify.convert.write.outfs import WORK_DIR, OutputFS, OutputLock, is_locked, open_output
from shardify.errors import OutputError, ShardifyError
from shardify.jsonfiles import json_bytes, load_json
from shardify.manifest import MANIFEST_NAME, Manifest
from shardify.sidecar import SUFFIX, sidecar_name
from shardify.splitindex import SplitIndex
from shardify.tarfmt import VERSION_CHARS, index_name, is_temp_name, report_name, shard_of_split

__all__ = [
    "FolderState",
    "folder_state",
    "work_marker",
    "read_marker",
    "load_manifest",
    "listed_version",
    "begin_version",
    "remove_stale_shards",
    "GcResult",
    "collect_garbage",
    "stray_files",
]

_INDEX_RE = re.compile(rf"-(?P<version>[0-9a-f]{{{VERSION_CHARS}}})\.(json|cidx)\Z")
"""A versioned index file: the JSON index or the compact one."""


def work_marker(split: str) -> str:
    """The file naming the plan (fingerprint, version) an unfinished conversion of ``split`` writes."""
    return f"{WORK_DIR}/{split}/plan.json"


def read_marker(fs: OutputFS, split: str) -> dict[str, object] | None:
    """The work marker of ``split``, or None when there is none or it is unreadable."""
    name = work_marker(split)
    if not fs.exists(name):
        return None
    try:
        return load_json(fs.read_bytes(name), source=name)
    except (ShardifyError, OSError):
        return None


def load_manifest(fs: OutputFS) -> Manifest:
    """The output folder's manifest (empty when there is none yet)."""
    if not fs.exists(MANIFEST_NAME):
        return Manifest(splits={})
    where = f"{fs.location}/{MANIFEST_NAME}"
    return Manifest.from_json(load_json(fs.read_bytes(MANIFEST_NAME), source=where), source=where)


def listed_version(fs: OutputFS, split: str) -> str | None:
    """The version of ``split`` the manifest lists (None: not listed, or format 1)."""
    entry = load_manifest(fs).splits.get(split)
    return entry.version if entry is not None else None


def begin_version(
    fs: OutputFS, split: str, fingerprint: str, *, listed: str | None, version: str | None = None, **marker: object
) -> str:
    """Start or resume writing ``split`` for the conversion ``fingerprint``; return its version token.

    A work marker with the same fingerprint is an interrupted run of this conversion: its
    version and records are kept, so the rerun resumes. The work of any other unfinished
    conversion is dropped, with its shards unless its version is ``listed`` (the manifest's,
    which readers may be reading). ``version`` defaults to a token of the fingerprint chained
    with ``listed``, for writers whose plan is not known before their samples (ShardWriter,
    convert_items): writing a split again never reuses the names of the version a reader has.
    """
    found = read_marker(fs, split)
    if found is not None and found.get("fingerprint") == fingerprint and isinstance(found.get("version"), str):
        return str(found["version"])
    if found is not None:
        abandoned = found.get("version")
        if isinstance(abandoned, str) and abandoned != listed:
            for name in fs.listdir():
                shard = shard_of_split(name.removesuffix(SUFFIX), split)  # a shard or its sidecar
                if shard is not None and shard[0] == abandoned:
                    fs.remove(name)
    if found is not None or fs.exists(work_marker(split)):
        fs.remove_tree(f"{WORK_DIR}/{split}")
    if version is None:
        version = hashlib.sha256(f"{fingerprint}:{listed or ''}".encode()).hexdigest()[:VERSION_CHARS]
    fs.makedirs(f"{WORK_DIR}/{split}")
    fs.write_atomic(work_marker(split), json_bytes({"fingerprint": fingerprint, "version": version, **marker}))
    return version


def remove_stale_shards(fs: OutputFS, split: str, version: str | None, count: int) -> None:
    """Delete shards of ``version`` of ``split`` numbered ``count`` and up: an interrupted run of
    the same unlisted version that had written more shards than this one."""
    for name in fs.listdir():
        shard = shard_of_split(name.removesuffix(SUFFIX), split)  # a shard or its sidecar
        if shard is not None and shard[0] == version and shard[1] >= count:
            fs.remove(name)


@dataclass
class FolderState:
    """What each file directly under an output folder is (names relative to it)."""

    manifest: Manifest
    current: set[str] = field(default_factory=set)
    """The manifest, the listed versions' indexes, shards and sidecars, the wids copies and reports."""
    in_progress: dict[str, str] = field(default_factory=dict)
    """split -> the version an unfinished conversion is writing (its shards are kept)."""
    old: dict[str, list[str]] = field(default_factory=dict)
    """split -> files of its earlier versions, which readers opened before may still read."""
    temp: list[str] = field(default_factory=list)
    """Temporary files of writes that never finished."""

    def old_versions(self, split: str) -> list[str]:
        """The earlier versions of ``split`` still on disk (``"unversioned"`` for format 1 files)."""
        found = set()
        for name in self.old.get(split, []):
            shard = shard_of_split(name.removesuffix(SUFFIX), split)
            if shard is not None:
                found.add(shard[0] or "unversioned")
            elif m := _INDEX_RE.search(name):
                found.add(m.group("version"))
        return sorted(found)


def _old_version_of(name: str, split: str) -> str | None:
    """The version (or ``""`` for format 1) of a shard, its sidecar or a versioned index file of ``split``."""
    shard = shard_of_split(name.removesuffix(SUFFIX), split)
    if shard is not None:
        return shard[0] or ""
    if name.startswith(f"{split}-") and (m := _INDEX_RE.match(name, len(split))) is not None:
        return m.group("version")
    return None


def folder_state(fs: OutputFS) -> FolderState:
    """Classify the files of the output folder ``fs`` against its manifest and work folder."""
    manifest = load_manifest(fs)
    state = FolderState(manifest=manifest, current={MANIFEST_NAME} if fs.exists(MANIFEST_NAME) else set())
    for split, ref in manifest.splits.items():
        state.current.update({ref.index, index_name(split), report_name(split)})
        if ref.compact is not None:
            state.current.add(ref.compact.index)
        where = f"{fs.location}/{ref.index}"
        try:
            index = SplitIndex.from_json(load_json(fs.read_bytes(ref.index), source=where), source=where)
        except (ShardifyError, OSError) as e:
            raise OutputError(f"{where}: cannot read the index of split {split!r}: {e}") from e
        local = [s for s in index.shards if "/" not in s.url and "://" not in s.url]
        state.current.update(s.url for s in local)
        state.current.update(sidecar_name(s.url) for s in local if s.sidecar is not None)
    splits = set(manifest.splits)
    for split in fs.entries(WORK_DIR):
        marker = read_marker(fs, split)
        if marker is not None and isinstance(marker.get("version"), str):
            state.in_progress[split] = str(marker["version"])
            splits.add(split)
    for name in fs.listdir():
        if is_temp_name(name):
            state.temp.append(name)
            continue
        if name in state.current:
            continue
        for split in splits:
            version = _old_version_of(name, split)
            if version is not None and version != state.in_progress.get(split):
                state.old.setdefault(split, []).append(name)
                break
    return state


@dataclass
class GcResult:
    """What ``shardify gc`` removed (or, with ``dry_run``, would remove)."""

    removed: list[str]
    bytes: int
    kept_in_progress: dict[str, str]


def collect_garbage(out: str | os.PathLike[str], *, dry_run: bool = False) -> GcResult:
    """Remove earlier versions and leftovers from the dataset folder ``out``.

    Only run it when no reader still uses an earlier version: a reader whose version is gone
    raises :class:`~shardify.errors.DatasetVersionError`. Files of the versions the manifest
    lists, and shards of an unfinished conversion (which its rerun resumes), are kept.
    """
    fs = open_output(out)
    if not fs.exists(MANIFEST_NAME) and not fs.entries(WORK_DIR):
        raise OutputError(f"{fs.location}: no {MANIFEST_NAME}; not a shardify dataset folder")
    lock = OutputLock(fs)
    try:
        state = folder_state(fs)
        names = sorted(state.temp + [n for files in state.old.values() for n in files])
        total = 0
        for name in names:
            try:
                total += fs.size(name)
            except OSError:
                continue
            if not dry_run:
                fs.remove(name)
        return GcResult(removed=names, bytes=total, kept_in_progress=dict(state.in_progress))
    finally:
        lock.release()


def stray_files(root: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """``(name, why)`` for what an interrupted conversion left in the local dataset folder
    ``root``: temporary files, and a work folder. Empty while a conversion is running there."""
    if is_locked(root):
        return []
    fs = open_output(root)
    found = [
        (name, "temporary file of an interrupted write; rerunning the conversion or `shardify gc` removes it")
        for name in fs.listdir()
        if is_temp_name(name)
    ]
    if [n for n in fs.entries(WORK_DIR) if n != "lock"]:
        found.append((f"{WORK_DIR}/", "an interrupted conversion's work folder; rerun the same command to finish it"))
    return found
