"""Files of a dataset on disk: their SHA-256, atomic writes, and JSON read with its fields checked.

The one way manifests, indexes and records are serialized (:func:`json_bytes`) and written
(:func:`write_bytes_atomic`: a temp file in the same folder, fsync, :func:`os.replace`), and
the checks of what is read back (:func:`load_json`, :func:`json_field`), whose errors name
the file and the field.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, BinaryIO

from shardify.errors import ManifestError

__all__ = [
    "file_sha256",
    "json_bytes",
    "write_bytes_atomic",
    "write_json_atomic",
    "load_json",
    "json_field",
    "hex_field",
]


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()


def file_sha256(f: BinaryIO, *, chunk: int = 1 << 22) -> str:
    """Hex SHA-256 of the rest of ``f``: the shard checksum the split index records."""
    h = hashlib.sha256()
    while data := f.read(chunk):
        h.update(data)
    return h.hexdigest()


def json_bytes(obj: Any) -> bytes:
    """The one way manifests, indexes and records are serialized (stable, ASCII)."""
    return (json.dumps(obj, indent=1, sort_keys=False, ensure_ascii=True) + "\n").encode("ascii")


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, *, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` atomically: a temp file in the same folder, fsync, rename.

    ``fsync=False`` only for files that are checked when read (after a crash such a file may
    be empty): they are then cheaper to write and, while still in the page cache, to delete."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically."""
    write_bytes_atomic(path, json_bytes(obj))


def load_json(text: str | bytes, *, source: str) -> dict[str, Any]:
    """Parse JSON text that must hold an object; errors name ``source``."""
    try:
        obj = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise ManifestError(f"{source}: not valid JSON: {e}") from e
    if not isinstance(obj, dict):
        raise ManifestError(f"{source}: expected a JSON object, found {type(obj).__name__}")
    return obj


def json_field(obj: dict[str, Any], name: str, kind: type | tuple[type, ...], source: str) -> Any:
    """``obj[name]``, which must be there and of type ``kind``; ManifestError names ``source`` and the field."""
    if name not in obj:
        raise ManifestError(f"{source}: field {name!r} is missing")
    value = obj[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        want = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ManifestError(f"{source}: field {name!r} should be {want}, found {value!r}")
    return value


def hex_field(obj: dict[str, Any], name: str, digits: int, source: str) -> str | None:
    """The optional field ``name`` of ``obj``: ``digits`` lowercase hex digits, or None when absent."""
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) != digits or value.strip("0123456789abcdef"):
        raise ManifestError(f"{source}: field {name!r} should be {digits} lowercase hex digits, found {value!r}")
    return value
