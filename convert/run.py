"""The library API of the converter: scan, plan, write (resumably), then finalize.

Finalize order is what makes a half-written dataset impossible to mistake for a finished
one: shards are renamed into place when whole, the report and split index come next, and
the top-level ``manifest.json`` (the only thing readers trust) is written last.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from shardify import FORMAT_VERSION, __version__
from shardify.convert.engine import ProgressBar, run_local
from shardify.convert.ids import scan_ids
from shardify.convert.imagefolder import scan_imagefolder
from shardify.convert.inputs import Ignored, Scan
from shardify.convert.listing import scan_listing
from shardify.convert.options import ConvertOptions
from shardify.convert.outfs import LocalFS, OutputFS, open_output
from shardify.convert.plan import ShardPlan, SplitPlan, plan_split
from shardify.convert.writer import ShardResult, ShardTask
from shardify.errors import InputError, OutputError, OutputExistsError, ShardifyError
from shardify.manifest import (MANIFEST_NAME, Manifest, ShardEntry, SplitIndex, file_sha256, index_name, json_bytes,
                               load_json, report_name)
from shardify.tarfmt import check_split_name, parse_shard_name

__all__ = ["SplitSummary", "ConvertResult", "convert_imagefolder", "convert_ids", "convert_listing", "convert_scans"]

WORK_DIR = ".shardify-work"


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


@dataclass
class ConvertResult:
    out_dir: str
    splits: dict[str, SplitSummary] = field(default_factory=dict)

    @property
    def num_skipped(self) -> int:
        return sum(len(s.skipped) for s in self.splits.values())


def convert_imagefolder(src: str | os.PathLike[str], out: str | os.PathLike[str], *,
                        options: ConvertOptions) -> ConvertResult:
    """Convert an ImageFolder tree into split ``options.split`` of the dataset at ``out``."""
    scan = scan_imagefolder(src, follow_symlinks=options.follow_symlinks)
    return convert_scans({options.split: scan}, out, options=options)


def convert_ids(src: str | os.PathLike[str], out: str | os.PathLike[str], *, partition: str | os.PathLike[str],
                labels: str | os.PathLike[str], options: ConvertOptions) -> ConvertResult:
    """Convert ID-labelled files; every split of the partition is written."""
    scans = scan_ids(src, partition=partition, labels=labels, num_classes=options.num_classes)
    return convert_scans(scans, out, options=options)


def convert_listing(listing: str | os.PathLike[str], out: str | os.PathLike[str], *,
                    root: str | os.PathLike[str] | None = None, fmt: str | None = None,
                    options: ConvertOptions) -> ConvertResult:
    """Convert a CSV/JSONL listing; rows go to their ``split`` column or ``options.split``."""
    scans = scan_listing(listing, root=root, default_split=options.split, fmt=fmt, num_classes=options.num_classes)
    return convert_scans(scans, out, options=options)


class _Lock:
    """An exclusive lock on a local output folder, so two conversions never write it at once.

    Object stores have no such lock; there, running two conversions into one prefix is the
    user's mistake to avoid (documented).
    """

    def __init__(self, fs: OutputFS) -> None:
        self.fs = fs
        fs.makedirs(WORK_DIR)
        self.f = None
        if isinstance(fs, LocalFS):
            self.f = open(fs.root / WORK_DIR / "lock", "a+")
            try:
                fcntl.flock(self.f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as e:
                self.f.close()
                raise OutputError(f"{fs.location}: another shardify conversion is writing this folder") from e

    def release(self) -> None:
        """Unlock; remove the work folder when no unfinished split is left in it."""
        if not [n for n in self.fs.entries(WORK_DIR) if n != "lock"]:
            self.fs.remove_tree(WORK_DIR)
        if self.f is not None:
            fcntl.flock(self.f.fileno(), fcntl.LOCK_UN)
            self.f.close()


def _load_manifest(fs: OutputFS) -> Manifest:
    if not fs.exists(MANIFEST_NAME):
        return Manifest(splits={})
    where = f"{fs.location}/{MANIFEST_NAME}"
    return Manifest.from_json(load_json(fs.read_bytes(MANIFEST_NAME), source=where), source=where)


def convert_scans(scans: dict[str, Scan], out: str | os.PathLike[str], *, options: ConvertOptions) -> ConvertResult:
    """Write every scanned split into ``out``, resuming from finished shards of an earlier run."""
    for split in scans:
        check_split_name(split)
    fs = open_output(out, storage_options=options.storage_options)
    try:
        fs.makedirs()
    except OSError as e:
        raise OutputError(f"{fs.location}: cannot create output folder: {e.strerror or e}") from e
    lock = _Lock(fs)
    try:
        manifest = _load_manifest(fs)
        finished = [s for s in scans if s in manifest.splits]
        if finished and not options.overwrite:
            raise OutputExistsError(
                f"{fs.location}: split(s) {finished} are already finished there; pass --overwrite to replace them")
        if finished:
            for split in finished:
                manifest = manifest.without_split(split)
            fs.write_atomic(MANIFEST_NAME, json_bytes(manifest.to_json()))
        result = ConvertResult(out_dir=fs.location)
        indexes: dict[str, SplitIndex] = {}
        for split, scan in scans.items():
            summary, index = _convert_split(scan, fs, replace(options, split=split))
            result.splits[split] = summary
            indexes[split] = index
        manifest = _load_manifest(fs)
        for split, index in indexes.items():
            manifest = manifest.with_split(split, index)
        fs.sync_root()
        fs.write_atomic(MANIFEST_NAME, json_bytes(manifest.to_json()))
        for split in scans:
            fs.remove_tree(f"{WORK_DIR}/{split}")
        return result
    except OSError as e:
        raise OutputError(f"{fs.location}: writing the output failed: {e}; nothing was marked finished") from e
    except OutputError as e:
        raise OutputError(f"{e}; nothing was marked finished, rerun to resume") from e
    finally:
        lock.release()


def _file_sha256(fs: OutputFS, name: str) -> str:
    with fs.open_read(name) as f:
        return file_sha256(f)


def _record_name(split: str, index: int) -> str:
    return f"{WORK_DIR}/{split}/{index:06d}.json"


def _load_reusable(fs: OutputFS, plan: SplitPlan) -> dict[int, ShardResult]:
    """Finished shards of an earlier run of the same plan, each checked against its record."""
    marker = f"{WORK_DIR}/{plan.split}/plan.json"
    if fs.exists(marker):
        try:
            same = load_json(fs.read_bytes(marker), source=marker).get("fingerprint") == plan.fingerprint
        except ShardifyError:
            same = False
        if not same:
            fs.remove_tree(f"{WORK_DIR}/{plan.split}")
    fs.makedirs(f"{WORK_DIR}/{plan.split}")
    fs.write_atomic(marker, json_bytes({"fingerprint": plan.fingerprint, "shards": plan.num_shards}))
    have = set(fs.listdir(f"{WORK_DIR}/{plan.split}"))
    reusable: dict[int, ShardResult] = {}
    for shard in range(plan.num_shards):
        record = _record_name(plan.split, shard)
        if record.rsplit("/", 1)[1] not in have:
            continue
        try:
            r = load_json(fs.read_bytes(record), source=record)
            if fs.size(r["url"]) == r["filesize"] and _file_sha256(fs, r["url"]) == r["sha256"]:
                reusable[shard] = ShardResult(
                    index=shard, url=r["url"], nsamples=r["nsamples"], filesize=r["filesize"],
                    sha256=r["sha256"], fields=tuple(r["fields"]),
                    skipped=tuple(Ignored(p, why) for p, why in r["skipped"]))
        except (ShardifyError, OSError, KeyError, TypeError, ValueError):
            continue
    return reusable


def _save_record(fs: OutputFS, split: str, r: ShardResult) -> None:
    fs.write_atomic(_record_name(split, r.index), json_bytes({
        "url": r.url, "nsamples": r.nsamples, "filesize": r.filesize, "sha256": r.sha256,
        "fields": list(r.fields), "skipped": [[s.path, s.reason] for s in r.skipped]}))


def _convert_split(scan: Scan, fs: OutputFS, options: ConvertOptions) -> tuple[SplitSummary, SplitIndex]:
    started = time.monotonic()
    split = options.split
    plan = plan_split(scan, options)
    if options.strict:
        bad = [p for p in scan.problems if p.kind == "skipped"]
        if bad:
            raise InputError(bad[0].reason, path=bad[0].path)
    results = _load_reusable(fs, plan)
    reused = len(results)
    todo = _Tasks(plan, [i for i in range(plan.num_shards) if i not in results], ShardTask(
        out_dir=fs.location, root=scan.root, split=split, plan=ShardPlan(-1, (), (), 0), check_full=options.check == "full",
        max_side=options.max_side, quality=options.quality, strict=options.strict, fsync=options.fsync,
        max_pixels=options.max_pixels, storage_options=options.storage_options))
    done_samples = sum(n for i, n in enumerate(plan.shard_sizes) if i in results)
    done_bytes = sum(r.filesize for r in results.values())
    bar = ProgressBar(total=plan.num_samples, desc=split, enabled=options.progress,
                      done=done_samples, done_bytes=done_bytes)

    def finished(r: ShardResult) -> None:
        _save_record(fs, split, r)
        results[r.index] = r

    try:
        if options.engine == "ray":
            from shardify.convert.engine_ray import run_ray

            run_ray(todo, address=options.ray_address, bar=bar, on_result=finished)
        else:
            run_local(todo, workers=options.num_workers, bar=bar, on_result=finished)
    finally:
        bar.close()
    ordered = [results[i] for i in range(plan.num_shards)]
    _remove_stale_shards(fs, split, len(ordered))
    skipped = [p for p in scan.problems if p.kind == "skipped"] + [s for r in ordered for s in r.skipped]
    ignored = [p for p in scan.problems if p.kind == "ignored"]
    _write_report(fs, report_name(split), skipped, ignored)
    index = SplitIndex(
        split=split,
        shards=tuple(ShardEntry(url=r.url, nsamples=r.nsamples, filesize=r.filesize, sha256=r.sha256) for r in ordered),
        classes=tuple(scan.classes),
        fields=tuple(sorted({f for r in ordered for f in r.fields})),
        converter={"name": "shardify", "version": __version__, "format_version": FORMAT_VERSION,
                   "source": scan.source, "options": options.shaping()},
        skipped=dict(Counter(_reason_class(p.reason) for p in skipped)),
        ignored=dict(Counter(_reason_class(p.reason) for p in ignored)),
    )
    fs.write_atomic(index_name(split), json_bytes(index.to_json()))
    summary = SplitSummary(split=split, samples=index.num_samples, shards=len(ordered), bytes=index.num_bytes,
                           skipped=skipped, ignored=dict(index.ignored), notes=list(scan.notes),
                           reused_shards=reused, seconds=time.monotonic() - started)
    return summary, index


class _Tasks(Sequence[ShardTask]):
    """The tasks of the shards still to write, each made (with its samples) only when the
    engine takes it, so that a plan of millions of samples is never all in memory at once."""

    def __init__(self, plan: SplitPlan, shards: list[int], template: ShardTask) -> None:
        self.plan, self.shards, self.template = plan, shards, template

    def __len__(self) -> int:
        return len(self.shards)

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return replace(self.template, plan=self.plan.shard(self.shards[i]))


def _reason_class(reason: str) -> str:
    """A reason without its per-file details, for the counts in the index."""
    return reason.split(":", 1)[0].strip()


def _remove_stale_shards(fs: OutputFS, split: str, count: int) -> None:
    """Delete shards of ``split`` numbered ``count`` and up (left by an earlier, larger output)
    and temporary files of unfinished shards."""
    for name in fs.listdir():
        if name.startswith(f"{split}-") and name.endswith(".tar"):
            try:
                name_split, index = parse_shard_name(name)
            except ShardifyError:
                continue
            if name_split == split and index >= count:
                fs.remove(name)
        elif name.startswith(f".{split}-") and name.endswith(".tmp"):
            fs.remove(name)


def _write_report(fs: OutputFS, name: str, skipped: list[Ignored], ignored: list[Ignored]) -> None:
    lines = (json.dumps({"kind": p.kind, "path": p.path, "reason": p.reason}, ensure_ascii=True) + "\n"
             for p in skipped + ignored)
    fs.write_atomic(name, "".join(lines).encode("ascii"))
