"""The ``{key}.json`` member of a planned sample: its original path or ID, label name and source
files, when the key, the other members and the split index do not already say them."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from json.encoder import encode_basestring_ascii

from shardify.convert.inputs.inputs import SampleSpec

__all__ = ["metadata_json", "metadata_needed", "sample_meta"]


def metadata_json(spec: SampleSpec) -> bytes:
    """The ``{key}.json`` member: original path or ID, label name, and source files.

    Exactly ``json.dumps(meta, sort_keys=True, ensure_ascii=True, separators=(",", ":"))`` of
    ``{"path": ..., "label": ..., "files": {ext: path}}`` (see :func:`_metadata_reference`),
    written out by hand with json's own C string encoder: made once per sample, twice per
    conversion, it was the plan's largest cost at 1.3 M image files.
    """
    head = "{"
    files, identity = spec.files, spec.identity
    if files and (len(files) != 1 or files[0].path != identity):  # [f.path for f in files] != [identity]
        by_ext = {f.ext: f.path for f in files}
        head += '"files":{' + ",".join(f"{_string(ext)}:{_string(by_ext[ext])}" for ext in sorted(by_ext)) + "},"
    label = spec.label_name
    if label is not None:
        head += (
            '"label":'
            + (_string(label) if type(label) is str else str(label) if type(label) is int else _compact(label))
            + ","
        )
    return (head + '"path":' + _string(identity) + "}").encode("ascii")


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


def sample_meta(spec: SampleSpec, key: str, mode: str, classes: Sequence[str]) -> bytes | None:
    """The sample's ``{key}.json`` member under ``--metadata`` ``mode``, or None when it has none."""
    if mode == "always" or metadata_needed(spec, key, classes):
        return metadata_json(spec)
    return None
