"""Where ``shardify info`` and ``shardify verify`` find a finished dataset: what the reader accepts.

A dataset folder, its ``manifest.json`` or one split index (``train.json``), each as a local
path or a URL: ``file://``, ``s3://`` and any other fsspec URL, or ``http(s)://``. Small
files (manifest, indexes) are read whole; a shard is opened as a stream read once from the
start. Backend errors (no credentials, no bucket, refused connection) become a
:class:`~shardify.errors.ManifestError` or :class:`~shardify.errors.ShardFormatError` naming
the URL, raised with ``from``. Every file is read only when it lies in the dataset's folder
(a local one after resolving links) or under an allowed prefix, as the reader reads it
(:mod:`shardify.locations`), and a split index only when it is the one the manifest records
(:meth:`~shardify.manifest.Manifest.split_index`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

from shardify.convert.write.outfs import backend_reason
from shardify.errors import ManifestError, ShardFormatError
from shardify.jsonfiles import load_json
from shardify.locations import check_in_folder
from shardify.manifest import MANIFEST_NAME, Manifest
from shardify.remote import RetryPolicy, ShardFetchError, download, fetch_bytes
from shardify.splitindex import SplitIndex

__all__ = ["DatasetFiles", "LocatedDataset", "locate_dataset"]

_HTTP = ("http://", "https://")


class DatasetFiles:
    """Read access to the files directly in one dataset folder (a local path or a URL), and
    under the ``allow_locations`` prefixes."""

    def __init__(
        self, folder: str, *, storage_options: dict[str, Any] | None = None, allow_locations: Sequence[str] = ()
    ) -> None:
        self.folder = folder.rstrip("/") if "://" in folder else folder
        self.storage_options = dict(storage_options or {})
        self.allow_locations = tuple(allow_locations)
        self._fs: Any = None
        self._path = ""
        if folder.startswith("file://"):
            self.folder = folder[len("file://") :]
        elif "://" in folder and not folder.startswith(_HTTP):
            try:
                import fsspec
            except ImportError as e:
                raise ManifestError(f"{folder}: reading URLs needs fsspec: pip install 'shardify[remote]'") from e
            try:
                self._fs, self._path = fsspec.core.url_to_fs(self.folder, **self.storage_options)
            except (ImportError, ValueError) as e:
                raise ManifestError(f"{folder}: no storage backend for this URL: {e}") from e

    @property
    def remote(self) -> bool:
        return "://" in self.folder

    def where(self, name: str) -> str:
        """The path or URL of file ``name`` in the folder, for messages."""
        if self.remote:
            return f"{self.folder}/{name}"
        return str(Path(self.folder) / name)

    def inside(self, name: str) -> str:
        """:meth:`where` of ``name``, or :class:`~shardify.errors.LocationError` when that is
        not in the folder (a local path: once its links are resolved) nor under an allowed prefix."""
        where = self.where(name)
        check_in_folder(self.folder, where, allow=self.allow_locations)
        return where

    def read_bytes(self, name: str) -> bytes:
        """The whole of a small file; ManifestError naming it when it cannot be read."""
        where = self.inside(name)
        try:
            if self._fs is not None:
                return bytes(self._fs.cat_file(f"{self._path}/{name}"))
            if self.remote:
                try:
                    return fetch_bytes(where, retry=RetryPolicy(retries=2))
                except ShardFetchError as e:
                    raise ManifestError(f"{where}: cannot read: {e.reason}") from e
            return Path(where).read_bytes()
        except FileNotFoundError as e:
            raise ManifestError(f"{where}: not found; is this a finished shardify dataset?") from e
        except ManifestError:
            raise
        except Exception as e:  # the backend's own errors (botocore, aiohttp, OSError) have many types
            raise ManifestError(f"{where}: cannot read: {backend_reason(e)}") from e

    def read_json(self, name: str) -> dict[str, Any]:
        return load_json(self.read_bytes(name), source=self.where(name))

    def open_stream(self, name: str) -> BinaryIO:
        """Shard ``name`` open for reading from its start; ShardFormatError naming it if it cannot be
        (LocationError when it is not in the folder)."""
        where = self.inside(name)
        try:
            if self._fs is not None:
                return cast(BinaryIO, self._fs.open(f"{self._path}/{name}", "rb", block_size=1 << 22))
            if self.remote:
                return _http_copy(where)
            return open(where, "rb")  # noqa: SIM115 - the caller closes it
        except ShardFormatError:
            raise
        except OSError as e:
            raise ShardFormatError(f"cannot open: {e.strerror or e}", shard=where) from e
        except Exception as e:  # the backend's own errors
            raise ShardFormatError(f"cannot open: {backend_reason(e)}", shard=where) from e

    def names(self) -> list[str] | None:
        """The file names in the folder, or None where the store cannot list (HTTP)."""
        if self._fs is not None:
            try:
                self._fs.invalidate_cache(self._path)
                return sorted(str(n).rstrip("/").rsplit("/", 1)[-1] for n in self._fs.ls(self._path, detail=False))
            except Exception:  # a listing is a nice-to-have for verify's report
                return None
        if self.remote:
            return None
        try:
            return sorted(os.listdir(self.folder))
        except OSError:
            return None


def _http_copy(url: str) -> BinaryIO:
    """A shard fetched over HTTP into a temporary file (retried and resumed by the reader's fetcher)."""
    f = tempfile.TemporaryFile()
    try:
        download(url, f, retry=RetryPolicy())
    except ShardFetchError:
        f.close()
        raise
    f.seek(0)
    return f


@dataclass(frozen=True)
class LocatedDataset:
    """A dataset as found from what the user named: its folder's files, and either its
    manifest (a folder or ``manifest.json`` was named) or one split index (an index was named)."""

    files: DatasetFiles
    manifest: Manifest | None
    index_name: str | None
    """The file name of the one split index named, when no manifest was."""

    @property
    def splits(self) -> list[str]:
        if self.manifest is not None:
            return sorted(self.manifest.splits)
        return [self.load_split(None).split]

    def load_split(self, split: str | None) -> SplitIndex:
        """The index of ``split`` (None: the one index named); ManifestError naming the file."""
        if self.manifest is None:
            name = self.index_name or ""
            index = SplitIndex.from_json(self.files.read_json(name), source=self.files.where(name))
            if split is not None and index.split != split:
                raise ManifestError(f"{self.files.where(name)}: this index is split {index.split!r}, not {split!r}")
            return index
        if split is None:
            raise ManifestError(f"{self.files.where(MANIFEST_NAME)}: name a split; splits: {self.splits}")
        name = self.manifest.ref(split, source=self.files.where(MANIFEST_NAME)).index
        # the checks a reader makes: its split and version, its shards, totals, size and SHA-256
        return self.manifest.split_index(split, self.files.read_bytes(name), source=self.files.where(name))

    @property
    def format_version(self) -> int:
        if self.manifest is not None:
            return self.manifest.format_version
        return self.load_split(None).format_version


def locate_dataset(
    spec: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None, allow_locations: Sequence[str] = ()
) -> LocatedDataset:
    """The dataset named by ``spec``: a folder, ``manifest.json`` or a split index, local or a URL;
    its files are read in its folder only, and under the ``allow_locations`` prefixes."""
    text = os.fspath(spec)
    is_url = "://" in text and not text.startswith("file://")
    local = text[len("file://") :] if text.startswith("file://") else text
    name = text.rstrip("/").rsplit("/", 1)[-1]
    if is_url:
        named_file = name.endswith(".json")
    else:
        named_file = not Path(local).is_dir() and name.endswith(".json")
    if not named_file:
        files = DatasetFiles(text, storage_options=storage_options, allow_locations=allow_locations)
        where = files.where(MANIFEST_NAME)
        manifest = Manifest.from_json(files.read_json(MANIFEST_NAME), source=where)
        return LocatedDataset(files=files, manifest=manifest, index_name=None)
    folder = text.rstrip("/").rsplit("/", 1)[0] if is_url else str(Path(local).parent)
    files = DatasetFiles(folder, storage_options=storage_options, allow_locations=allow_locations)
    if name == MANIFEST_NAME:
        manifest = Manifest.from_json(files.read_json(MANIFEST_NAME), source=files.where(MANIFEST_NAME))
        return LocatedDataset(files=files, manifest=manifest, index_name=None)
    return LocatedDataset(files=files, manifest=None, index_name=name)
