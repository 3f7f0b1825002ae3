"""The one exception hierarchy shared by the converter and the reader.

Messages name the file or shard and, where there is one, the sample key.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "ShardifyError",
    "ManifestError",
    "SplitRequiredError",
    "LocationError",
    "IndexMismatchError",
    "KeyRuleError",
    "ShardFormatError",
    "DatasetVersionError",
    "SidecarError",
    "InputError",
    "SampleError",
    "SampleChecksumError",
    "FieldError",
    "OutputExistsError",
    "OutputError",
    "WorkerError",
    "CompressedDataError",
    "ArrayFormatError",
    "ObjectArrayError",
    "EncodeError",
    "DeviceDecodeError",
    "DeviceDecodeOptionsError",
    "ResumeError",
]


class ShardifyError(Exception):
    """Base class of every error this package raises on purpose."""


class ManifestError(ShardifyError):
    """A manifest or split index is missing, malformed or inconsistent."""


class SplitRequiredError(ManifestError):
    """A dataset holds several splits and none was chosen; ``splits`` lists them.

    The message names the Python argument (``split=``); the CLI names its ``--split`` flag.
    """

    def __init__(self, where: str, splits: list[str]) -> None:
        self.where, self.splits = where, list(splits)
        super().__init__(f"{where}: pass split=...; splits: {self.splits}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.where, self.splits))


class LocationError(ManifestError):
    """A manifest or split index points outside its own location (another scheme or host, a
    local path from a remote index, ``../`` above its folder) and the user did not allow it."""


class IndexMismatchError(ManifestError):
    """A split index is not the one the manifest records: its size or SHA-256, an entry (a shard
    missing, repeated, replaced or out of order), or its shard, sample or byte totals differ.
    ``split`` is the split; ``entry`` the number of the first shard entry that disagrees (None:
    the index as a whole, e.g. only its bytes differ)."""

    def __init__(self, message: str, *, split: str | None = None, entry: int | None = None) -> None:
        self.split, self.entry = split, entry
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.args[0],), {"split": self.split, "entry": self.entry})


class KeyRuleError(ShardifyError):
    """A sample key or member name breaks the key rules of the format."""


class _Located(ShardifyError):
    """An error that names where it happened; picklable, and rebuildable from its message.

    Worker processes pickle exceptions, and torch's DataLoader re-creates a worker's error
    as ``type(message)``: both must give back the same message.
    """

    def __init__(self, message: str, **where: str | None) -> None:
        self.reason = message
        for name, value in where.items():
            setattr(self, name, value)
        super().__init__(self._format(message, where) if any(v is not None for v in where.values()) else message)

    @staticmethod
    def _format(message: str, where: Mapping[str, str | None]) -> str:  # pragma: no cover - overridden
        return message

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.args[0],), {k: v for k, v in self.__dict__.items()})


class _AtShard(_Located):
    """An error located at a shard and, when known, a sample key."""

    shard: str | None = None
    key: str | None = None

    def __init__(self, message: str, *, shard: str | None = None, key: str | None = None) -> None:
        super().__init__(message, shard=shard, key=key)

    @staticmethod
    def _format(message: str, where: Mapping[str, str | None]) -> str:
        key = where.get("key")
        return f"shard {where.get('shard')}" + (f", key {key!r}" if key is not None else "") + f": {message}"


class ShardFormatError(_AtShard):
    """A shard is truncated, malformed, or not laid out as the format requires."""


class CompressedDataError(ShardFormatError):
    """A compressed shard fails its own check (a gzip CRC or length mismatch): none of its
    samples can be trusted, including those already read in full."""


class SidecarError(ShardFormatError):
    """A shard's per-sample table sidecar (``<shard>.idx``) is missing, malformed, or does not
    match the size and SHA-256 its split index records, or the shard's bytes; names the shard."""


class DatasetVersionError(ShardFormatError):
    """The version of a dataset a reader opened is gone: the dataset was converted again and
    the old version's files were removed (``shardify gc``). The message names the dataset,
    the split, the version read and the current one."""


class InputError(_Located):
    """An input of the converter (a file, a listing, a label map) is unusable."""

    path: str | None = None
    key: str | None = None

    def __init__(self, message: str, *, path: str | None = None, key: str | None = None) -> None:
        super().__init__(message, path=path, key=key)

    @staticmethod
    def _format(message: str, where: Mapping[str, str | None]) -> str:
        key = where.get("key")
        return f"{where.get('path')}" + (f" (key {key!r})" if key is not None else "") + f": {message}"


class SampleError(_AtShard):
    """A sample could not be decoded or transformed while reading."""


class SampleChecksumError(ShardFormatError, SampleError):
    """A sample's bytes do not match the checksum its split index records (changed or corrupt
    since the conversion): names the shard and the sample's key. Only that sample is bad; the
    shard's other samples are read (with ``on_error="skip"`` it is counted and skipped)."""


class FieldError(ShardifyError, ValueError):
    """The fields asked of a dataset are not among those its split holds (checked when it is built)."""


class OutputExistsError(ShardifyError):
    """The output already holds a finished split and --overwrite was not given."""


class OutputError(ShardifyError):
    """Writing the output failed (disk full, permissions); nothing was marked finished."""


class WorkerError(ShardifyError, RuntimeError):
    """A DataLoader worker process died (killed, out of memory, crashed) while reading."""


class ArrayFormatError(ShardifyError, ValueError):
    """An array or tensor cannot be stored as shardify's ``.npy``, or ``.npy`` bytes cannot be read."""


class ObjectArrayError(ArrayFormatError):
    """An object (pickled) array: refused, since loading it could run code."""


class EncodeError(ShardifyError, TypeError):
    """A sample given to the Python writer holds a value its field cannot store (type or content)."""


class DeviceDecodeError(ShardifyError, RuntimeError):
    """Decoding on the device was asked for, but what it needs (CUDA, torchvision) is missing."""


class DeviceDecodeOptionsError(ShardifyError, ValueError):
    """An option that cannot run under ``DecodeOptions(device=...)``, which decodes the images
    after the workers (``map=``, a custom ``collate_fn=``, ``bucket_length=``, a transform the
    device cannot run): refused when the dataset is made, naming the option."""


class ResumeError(ShardifyError, ValueError):
    """A resume point loaded from a saved state would be dropped or misread: the message names
    the saved epoch and batch count and the call that resumes there."""
