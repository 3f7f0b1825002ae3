"""The library API of the converter: scan, plan, write (resumably), then finalize.

Finalize order is what makes a half-written dataset impossible to mistake for a finished
one: shards are renamed into place when whole, the report and split index come next, and
the top-level ``manifest.json`` (the only thing readers trust) is written last.

Every file of a conversion but the manifest, the report and the wids copy of the index
carries the plan's version token in its name (:attr:`SplitPlan.version`), so converting
again (``overwrite``) never changes bytes a reader of the previous version may be reading:
the manifest switches to the new version at once, and earlier versions stay until
``shardify gc`` (:mod:`shardify.convert.write.versions`). The same conversion gets the same names,
so a rerun after a kill resumes and ends byte-identical, also when the kill came after the
manifest was written.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from shardify import CHUNKED_FORMAT_VERSION, FORMAT_VERSION, __version__
from shardify.convert.inputs.ids import scan_ids
from shardify.convert.inputs.imagefolder import scan_imagefolder
from shardify.convert.inputs.inputs import Ignored, Scan
from shardify.convert.inputs.labels import int_labels
from shardify.convert.inputs.listing import scan_listing
from shardify.convert.options import ConvertOptions
from shardify.convert.write.engine import ProgressBar, run_local
from shardify.convert.write.engine_ray import run_ray
from shardify.convert.write.outfs import WORK_DIR, OutputFS, OutputLock, open_output, output_failed, undone_on_failure
from shardify.convert.write.plan import ShardPlan, SplitPlan, plan_split
from shardify.convert.write.versions import begin_version, folder_state, load_manifest, read_marker, remove_stale_shards
from shardify.convert.write.writer import ShardResult, ShardTask
from shardify.errors import InputError, OutputError, OutputExistsError, ShardifyError
from shardify.manifest import (
    MANIFEST_NAME,
    Manifest,
    RawPixels,
    ShardEntry,
    SplitIndex,
    file_sha256,
    index_name,
    is_temp_name,
    json_bytes,
    load_json,
    report_name,
)
from shardify.tarfmt import check_split_name

__all__ = [
    "SplitSummary",
    "ConvertResult",
    "convert_imagefolder",
    "convert_ids",
    "convert_listing",
    "convert_scans",
    "open_locked",
    "holding",
    "publish_splits",
    "finish_split",
    "record_name",
    "shard_matches",
    "WORK_DIR",
]


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


def convert_imagefolder(
    src: str | os.PathLike[str], out: str | os.PathLike[str], *, options: ConvertOptions
) -> ConvertResult:
    """Convert an ImageFolder tree into split ``options.split`` of the dataset at ``out``."""
    scan = scan_imagefolder(src, follow_symlinks=options.follow_symlinks, workers=options.workers)
    return convert_scans({options.split: scan}, out, options=options)


def convert_ids(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    partition: str | os.PathLike[str],
    labels: str | os.PathLike[str],
    options: ConvertOptions,
    pt_to_npy: bool = False,
) -> ConvertResult:
    """Convert ID-labelled files; every split of the partition is written.

    ``pt_to_npy``: store each ``.pt``/``.pth`` file (one tensor) as ``.npy``, decoded ~80x faster than ``torch.load``.
    """
    scans = scan_ids(src, partition=partition, labels=labels, num_classes=options.num_classes, pt_to_npy=pt_to_npy)
    return convert_scans(scans, out, options=options)


def convert_listing(
    listing: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    root: str | os.PathLike[str] | None = None,
    fmt: str | None = None,
    options: ConvertOptions,
) -> ConvertResult:
    """Convert a CSV/JSONL listing; rows go to their ``split`` column or ``options.split``."""
    scans = scan_listing(
        listing,
        root=root,
        default_split=options.split,
        fmt=fmt,
        num_classes=options.num_classes,
        workers=options.workers,
    )
    return convert_scans(scans, out, options=options)


def open_locked(
    out: str | os.PathLike[str],
    splits: Collection[str],
    *,
    overwrite: bool,
    finishing: Callable[[OutputFS, Manifest, str], bool] = lambda fs, manifest, split: False,
    storage_options: Mapping[str, Any] | None = None,
) -> tuple[OutputFS, OutputLock]:
    """Create and lock ``out``, removing temp files an interrupted run left; refuse splits
    finished there unless ``overwrite`` (a finished split stays listed until its new version
    is published) or ``finishing`` says this very conversion is finishing it.

    The caller writes the splits, then calls :func:`publish_splits`, and releases the lock.
    """
    for split in splits:
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
        finished = [s for s in splits if s in manifest.splits and not finishing(fs, manifest, s)]
        if finished and not overwrite:
            raise OutputExistsError(
                f"{fs.location}: split(s) {finished} are already finished there; pass --overwrite to replace them"
            )
    return fs, lock


@contextlib.contextmanager
def holding(fs: OutputFS, lock: OutputLock) -> Iterator[None]:
    """Write splits under ``lock`` (from :func:`open_locked`), released at the end; an
    OSError or OutputError is raised as an OutputError saying nothing was marked finished."""
    try:
        yield
    except OSError as e:
        raise output_failed(fs, e) from e
    except OutputError as e:
        raise OutputError(f"{e}; nothing was marked finished, rerun to resume") from e
    finally:
        lock.release()


def publish_splits(fs: OutputFS, indexes: dict[str, SplitIndex]) -> None:
    """Switch ``manifest.json`` (written last) to the finished splits' versions, then write the
    unversioned copy of each index that wids opens and drop the splits' work folders."""
    manifest = load_manifest(fs)
    for split, index in indexes.items():
        manifest = manifest.with_split(split, index)
    fs.sync_root()
    fs.write_atomic(MANIFEST_NAME, json_bytes(manifest.to_json()))  # the switch to the new versions
    for split, index in indexes.items():  # the copy wids opens: the same bytes
        fs.write_atomic(index_name(split), json_bytes(index.to_json()))
    for split in indexes:
        fs.remove_tree(f"{WORK_DIR}/{split}")


def convert_scans(scans: dict[str, Scan], out: str | os.PathLike[str], *, options: ConvertOptions) -> ConvertResult:
    """Write every scanned split into ``out``, resuming from finished shards of an earlier run."""
    plans = {split: plan_split(scan, replace(options, split=split)) for split, scan in scans.items()}
    fs, lock = open_locked(
        out,
        scans,
        overwrite=options.overwrite,
        storage_options=options.storage_options,
        finishing=lambda fs, manifest, split: _finishing(fs, manifest, plans[split]),
    )
    with holding(fs, lock):
        result = ConvertResult(out_dir=fs.location)
        indexes: dict[str, SplitIndex] = {}
        for split, scan in scans.items():
            summary, index = _convert_split(scan, plans[split], fs, replace(options, split=split))
            result.splits[split] = summary
            indexes[split] = index
        publish_splits(fs, indexes)
        _note_old_versions(fs, result)
        return result


def _finishing(fs: OutputFS, manifest: Manifest, plan: SplitPlan) -> bool:
    """Whether the manifest already lists ``plan``'s version of its split while the work folder
    still holds that plan: a run of the same conversion killed after it wrote the manifest,
    whose rerun finishes it (the same bytes again) instead of refusing."""
    marker = read_marker(fs, plan.split)
    return (
        manifest.splits[plan.split].version == plan.version
        and marker is not None
        and marker.get("fingerprint") == plan.fingerprint
    )


def resumes_listed(fingerprint: str) -> Callable[[OutputFS, Manifest, str], bool]:
    """``finishing`` for :func:`open_locked` of a writer whose plan is known only by its
    ``fingerprint`` (ShardWriter, convert_items): the manifest already lists the version that
    the work folder's marker of the same fingerprint names, i.e. a run of this very call was
    killed after it wrote the manifest, and its rerun finishes it instead of being refused."""

    def finishing(fs: OutputFS, manifest: Manifest, split: str) -> bool:
        marker = read_marker(fs, split)
        return (
            marker is not None
            and marker.get("fingerprint") == fingerprint
            and manifest.splits[split].version == marker.get("version")
        )

    return finishing


def listed_guard(fs: OutputFS, split: str, version: str | None) -> tuple[Callable[[int, int, str], None] | None, int]:
    """When ``version`` is the one the manifest lists for ``split`` (finishing a run killed after
    its manifest), ``(check, shards)``: ``check(index, size, sha256)`` refuses a shard written
    again that differs from the listed one, since readers may be reading it; ``shards``, how many
    the listed version has. ``(None, 0)`` otherwise."""
    manifest = load_manifest(fs)
    ref = manifest.splits.get(split)
    if version is None or ref is None or ref.version != version:
        return None, 0
    where = f"{fs.location}/{ref.index}"
    listed = SplitIndex.from_json(load_json(fs.read_bytes(ref.index), source=where), source=where)
    want = [(e.filesize, e.sha256) for e in listed.shards]

    def check(index: int, size: int, sha256: str) -> None:
        if index >= len(want) or want[index] != (size, sha256):
            raise OutputError(
                f"{fs.location}: shard {index} of split {split!r} written again differs from the one the manifest "
                f"already lists for version {version} (the input changed since the run that was killed after "
                "writing the manifest); a listed version is never changed in place: pass overwrite=True to write "
                "a new version"
            )

    return check, len(want)


def _remove_temp_files(fs: OutputFS) -> None:
    """Delete temporary files an interrupted run left (only this run, holding the lock, writes them)."""
    for name in fs.listdir():
        if is_temp_name(name):
            fs.remove(name)


def _note_old_versions(fs: OutputFS, result: ConvertResult) -> None:
    """Tell the user which earlier versions are kept for readers, and how to remove them."""
    try:
        state = folder_state(fs)
        sizes = {split: sum(fs.size(n) for n in names) for split, names in state.old.items()}
    except (ShardifyError, OSError):  # another split's index is unreadable: only the note is lost
        return
    for split, summary in result.splits.items():
        old = state.old_versions(split)
        if old:
            size = sizes[split]
            summary.notes.append(
                f"earlier version(s) {', '.join(old)} of split {split!r} kept ({size / 1e6:.1f} MB) for readers "
                f"that opened them; when none is left, `shardify gc {fs.location}` removes them"
            )


def shard_matches(fs: OutputFS, result: ShardResult) -> bool:
    """Whether the finished shard a resume record describes is there, with its size and SHA-256."""
    if fs.size(result.url) != result.filesize:
        return False
    with fs.open_read(result.url) as f:
        return file_sha256(f) == result.sha256


def record_name(split: str, index: int) -> str:
    """Where the record of finished shard ``index`` of ``split`` is kept until the split is published."""
    return f"{WORK_DIR}/{split}/{index:06d}.json"


def _load_reusable(fs: OutputFS, plan: SplitPlan, current: str | None) -> dict[int, ShardResult]:
    """Finished shards of an earlier run of the same plan, each checked against its record.

    An unfinished run of another plan is dropped, with its shards unless its version is
    ``current`` (the manifest's): a version never listed was never read by anyone."""
    begin_version(fs, plan.split, plan.fingerprint, listed=current, version=plan.version, shards=plan.num_shards)
    have = set(fs.listdir(f"{WORK_DIR}/{plan.split}"))
    reusable: dict[int, ShardResult] = {}
    for shard in range(plan.num_shards):
        record = record_name(plan.split, shard)
        if record.rsplit("/", 1)[1] not in have:
            continue
        try:
            result = ShardResult.from_record(shard, load_json(fs.read_bytes(record), source=record))
            if shard_matches(fs, result):
                reusable[shard] = result
        except (ShardifyError, OSError, KeyError, TypeError, ValueError):
            continue
    return reusable


def _save_record(fs: OutputFS, split: str, r: ShardResult) -> None:
    """Record a finished shard for resuming. Not fsynced: :func:`_load_reusable` trusts a record
    only when the shard's size and SHA-256 match it, so a record lost (or left empty) by a
    crash costs only a rewrite of its shard, and the ~3 ms an fsynced file takes to delete
    here is not paid per shard when the work folder is removed."""
    fs.write_atomic(record_name(split, r.index), durable=False, data=json_bytes(r.to_record()))


def _convert_split(
    scan: Scan, plan: SplitPlan, fs: OutputFS, options: ConvertOptions
) -> tuple[SplitSummary, SplitIndex]:
    started = time.monotonic()
    split = options.split
    if options.strict:
        bad = [p for p in scan.problems if p.kind == "skipped"]
        if bad:
            raise InputError(bad[0].reason, path=bad[0].path)
    current = load_manifest(fs).splits.get(split)
    results = _load_reusable(fs, plan, current.version if current is not None else None)
    reused = len(results)
    todo = _Tasks(
        plan,
        [i for i in range(plan.num_shards) if i not in results],
        ShardTask(
            out_dir=fs.location,
            root=scan.root,
            split=split,
            plan=ShardPlan(-1, (), (), 0),
            check_full=options.check == "full",
            max_side=options.max_side,
            quality=options.quality,
            strict=options.strict,
            fsync=options.fsync,
            max_pixels=options.max_pixels,
            version=plan.version,
            max_image_bytes=options.max_image_bytes,
            image_format=options.image_format,
            storage_options=options.storage_options,
            raw_pixels=options.raw_pixels,
            raw_side=options.raw_side,
            chunk=options.chunk,
        ),
    )
    done_samples = sum(n for i, n in enumerate(plan.shard_sizes) if i in results)
    done_bytes = sum(r.filesize for r in results.values())
    bar = ProgressBar(
        total=plan.num_samples, desc=split, enabled=options.progress, done=done_samples, done_bytes=done_bytes
    )

    def finished(r: ShardResult) -> None:
        _save_record(fs, split, r)
        results[r.index] = r

    try:
        if options.engine == "ray":
            run_ray(todo, address=options.ray_address, bar=bar, on_result=finished)
        else:
            run_local(todo, workers=options.num_workers, bar=bar, on_result=finished)
    finally:
        bar.close()
    ordered = [results[i] for i in range(plan.num_shards)]
    skipped = [p for p in scan.problems if p.kind == "skipped"] + [s for r in ordered for s in r.skipped]
    ignored = [p for p in scan.problems if p.kind == "ignored"]
    notes = [n for r in ordered for n in r.notes]
    if not any(r.nsamples for r in ordered) and not options.allow_empty:
        _write_report(fs, report_name(split), skipped, ignored + notes)
        raise InputError(
            f"split {split!r}: no sample was written ({len(skipped)} skipped, {len(ignored)} ignored; reasons in "
            f"{fs.location}/{report_name(split)}); nothing was marked finished. Pass --allow-empty "
            "(allow_empty=True) to write an empty split",
            path=scan.root,
        )
    index = finish_split(
        fs,
        split,
        ordered,
        classes=scan.classes,
        skipped=skipped,
        ignored=ignored,
        notes=notes,
        converter={
            "name": "shardify",
            "version": __version__,
            "format_version": FORMAT_VERSION if options.chunk is None else CHUNKED_FORMAT_VERSION,
            "source": scan.source,
            "options": options.shaping(),
            **int_labels(scan),
        },
        version=plan.version,
        chunk=options.chunk,
        raw_pixels=None if options.raw_pixels is None else RawPixels(size=options.raw_pixels, side=options.raw_side),
    )
    summary = SplitSummary(
        split=split,
        samples=index.num_samples,
        shards=len(ordered),
        bytes=index.num_bytes,
        skipped=skipped,
        ignored=dict(index.ignored),
        notes=list(scan.notes),
        reused_shards=reused,
        seconds=time.monotonic() - started,
        noted=notes,
    )
    return summary, index


MAX_TABLE_SAMPLES = 10_000_000
"""Splits of more samples keep no per-sample table in their JSON index (28 bytes of JSON a sample:
280 MB at this count, parsed by every rank); their remote reads fetch and verify whole shards."""


def finish_split(
    fs: OutputFS,
    split: str,
    ordered: Sequence[ShardResult],
    *,
    classes: Sequence[str],
    converter: dict[str, Any],
    skipped: Sequence[Ignored],
    ignored: Sequence[Ignored],
    version: str | None,
    notes: Sequence[Ignored] = (),
    ignored_counts: dict[str, int] | None = None,
    raw_pixels: RawPixels | None = None,
    chunk: int | None = None,
) -> SplitIndex:
    """After the last shard: write the report, then the split index of ``version`` (the token
    in its shards' names, see :mod:`shardify.convert.write.versions`; None: format-1 names).

    ``notes`` (inputs packed with decoder warnings) go to the report only.
    ``ignored_counts`` adds counted-only reasons (items a user function filtered out) to the
    index's ``ignored`` counts without a report line each. ``raw_pixels``: the record of
    images stored pre-decoded (``--raw-pixels``). ``chunk``: the shards are in the
    chunked layout, that many samples a chunk (the index is then format 3).
    """
    remove_stale_shards(fs, split, version, len(ordered))
    _write_report(fs, report_name(split), list(skipped), list(ignored) + list(notes))
    counts = Counter(_reason_class(p.reason) for p in ignored)
    counts.update(ignored_counts or {})
    tables = sum(r.nsamples for r in ordered) <= MAX_TABLE_SAMPLES
    index = SplitIndex(
        split=split,
        shards=tuple(
            ShardEntry(
                url=r.url,
                nsamples=r.nsamples,
                filesize=r.filesize,
                sha256=r.sha256,
                offsets=r.offsets,
                samples=r.samples if tables else b"",
            )
            for r in ordered
        ),
        classes=tuple(classes),
        fields=tuple(sorted({f for r in ordered for f in r.fields})),
        converter=converter,
        skipped=dict(Counter(_reason_class(p.reason) for p in skipped)),
        ignored=dict(counts),
        version=version,
        raw_pixels=raw_pixels,
        chunk=chunk,
        format_version=FORMAT_VERSION if chunk is None else CHUNKED_FORMAT_VERSION,
    )
    fs.write_atomic(index_name(split, version), json_bytes(index.to_json()))
    return index


class _Tasks(Sequence[ShardTask]):
    """The tasks of the shards still to write, each made (with its samples) only when the
    engine takes it, so that a plan of millions of samples is never all in memory at once."""

    def __init__(self, plan: SplitPlan, shards: list[int], template: ShardTask) -> None:
        self.plan, self.shards, self.template = plan, shards, template

    def __len__(self) -> int:
        return len(self.shards)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return replace(self.template, plan=self.plan.shard(self.shards[i]))


def _reason_class(reason: str) -> str:
    """A reason without its per-file details, for the counts in the index."""
    return reason.split(":", 1)[0].strip()


def _write_report(fs: OutputFS, name: str, skipped: list[Ignored], ignored: list[Ignored]) -> None:
    lines = (
        json.dumps({"kind": p.kind, "path": p.path, "reason": p.reason}, ensure_ascii=True) + "\n"
        for p in skipped + ignored
    )
    fs.write_atomic(name, "".join(lines).encode("ascii"))
