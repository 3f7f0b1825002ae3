"""Scan ID-labelled files: ``SRC/<id>.*`` with a partition ``{split: [ids]}`` and labels ``{id: label}``.

All files of one ID make one sample, each stored under its own extension (lower-cased;
a file whose extension is ``json`` is stored as ``src.json``, since ``{key}.json`` holds
shardify's metadata). IDs without a file or without a label are skipped and reported;
files of IDs that are in no split are counted as ignored. With ``pt_to_npy``, ``.pt``/``.pth``
files are stored as ``npy`` (see :mod:`shardify.convert.inputs.tensors`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from shardify.convert.inputs.inputs import IMAGE_EXTS, Ignored, SampleSpec, Scan, SourceFile, list_input_dir
from shardify.convert.inputs.labels import label_space
from shardify.convert.inputs.tensors import PT_TO_NPY, TENSOR_EXTS
from shardify.errors import InputError, KeyRuleError
from shardify.keys import check_ext

__all__ = ["scan_ids", "load_json_file", "stored_ext"]


def load_json_file(path: str | os.PathLike[str], *, what: str) -> object:
    """Parse a JSON file; errors name the file and what it was for."""
    try:
        with open(path, "rb") as f:
            return json.load(f)
    except OSError as e:
        raise InputError(f"cannot read {what}: {e.strerror}", path=str(path)) from e
    except ValueError as e:
        raise InputError(f"{what} is not valid JSON: {e}", path=str(path)) from e


def stored_ext(ext: str) -> str:
    """The member extension a source file's extension is stored under."""
    ext = ext.lower()
    return "src.json" if ext == "json" else ext


def scan_ids(
    src: str | os.PathLike[str],
    *,
    partition: str | os.PathLike[str],
    labels: str | os.PathLike[str],
    num_classes: int | None = None,
    pt_to_npy: bool = False,
) -> dict[str, Scan]:
    """One Scan per split of the partition, in the partition's order; ``pt_to_npy``: store
    ``.pt``/``.pth`` files as field ``npy``."""
    src_path = Path(src)
    if not src_path.is_dir():
        raise InputError("not a directory (expected SRC/<id>.<ext> files)", path=str(src_path))
    parts = load_json_file(partition, what="partition")
    if not isinstance(parts, dict) or not all(isinstance(v, list) for v in parts.values()):
        raise InputError("partition should be a JSON object {split: [ids]}", path=str(partition))
    label_map = load_json_file(labels, what="labels")
    if not isinstance(label_map, dict):
        raise InputError("labels should be a JSON object {id: label}", path=str(labels))
    space = label_space(label_map.values(), source=str(labels), num_classes=num_classes)

    wanted: set[str] = set()
    for split, ids in parts.items():
        for i in ids:
            if not isinstance(i, (str, int)) or isinstance(i, bool):
                raise InputError(f"split {split!r}: ID {i!r} should be a string or an int", path=str(partition))
            wanted.add(str(i))
    files_of, problems = _files_by_id(src_path, wanted, pt_to_npy=pt_to_npy)

    scans: dict[str, Scan] = {}
    for split, ids in parts.items():
        samples: list[SampleSpec] = []
        split_problems = list(problems) if not scans else []
        seen: set[str] = set()
        for raw_id in ids:
            ident = str(raw_id)
            if ident in seen:
                split_problems.append(Ignored(ident, "ID listed twice in this split"))
                continue
            seen.add(ident)
            files = files_of.get(ident)
            if not files:
                split_problems.append(Ignored(ident, f"no file {ident}.* in the source folder"))
                continue
            if ident not in label_map or label_map[ident] in (None, ""):
                split_problems.append(Ignored(ident, "no label for this ID"))
                continue
            try:
                label, name = space.resolve(label_map[ident])
            except (ValueError, KeyError) as e:
                split_problems.append(Ignored(ident, str(e)))
                continue
            exts = [f.ext for f in files]
            if len(set(exts)) != len(exts):
                split_problems.append(Ignored(ident, f"two files would be stored as the same field: {sorted(exts)}"))
                continue
            samples.append(SampleSpec(name=ident, identity=ident, label=label, label_name=name, files=tuple(files)))
        for extra in sorted(set(map(str, label_map)) - wanted) if not scans else ():
            split_problems.append(Ignored(extra, "label for an ID that is in no split", "ignored"))
        scans[split] = Scan(
            root=str(src_path), source="ids", samples=samples, classes=list(space.classes), problems=split_problems
        )
    return scans


def _files_by_id(src: Path, wanted: set[str], *, pt_to_npy: bool) -> tuple[dict[str, list[SourceFile]], list[Ignored]]:
    """Map each wanted ID to its files; the longest ID that prefixes a name before a dot wins."""
    files_of: dict[str, list[SourceFile]] = {}
    problems: list[Ignored] = []
    entries = list_input_dir(src)
    for entry in entries:
        name = entry.name
        if name.startswith("."):
            problems.append(Ignored(name, "hidden", "ignored"))
            continue
        if entry.is_dir():
            problems.append(Ignored(name, "folder in the source folder", "ignored"))
            continue
        ident = None
        dot = name.find(".")
        while dot > 0:
            if name[:dot] in wanted:
                ident = name[:dot]
            dot = name.find(".", dot + 1)
        if ident is None:
            problems.append(Ignored(name, "file of an ID that is in no split", "ignored"))
            continue
        ext = stored_ext(name[len(ident) + 1 :])
        try:
            check_ext(ext)
        except KeyRuleError as e:
            problems.append(Ignored(name, str(e)))
            continue
        try:
            st = entry.stat()
        except OSError as e:
            problems.append(Ignored(name, f"cannot stat: {e.strerror}"))
            continue
        as_npy = pt_to_npy and ext in TENSOR_EXTS
        files_of.setdefault(ident, []).append(
            SourceFile(
                ext="npy" if as_npy else ext,
                path=name,
                size=st.st_size,
                mtime_ns=st.st_mtime_ns,
                is_image=ext in IMAGE_EXTS,
                transcode=PT_TO_NPY if as_npy else None,
            )
        )
    return files_of, problems
