"""One conversion session: the one path every way into the writer drives.

The command line's planned conversion (:func:`~shardify.convert.write.run.convert_scans`),
``ShardWriter`` and ``convert_items`` all open a :class:`ConversionSession` on the output and go
through the same steps, each written once here:

1. **lock** the output folder, removing what an interrupted run left, and refuse splits finished
   there unless ``overwrite`` or this very conversion is finishing them (:meth:`ConversionSession.open`);
2. **begin** each split with its fingerprint (:mod:`~shardify.convert.write.identity`'s one rule):
   the version token and the work marker, resuming an interrupted run of the same conversion
   (:meth:`~ConversionSession.begin`);
3. **record** each finished shard and, on a rerun, **reuse** those whose bytes match their record;
4. **finish** each split: the report and the split index of its version (:meth:`~ConversionSession.finish`);
5. **publish** the finished splits at once: ``manifest.json`` is switched last, so no half-written
   dataset ever looks complete (:meth:`~ConversionSession.publish`), and release the lock.

An error while the session is held is raised naming the output, saying nothing was marked
finished (a rerun resumes), and the lock is released (:meth:`~ConversionSession.holding`).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardify.convert.inputs.inputs import Ignored
from shardify.convert.write.finish import finish_split, publish_splits
from shardify.convert.write.outfs import WORK_DIR, OutputFS, OutputLock, open_output, output_failed, undone_on_failure
from shardify.convert.write.shardstream import ShardStream
from shardify.convert.write.shardtypes import ShardResult
from shardify.convert.write.versions import begin_version, folder_state, listed_version, load_manifest, read_marker
from shardify.errors import OutputError, OutputExistsError, ShardifyError
from shardify.jsonfiles import file_sha256, load_json
from shardify.splitindex import SplitIndex
from shardify.tarfmt import check_split_name, is_temp_name

__all__ = ["ConversionSession", "SplitSummary", "ConvertResult", "record_name", "shard_matches"]


@dataclass
class SplitSummary:
    """What a conversion did to one split."""

    split: str
    samples: int
    shards: int
    bytes: int
    skipped: list[Ignored]
    ignored: dict[str, int]
    notes: list[str]
    reused_shards: int
    seconds: float
    noted: list[Ignored] = field(default_factory=list)
    """Inputs packed with a decoder warning (in the report as ``note``)."""


@dataclass
class ConvertResult:
    out_dir: str
    splits: dict[str, SplitSummary] = field(default_factory=dict)

    @property
    def num_skipped(self) -> int:
        return sum(len(s.skipped) for s in self.splits.values())


def record_name(split: str, index: int) -> str:
    """Where the record of finished shard ``index`` of ``split`` is kept until the split is published."""
    return f"{WORK_DIR}/{split}/{index:06d}.json"


def shard_matches(fs: OutputFS, result: ShardResult) -> bool:
    """Whether the finished shard a resume record describes is there, with its size and SHA-256."""
    if fs.size(result.url) != result.filesize:
        return False
    with fs.open_read(result.url) as f:
        return file_sha256(f) == result.sha256


Guard = Callable[[int, int, str], None]
"""``check(index, size, sha256)`` of a shard written again for a version the manifest lists."""


class ConversionSession:
    """A locked output and the splits one conversion writes into it (see the module docstring)."""

    def __init__(self, fs: OutputFS, lock: OutputLock) -> None:
        self.fs = fs
        self._lock: OutputLock | None = lock
        self.indexes: dict[str, SplitIndex] = {}
        """Finished splits, published together by :meth:`publish`."""
        self._started: dict[str, float] = {}
        self._have: dict[str, set[str]] = {}
        self._listed: dict[str, int] = {}
        """Shards of the listed version a stream is finishing (a rerun after a kill past the manifest)."""

    # -- 1. lock ------------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        out: str | os.PathLike[str],
        fingerprints: Mapping[str, str],
        *,
        overwrite: bool,
        storage_options: Mapping[str, Any] | None = None,
    ) -> ConversionSession:
        """Create and lock ``out`` for the splits of ``fingerprints`` (split -> fingerprint),
        removing temp files an interrupted run left; refuse splits finished there unless
        ``overwrite`` (a finished split stays listed until its new version is published), or
        unless the manifest lists the version this very conversion's work marker names (a run
        killed after it wrote the manifest, whose rerun finishes it with the same bytes)."""
        for split in fingerprints:
            check_split_name(split)
        fs = open_output(out, storage_options=storage_options)
        try:
            fs.makedirs()
        except (FileExistsError, NotADirectoryError) as e:
            raise OutputError(
                f"{fs.location}: the output is a file (or lies under a file), not a folder; "
                "give the path of a folder to create or fill"
            ) from e
        except OSError as e:
            raise OutputError(f"{fs.location}: cannot create output folder: {e.strerror or e}") from e
        lock = OutputLock(fs)
        with undone_on_failure(fs, lock.release):
            _remove_temp_files(fs)
            manifest = load_manifest(fs)
            finished = [
                s for s, fp in fingerprints.items() if s in manifest.splits and not _finishing(fs, manifest, s, fp)
            ]
            if finished and not overwrite:
                raise OutputExistsError(
                    f"{fs.location}: split(s) {finished} are already finished there; pass --overwrite to replace them"
                )
        return cls(fs, lock)

    @contextlib.contextmanager
    def holding(self) -> Iterator[ConversionSession]:
        """Write under the lock, released at the end; an OSError or OutputError is raised as an
        OutputError saying nothing was marked finished."""
        try:
            yield self
        except OSError as e:
            raise output_failed(self.fs, e) from e
        except OutputError as e:
            raise OutputError(f"{e}; nothing was marked finished, rerun to resume") from e
        finally:
            self.release()

    def release(self) -> None:
        """Unlock the output (once; later calls do nothing)."""
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

    # -- 2. begin -----------------------------------------------------------------------------
    def begin(self, split: str, fingerprint: str, *, version: str | None = None, **marker: object) -> str:
        """Start or resume ``split`` for the conversion ``fingerprint``; return its version token
        (``version``, or one chained from the fingerprint and the listed version)."""
        self._started[split] = time.monotonic()
        found = begin_version(
            self.fs, split, fingerprint, listed=listed_version(self.fs, split), version=version, **marker
        )
        self._have[split] = set(self.fs.listdir(f"{WORK_DIR}/{split}"))
        return found

    def listed_guard(self, split: str, version: str | None) -> tuple[Guard | None, int]:
        """When ``version`` is the one the manifest lists for ``split`` (finishing a run killed after
        its manifest), ``(check, shards)``: ``check(index, size, sha256)`` refuses a shard written
        again that differs from the listed one, since readers may be reading it; ``shards``, how
        many the listed version has. ``(None, 0)`` otherwise."""
        fs = self.fs
        ref = load_manifest(fs).splits.get(split)
        if version is None or ref is None or ref.version != version:
            return None, 0
        where = f"{fs.location}/{ref.index}"
        listed = SplitIndex.from_json(load_json(fs.read_bytes(ref.index), source=where), source=where)
        want = [(e.filesize, e.sha256) for e in listed.shards]

        def check(index: int, size: int, sha256: str) -> None:
            if index >= len(want) or want[index] != (size, sha256):
                raise OutputError(
                    f"{fs.location}: shard {index} of split {split!r} written again differs from the one the "
                    f"manifest already lists for version {version} (the input changed since the run that was "
                    "killed after writing the manifest); a listed version is never changed in place: pass "
                    "overwrite=True to write a new version"
                )

        return check, len(want)

    def stream(
        self,
        split: str,
        version: str,
        *,
        shard_size: int | None,
        samples_per_shard: int | None,
        fsync: bool,
        chunk: int | None,
        first: int = 0,
        on_shard: Callable[[ShardResult], None] | None = None,
    ) -> ShardStream:
        """The shards of ``split`` cut as samples come (``ShardWriter``, ``convert_items``), from
        shard ``first`` on; guarded by :meth:`listed_guard` when finishing a listed version."""
        guard, self._listed[split] = self.listed_guard(split, version)
        return ShardStream(
            self.fs,
            split,
            shard_size=shard_size,
            samples_per_shard=samples_per_shard,
            fsync=fsync,
            first=first,
            on_shard=on_shard,
            version=version,
            chunk=chunk,
            before_rename=guard,
        )

    def end_stream(self, split: str, stream: ShardStream) -> None:
        """Finish the stream's last shard; when finishing a listed version, refuse a split of
        another number of shards than that version's."""
        stream.close_shard()
        if stream.before_rename is not None and stream.index != self._listed.get(split, 0):
            stream.before_rename(stream.index, 0, "")  # fewer shards than the listed version: refused

    # -- 3. records ---------------------------------------------------------------------------
    def record(self, split: str, result: ShardResult, **extra: object) -> None:
        """Record a finished shard for resuming (``extra``: what the way in needs besides).

        Not fsynced: :meth:`reusable` trusts a record only when the shard's size and SHA-256
        match it, so a record lost (or left empty) by a crash costs only a rewrite of its shard,
        and the ~3 ms an fsynced file takes to delete is not paid per shard when the work folder
        is removed. Compact JSON (the C encoder): a record of ``convert_items`` lists every key."""
        data = json.dumps({**result.to_record(), **extra}, separators=(",", ":")).encode("ascii")
        self.fs.write_atomic(record_name(split, result.index), data, durable=False)

    def reusable(self, split: str, index: int) -> tuple[ShardResult, dict[str, Any]] | None:
        """The result of shard ``index`` of ``split`` as an earlier run of the same conversion
        recorded it, with the record, when the shard is there with the recorded bytes; else None."""
        name = record_name(split, index)
        if name.rsplit("/", 1)[1] not in self._have.get(split, ()):
            return None
        try:
            record = load_json(self.fs.read_bytes(name), source=name)
            result = ShardResult.from_record(index, record)
            return (result, record) if shard_matches(self.fs, result) else None
        except (ShardifyError, OSError, KeyError, TypeError, ValueError):
            return None

    # -- 4. finish ----------------------------------------------------------------------------
    def finish(self, split: str, ordered: Sequence[ShardResult], **index: Any) -> SplitIndex:
        """Write the report and the split index (:func:`~shardify.convert.write.finish.finish_split`'s
        keywords); the split is published with the others by :meth:`publish`."""
        self.indexes[split] = finish_split(self.fs, split, ordered, **index)
        return self.indexes[split]

    def summary(
        self,
        index: SplitIndex,
        skipped: Sequence[Ignored],
        *,
        reused: int,
        notes: Sequence[str] = (),
        noted: Sequence[Ignored] = (),
    ) -> SplitSummary:
        """The :class:`SplitSummary` of a finished split."""
        return SplitSummary(
            split=index.split,
            samples=index.num_samples,
            shards=len(index.shards),
            bytes=index.num_bytes,
            skipped=list(skipped),
            ignored=dict(index.ignored),
            notes=list(notes),
            reused_shards=reused,
            seconds=time.monotonic() - self._started.get(index.split, time.monotonic()),
            noted=list(noted),
        )

    # -- 5. publish ---------------------------------------------------------------------------
    def publish(self) -> None:
        """Switch ``manifest.json`` to every finished split's version at once (written last)."""
        publish_splits(self.fs, self.indexes)

    def note_old_versions(self, summaries: Mapping[str, SplitSummary]) -> None:
        """Tell the user which earlier versions are kept for readers, and how to remove them."""
        fs = self.fs
        try:
            state = folder_state(fs)
            sizes = {split: sum(fs.size(n) for n in names) for split, names in state.old.items()}
        except (ShardifyError, OSError):  # another split's index is unreadable: only the note is lost
            return
        for split, summary in summaries.items():
            old = state.old_versions(split)
            if old:
                summary.notes.append(
                    f"earlier version(s) {', '.join(old)} of split {split!r} kept ({sizes[split] / 1e6:.1f} MB) for "
                    f"readers that opened them; when none is left, `shardify gc {fs.location}` removes them"
                )


def _finishing(fs: OutputFS, manifest: Any, split: str, fingerprint: str) -> bool:
    """Whether the manifest already lists the version that ``split``'s work marker of the same
    ``fingerprint`` names: a run of this very conversion killed after it wrote the manifest."""
    marker = read_marker(fs, split)
    return (
        marker is not None
        and marker.get("fingerprint") == fingerprint
        and manifest.splits[split].version == marker.get("version")
    )


def _remove_temp_files(fs: OutputFS) -> None:
    """Delete temporary files an interrupted run left (only this run, holding the lock, writes them)."""
    for name in fs.listdir():
        if is_temp_name(name):
            fs.remove(name)
