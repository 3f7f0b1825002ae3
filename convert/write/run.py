"""The library API of the converter: scan, plan, then write every split (resumably) in one
:class:`~shardify.convert.write.session.ConversionSession`, which finishes and publishes them
(``manifest.json`` last, so a half-written dataset never looks finished).

Every file of a conversion but the manifest, the report and the wids copy of the index
carries the plan's version token in its name (:attr:`SplitPlan.version`), so converting
again (``overwrite``) never changes bytes a reader of the previous version may be reading:
the manifest switches to the new version at once, and earlier versions stay until
``shardify gc`` (:mod:`shardify.convert.write.versions`). The same conversion gets the same names,
so a rerun after a kill resumes and ends byte-identical, also when the kill came after the
manifest was written.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from typing import overload

from shardify.convert.inputs.ids import scan_ids
from shardify.convert.inputs.imagefolder import scan_imagefolder
from shardify.convert.inputs.inputs import Scan
from shardify.convert.inputs.labels import int_labels
from shardify.convert.inputs.listing import scan_listing
from shardify.convert.options import ConvertOptions
from shardify.convert.write.finish import write_report
from shardify.convert.write.identity import converter_info
from shardify.convert.write.outfs import WORK_DIR
from shardify.convert.write.plan import ShardPlan, SplitPlan, plan_split
from shardify.convert.write.progressbar import ProgressBar
from shardify.convert.write.session import ConversionSession, ConvertResult, SplitSummary
from shardify.convert.write.shards import write_shards
from shardify.convert.write.shardtypes import ShardResult, ShardTask
from shardify.errors import InputError
from shardify.pixels import RawPixels
from shardify.tarfmt import report_name

__all__ = [
    "SplitSummary",
    "ConvertResult",
    "convert_imagefolder",
    "convert_ids",
    "convert_listing",
    "convert_scans",
    "WORK_DIR",
]


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


def convert_scans(scans: dict[str, Scan], out: str | os.PathLike[str], *, options: ConvertOptions) -> ConvertResult:
    """Write every scanned split into ``out``, resuming from finished shards of an earlier run."""
    plans = {split: plan_split(scan, replace(options, split=split)) for split, scan in scans.items()}
    session = ConversionSession.open(
        out,
        {split: plan.fingerprint for split, plan in plans.items()},
        overwrite=options.overwrite,
        storage_options=options.storage_options,
    )
    with session.holding():
        result = ConvertResult(out_dir=session.fs.location)
        for split, scan in scans.items():
            result.splits[split] = _convert_split(session, scan, plans[split], replace(options, split=split))
        session.publish()
        session.note_old_versions(result.splits)
        return result


def _convert_split(session: ConversionSession, scan: Scan, plan: SplitPlan, options: ConvertOptions) -> SplitSummary:
    split = options.split
    if options.strict:
        bad = [p for p in scan.problems if p.kind == "skipped"]
        if bad:
            raise InputError(bad[0].reason, path=bad[0].path)
    session.begin(split, plan.fingerprint, version=plan.version, shards=plan.num_shards)
    results: dict[int, ShardResult] = {}
    for shard in range(plan.num_shards):
        found = session.reusable(split, shard)
        if found is not None:
            results[shard] = found[0]
    reused = len(results)
    todo = _Tasks(plan, [i for i in range(plan.num_shards) if i not in results], _task(scan, plan, session, options))
    bar = ProgressBar(
        total=plan.num_samples,
        desc=split,
        enabled=options.progress,
        done=sum(n for i, n in enumerate(plan.shard_sizes) if i in results),
        done_bytes=sum(r.filesize for r in results.values()),
    )

    def finished(r: ShardResult) -> None:
        session.record(split, r)
        results[r.index] = r

    try:
        write_shards(
            todo,
            engine=options.engine,
            workers=options.num_workers,
            address=options.ray_address,
            bar=bar,
            on_result=finished,
        )
    finally:
        bar.close()
    ordered = [results[i] for i in range(plan.num_shards)]
    skipped = [p for p in scan.problems if p.kind == "skipped"] + [s for r in ordered for s in r.skipped]
    ignored = [p for p in scan.problems if p.kind == "ignored"]
    notes = [n for r in ordered for n in r.notes]
    if not any(r.nsamples for r in ordered) and not options.allow_empty:
        write_report(session.fs, report_name(split), skipped, ignored + notes)
        raise InputError(
            f"split {split!r}: no sample was written ({len(skipped)} skipped, {len(ignored)} ignored; reasons in "
            f"{session.fs.location}/{report_name(split)}); nothing was marked finished. Pass --allow-empty "
            "(allow_empty=True) to write an empty split",
            path=scan.root,
        )
    index = session.finish(
        split,
        ordered,
        classes=scan.classes,
        skipped=skipped,
        ignored=ignored,
        notes=notes,
        converter=converter_info(scan.source, options.shaping(), chunk=options.chunk, **int_labels(scan)),
        version=plan.version,
        durable=options.fsync,
        chunk=options.chunk,
        raw_pixels=None if options.raw_pixels is None else RawPixels(size=options.raw_pixels, side=options.raw_side),
    )
    return session.summary(index, skipped, reused=reused, notes=scan.notes, noted=notes)


def _task(scan: Scan, plan: SplitPlan, session: ConversionSession, options: ConvertOptions) -> ShardTask:
    """The task every shard of the split shares, but for its plan."""
    return ShardTask(
        out_dir=session.fs.location,
        root=scan.root,
        split=options.split,
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
    )


class _Tasks(Sequence[ShardTask]):
    """The tasks of the shards still to write, each made (with its samples) only when the
    engine takes it, so that a plan of millions of samples is never all in memory at once."""

    def __init__(self, plan: SplitPlan, shards: list[int], template: ShardTask) -> None:
        self.plan, self.shards, self.template = plan, shards, template

    def __len__(self) -> int:
        return len(self.shards)

    @overload
    def __getitem__(self, i: int) -> ShardTask: ...

    @overload
    def __getitem__(self, i: slice) -> list[ShardTask]: ...

    def __getitem__(self, i: int | slice) -> ShardTask | list[ShardTask]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return replace(self.template, plan=self.plan.shard(self.shards[i]))
