"""``ShardWriter``: write one split from Python, one sample at a time, in this process.

It drives the converter's one path, a :class:`~shardify.convert.write.session.ConversionSession`:
the output folder is locked as for the CLI, shards are written whole and renamed
(:class:`~shardify.convert.write.shardstream.ShardStream`), and only when the ``with`` block ends
without an exception are the report, the split index and ``manifest.json`` written.
An exception inside the block leaves no finished split.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any

from shardify.convert.options import DEFAULT_SHARD_SIZE, check_chunk, parse_size
from shardify.convert.pyapi.values import ValueOptions, encode_sample, sample_key
from shardify.convert.write.identity import converter_info as _converter_info
from shardify.convert.write.identity import fingerprint
from shardify.convert.write.outfs import undone_on_failure
from shardify.convert.write.session import ConversionSession, SplitSummary
from shardify.convert.write.shardstream import ShardStream, sample_size
from shardify.convert.write.shardtypes import ShardResult
from shardify.errors import EncodeError, KeyRuleError
from shardify.suggest import suggest_keywords

__all__ = ["WriteOptions", "ShardWriter", "KeyRegistry", "check_label", "converter_info", "who"]


@suggest_keywords
@dataclass(frozen=True, kw_only=True)
class WriteOptions:
    """Options of a split written from Python; those in :meth:`shaping` change the bytes."""

    split: str = "train"
    shard_size: int | str | None = DEFAULT_SHARD_SIZE
    """Bound on shard size: bytes, or a string with units (``"256MB"``, ``"1GiB"``)."""
    samples_per_shard: int | None = None
    classes: tuple[str, ...] = ()
    """Names of the ``cls`` labels (``classes[i]`` names label ``i``); ``cls`` must be below its length."""
    values: ValueOptions = field(default_factory=ValueOptions)
    overwrite: bool = False
    fsync: bool = True
    storage_options: Mapping[str, Any] | None = None
    """The fsspec backend's options for an ``out`` URL (credentials, ``endpoint_url``, ...)."""
    chunk: int | None = None
    """Samples per chunk: the chunked layout (docs/format.md), for small samples; None: one tar
    sample per sample (what webdataset and Hugging Face read)."""

    def __post_init__(self) -> None:
        if isinstance(self.shard_size, str):
            object.__setattr__(self, "shard_size", parse_size(self.shard_size))
        if not isinstance(self.classes, tuple):
            object.__setattr__(self, "classes", tuple(self.classes))
        if self.shard_size is None and self.samples_per_shard is None:
            raise ValueError("one of shard_size and samples_per_shard should be set")
        if self.shard_size is not None and int(self.shard_size) < 4096:
            raise ValueError(f"shard_size={self.shard_size} should be at least 4096 bytes")
        if self.samples_per_shard is not None and self.samples_per_shard < 1:
            raise ValueError(f"samples_per_shard={self.samples_per_shard} should be >= 1")
        check_chunk(self.chunk)
        if not all(isinstance(c, str) for c in self.classes):
            raise ValueError(f"classes should be names (str), found {self.classes[:5]!r}")

    @property
    def size_bound(self) -> int | None:
        return None if self.shard_size is None else int(self.shard_size)

    def shaping(self) -> dict[str, Any]:
        """The options that decide the output bytes; recorded in the split index."""
        return {
            "split": self.split,
            "shard_size": self.size_bound,
            "samples_per_shard": self.samples_per_shard,
            "quality": self.values.quality,
            **({} if self.chunk is None else {"chunk": self.chunk}),
        }


class KeyRegistry:
    """Every key of a split with the index of the sample it came from, to refuse duplicates naming both."""

    def __init__(self, noun: str = "sample") -> None:
        self.noun = noun
        self.owner: dict[str, int] = {}

    def add(self, key: str, index: int) -> None:
        first = self.owner.setdefault(key, index)
        if first != index:
            raise KeyRuleError(
                f"{self.noun} {index} and {self.noun} {first} have the same key {key!r}; keys must be unique in a split"
            )


def check_label(members: list[tuple[str, bytes]], classes: Sequence[str]) -> None:
    """With class names, a ``cls`` member must be an index into them."""
    if not classes:
        return
    for ext, data in members:
        if ext == "cls":
            try:
                label = int(data)
            except ValueError:
                raise EncodeError(f"field 'cls': {data[:20]!r} is not an int label") from None
            if not 0 <= label < len(classes):
                raise EncodeError(
                    f"field 'cls': label {label} is outside 0..{len(classes) - 1} ({len(classes)} classes)"
                )


class ShardWriter:
    """Write samples (dicts of field -> value, optional ``__key__``) into split ``split`` of ``out``.

    ``with ShardWriter("out/audio", split="train", shard_size="256MB") as w: w.write({...})``.
    Options are :class:`WriteOptions` fields, as keywords or ``options=``. The split is
    finished (index and manifest written) when the block ends without an exception; after
    one, no finished split is left and the lock is released.
    """

    def __init__(self, out: str | os.PathLike[str], *, options: WriteOptions | None = None, **overrides: Any) -> None:
        self.options = replace(options or WriteOptions(), **overrides)
        self.out = out
        self.count = 0
        self.summary: SplitSummary | None = None
        self._session: ConversionSession | None = None
        self._stream: ShardStream | None = None
        self._results: list[ShardResult] = []
        self._keys = KeyRegistry()

    def __enter__(self) -> ShardWriter:
        self.open()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is None:
            self.close()
        else:
            self.abort()

    def open(self) -> None:
        """Lock the output folder and start the first shard (``with`` does this)."""
        if self._session is not None:
            raise RuntimeError("this ShardWriter is already open")
        o = self.options
        fp = _fingerprint(o)
        session = self._session = ConversionSession.open(
            self.out, {o.split: fp}, overwrite=o.overwrite, storage_options=o.storage_options
        )
        try:
            version = session.begin(o.split, fp, kind="writer")
            self._stream = session.stream(
                o.split,
                version,
                shard_size=o.size_bound,
                samples_per_shard=o.samples_per_shard,
                fsync=o.fsync,
                chunk=o.chunk,
                on_shard=self._results.append,
            )
        except BaseException:
            self._release()
            raise

    def write(self, sample: Mapping[str, object]) -> str:
        """Encode and append one sample; return its key. Errors name the sample."""
        stream = self._stream
        if stream is None:
            raise RuntimeError("write() outside the ShardWriter's with block (or after close)")
        index = self.count
        try:
            key, original = sample_key(sample, index)
            members = encode_sample(sample, key, original, self.options.values)
            check_label(members, self.options.classes)
        except EncodeError as e:
            raise EncodeError(f"{who(sample, index)}: {e}") from e
        self._keys.add(key, index)
        stream.add(key, members, sample_size(members))
        self.count += 1
        return key

    def close(self) -> SplitSummary:
        """Finish the last shard, then write the report, the split index and the manifest."""
        stream, session = self._stream, self._session
        if stream is None or session is None:
            if self.summary is not None:
                return self.summary
            raise RuntimeError("close() of a ShardWriter that was never opened")
        try:
            with undone_on_failure(session.fs, self.abort):
                o = self.options
                session.end_stream(o.split, stream)
                index = session.finish(
                    o.split,
                    self._results,
                    classes=o.classes,
                    skipped=stream.skipped,
                    ignored=[],
                    converter=converter_info("python", o.shaping()),
                    version=stream.version,
                    chunk=o.chunk,
                    durable=o.fsync,
                )
                session.publish()
                self.summary = session.summary(index, stream.skipped, reused=0)
                return self.summary
        finally:
            self._release()

    def abort(self) -> None:
        """Drop the open shard and release the folder without finishing the split."""
        if self._stream is not None:
            self._stream.abort()
        self._release()

    def _release(self) -> None:
        self._stream = None
        if self._session is not None:
            try:
                self._session.release()
            except OSError:
                pass


def who(sample: object, index: int, noun: str = "sample") -> str:
    """How errors name a sample: its index, and its ``__key__`` when it has one."""
    given = sample.get("__key__") if isinstance(sample, Mapping) else None
    return f"{noun} {index}" + (f" (__key__ {given!r})" if given is not None else "")


def converter_info(source: str, shaping: dict[str, Any]) -> dict[str, Any]:
    """The split index's ``converter`` section for a split written from Python."""
    return _converter_info(source, shaping, chunk=shaping.get("chunk"))


def _fingerprint(o: WriteOptions) -> str:
    """What makes a ShardWriter's output: the format, the converter and the shaping options.
    The samples come later, so a rewrite with other samples gets a new version by chaining
    (:func:`~shardify.convert.write.versions.begin_version`)."""
    return str(fingerprint(writer="python", options=o.shaping(), classes=list(o.classes)).hexdigest())
