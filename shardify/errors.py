"""The one exception hierarchy shared by the converter and the reader.

Messages name the file or shard and, where there is one, the sample key.
"""

from __future__ import annotations

__all__ = [
    "ShardifyError",
    "ManifestError",
    "KeyRuleError",
    "ShardFormatError",
    "InputError",
    "SampleError",
    "OutputExistsError",
]


class ShardifyError(Exception):
    """Base class of every error this package raises on purpose."""


class ManifestError(ShardifyError):
    """A manifest or split index is missing, malformed or inconsistent."""


class KeyRuleError(ShardifyError):
    """A sample key or member name breaks the key rules of the format."""


class ShardFormatError(ShardifyError):
    """A shard is truncated, malformed, or not laid out as the format requires."""

    def __init__(self, message: str, *, shard: str, key: str | None = None) -> None:
        where = f"shard {shard}" + (f", key {key!r}" if key is not None else "")
        super().__init__(f"{where}: {message}")
        self.shard = shard
        self.key = key


class InputError(ShardifyError):
    """An input of the converter (a file, a listing, a label map) is unusable."""

    def __init__(self, message: str, *, path: str, key: str | None = None) -> None:
        where = f"{path}" + (f" (key {key!r})" if key is not None else "")
        super().__init__(f"{where}: {message}")
        self.path = path
        self.key = key
        self.reason = message


class SampleError(ShardifyError):
    """A sample could not be decoded or transformed while reading."""

    def __init__(self, message: str, *, shard: str, key: str | None) -> None:
        super().__init__(f"shard {shard}, key {key!r}: {message}")
        self.shard = shard
        self.key = key
        self.reason = message


class OutputExistsError(ShardifyError):
    """The output already holds a finished split and --overwrite was not given."""
