"""Sizing a run at internet scale, on paper: the numbers behind docs/scale.md.

Run by hand (not a test):
    python tools/sim_scale.py [--samples 1e9] [--world 10000] [--sample-kb 110] [--shard-mb 256]
                              [--workers 8] [--batch-size 256] [--images-per-s 2500]

Computes from the format (tar member sizes, split-index entries) and times the reader's
real plan functions for the workers of rank ``world // 2``, as a worker runs them, in a fresh
(spawned) process whose peak resident memory it reports: the epoch's sequence
(``shardify.reader.plan.mix.block_sequence``, plan version 4; and, up to ``--max-blocks``
blocks, plan version 3's ``epoch_sequence`` with its ``assign.sequence_starts``), then
``assign.plan_worker`` and the worker's shuffled order (``resume.share_order``). Then, in
another fresh process, it sets up a reader of a compact index of that many shards
(``shardify.compactindex``, written to a temporary folder with its manifest and no shard): the
index read into a source, a ``ShardedDataset`` made of it, and a worker's ranged fetcher over the
same shards at an HTTP address (nothing is fetched: no sample is read).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import replace
from multiprocessing import get_context

from benchlib import memory

from shardify import merkle
from shardify.compactindex import compact_name
from shardify.compactindex import encode as encode_compact
from shardify.jsonfiles import json_bytes
from shardify.sampletable import RECORD
from shardify.sidecar import HEADER, SIDECAR_RECORD, SidecarRef
from shardify.splitindex import ShardEntry
from shardify.tarfmt import OFFSET_STRIDE, member_size

SAMPLE_RECORD_BYTES = 110
"""Converter driver disk per input while planning: its temporary files (tools/bench_scale.py's
listing rows: SpecTable record ~84 B + offset 8 B, key ~11 B + offset 8 B); its memory is
flat (~65-75 MB at 1 M and 10 M rows, docs/scale.md)."""


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _plan_child(kind: str, sizes: list[int], args: argparse.Namespace, conn) -> None:  # type: ignore[no-untyped-def]
    """In a fresh process: plan rank ``world // 2``'s workers as a worker does, and send the
    seconds and the peak resident memory (``ru_maxrss``) before and after planning."""

    from shardify.reader.plan.assign import plan_worker, sequence_starts
    from shardify.reader.plan.mix import block_sequence, epoch_sequence
    from shardify.reader.plan.resume import PlanOptions, share_order

    rank = args.world // 2
    kw = dict(rank=rank, world=args.world, workers=args.workers, batch_size=args.batch_size, drop_last=True)
    opts = PlanOptions(seed=0, shuffle=True, batch_size=args.batch_size, drop_last=True, block=args.block, buffer=1024)
    base = memory.memory_kib("self")["VmRSS"] * 1024  # resident now: the imports (torch, numpy), the shard sizes
    t0 = time.perf_counter()
    if kind == "keyed":  # plan version 4, the default: the takes as arrays, blocks in a keyed order
        seq = block_sequence([sizes], counts=None, seed=0, epoch=1, block=args.block)
    else:  # plan version 3: the whole epoch's block permutation, as Python tuples
        seq = epoch_sequence([sizes], counts=None, seed=0, epoch=1, shuffle=True, block=args.block)
    t1 = time.perf_counter()
    starts = sequence_starts(seq)
    t2 = time.perf_counter()
    plan = plan_worker(seq, worker=0, starts=starts, **kw)
    t3 = time.perf_counter()
    share_order(plan, opts, epoch=1, rank=rank, worker=0)
    t4 = time.perf_counter()
    per_worker = []
    rank_shards = {shard for shard, _, _ in plan.ranges}  # whose sidecars the rank's workers fetch
    for worker in range(1, args.workers):
        t = time.perf_counter()
        other = plan_worker(seq, worker=worker, starts=starts, **kw)
        per_worker.append(time.perf_counter() - t)
        rank_shards.update(shard for shard, _, _ in other.ranges)
    conn.send(
        {
            "sequence_s": t1 - t0,
            "starts_s": t2 - t1,
            "plan_s": t3 - t2,
            "order_s": t4 - t3,
            "one_worker_s": t4 - t0,
            "other_workers_max_s": max(per_worker, default=0.0),
            "share_samples": plan.num_samples,
            "share_ranges": len(plan.ranges),
            "rank_shards": len(rank_shards),
            "rss_before": base,
            "rss_peak": round(memory.peak_mib() * 2**20),
        }
    )


def _time_plan(sizes: list[int], args: argparse.Namespace) -> dict:
    """Plan rank ``world // 2``'s workers in a fresh process (spawned, so that its peak memory
    is its own) under plan version 4 and, up to ``--max-blocks`` blocks, under plan version 3."""
    ctx = get_context("spawn")
    out: dict = {"rank": args.world // 2, "blocks": sum(sizes) // args.block}
    for kind in ("keyed", "whole") if out["blocks"] <= args.max_blocks else ("keyed",):
        here, there = ctx.Pipe()
        child = ctx.Process(target=_plan_child, args=(kind, sizes, args, there))
        child.start()
        out[kind] = here.recv()
        child.join()
    return out


def _compact_dataset(folder: str, sizes: list[int]) -> int:
    """A manifest and a compact index of ``sizes`` shards in ``folder`` (no shard): its size."""
    import hashlib
    from pathlib import Path

    version = "0123456789ab"
    fields = {"format_version": 2, "split": "train", "version": version, "classes": [], "fields": ["cls", "jpg"]}
    data = encode_compact(fields, sizes, hashlib.sha256(b"a root").digest())
    Path(folder, compact_name("train", version)).write_bytes(data)
    ref = {"index": compact_name("train", version), "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    split = {"index": f"train-{version}.json", "samples": sum(sizes), "shards": len(sizes), "bytes": 0}
    split |= {"index_size": 2, "index_sha256": hashlib.sha256(b"{}").hexdigest()}  # not read: the compact one is
    manifest = {
        "format": "shardify",
        "format_version": 2,
        "splits": {"train": {**split, "version": version, "compact": ref}},
    }
    Path(folder, "manifest.json").write_text(json.dumps(manifest))
    return len(data)


def _setup_child(folder: str, args: argparse.Namespace, conn) -> None:  # type: ignore[no-untyped-def]
    """In a fresh process: read the compact index at ``folder`` as a reader does, make a dataset
    of it, and a worker's ranged fetcher of its shards at an HTTP address; seconds and memory."""
    import dataclasses
    import os

    from shardify.reader import ShardedDataset
    from shardify.reader.io.compact import CompactShards
    from shardify.reader.io.rangesetup import range_fetcher
    from shardify.reader.io.sources import resolve_source

    os.environ.update(RANK=str(args.world // 2), WORLD_SIZE=str(args.world))
    base = memory.memory_kib("self")["VmRSS"] * 1024
    t0 = time.perf_counter()
    source = resolve_source(folder)
    t1 = time.perf_counter()
    ShardedDataset(folder, batch_size=args.batch_size, shuffle=True, seed=0, fields=("cls",))
    t2 = time.perf_counter()
    shards = source.shards
    if not isinstance(shards, CompactShards):
        raise SystemExit(f"{folder}: read without its compact index")
    at = "http://127.0.0.1:9/ds/"  # an address nothing is fetched from
    remote = CompactShards(
        base=at, split="train", version=shards.version, counts=shards.counts, root=shards.root, fetch=shards.fetch
    )
    fetcher = range_fetcher([dataclasses.replace(source, shards=remote)])
    t3 = time.perf_counter()
    conn.send(
        {
            "read_s": t1 - t0,
            "dataset_s": t2 - t1,
            "fetcher_s": t3 - t2,
            "ranged": fetcher is not None,
            "rss_before": base,
            "rss_peak": round(memory.peak_mib() * 2**20),
        }
    )


def _time_setup(sizes: list[int], args: argparse.Namespace) -> dict:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        size = _compact_dataset(folder, sizes)
        here, there = get_context("spawn").Pipe()
        child = get_context("spawn").Process(target=_setup_child, args=(folder, args, there))
        child.start()
        out: dict = here.recv()
        child.join()
    return {"compact_index_bytes": size, **out}


def _sizes(n: int, args: argparse.Namespace) -> list[int]:
    per_sample = member_size(int(args.sample_kb * 1000)) + member_size(3)
    per_shard = max(1, int(args.shard_mb * 1e6) // per_sample)
    shards = math.ceil(n / per_shard)
    return [per_shard] * (shards - 1) + [n - per_shard * (shards - 1)]


def chart(args: argparse.Namespace) -> None:
    """Plan one worker's epoch at each of ``args.sizes`` samples (each in a fresh process, as
    :func:`main` does) and draw the time and the memory planning added, per plan version."""
    import matplotlib  # deferred: only the chart needs it

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    rows = []
    for samples in args.sizes:
        plan = _time_plan(_sizes(int(samples), args), args)
        rows.append((int(samples), plan))
        print(json.dumps({"samples": int(samples), **plan}))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for kind, label in (
        ("keyed", "plan version 4 (keyed block order)"),
        ("whole", "plan version 3 (whole permutation)"),
    ):
        points = [(n, p[kind]) for n, p in rows if kind in p]
        if not points:
            continue
        xs = [n for n, _ in points]
        left.plot(xs, [q["one_worker_s"] for _, q in points], marker="o", label=label)
        right.plot(xs, [(q["rss_peak"] - q["rss_before"]) / 1e6 for _, q in points], marker="o", label=label)
    for ax, what in ((left, "seconds to plan one worker's epoch"), (right, "MB that planning added")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("samples in the epoch")
        ax.set_ylabel(what)
        ax.legend()
    fig.suptitle(f"world {args.world:,} x {args.workers} workers, block {args.block}: one worker, fresh process")
    fig.tight_layout()
    fig.savefig(args.chart, dpi=110)
    print(f"chart: {args.chart}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=float, default=1e9)
    ap.add_argument("--world", type=int, default=10_000, help="ranks (GPUs)")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--sample-kb", type=float, default=110.0, help="payload per sample (ImageNet JPEG: ~110 KB)")
    ap.add_argument("--shard-mb", type=float, default=256.0)
    ap.add_argument("--workers", type=int, default=8, help="DataLoader workers per rank")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--images-per-s", type=float, default=2500.0, help="training speed per GPU")
    ap.add_argument("--block", type=int, default=4, help="shuffle_block: samples per block across shards")
    ap.add_argument(
        "--max-blocks",
        type=float,
        default=3e6,
        help="also plan under plan version 3 (the whole epoch's block permutation) up to this many blocks "
        "(memory: ~100 B each)",
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--chart",
        default=None,
        metavar="PNG",
        help="plan at each of --sizes instead, and draw one worker's plan time and added memory per plan version",
    )
    ap.add_argument("--sizes", type=float, nargs="+", default=[1e7, 1e8, 1e9], help="sample counts for --chart")
    args = ap.parse_args()
    if args.chart:
        chart(args)
        return

    n = int(args.samples)
    payload = int(args.sample_kb * 1000)
    per_sample = member_size(payload) + member_size(3)  # image + .cls (format 2: no .json for a valid ID key)
    per_shard = max(1, int(args.shard_mb * 1e6) // per_sample)
    shards = math.ceil(n / per_shard)
    sizes = [per_shard] * (shards - 1) + [n - per_shard * (shards - 1)]
    entry = ShardEntry(
        url="train-000000000000-000000.tar",
        nsamples=per_shard,
        filesize=per_shard * per_sample + 1024,
        sha256="0" * 64,
        offsets=tuple(k * OFFSET_STRIDE * per_sample for k in range(-(-per_shard // OFFSET_STRIDE))),
    )
    # The per-sample table (28 bytes a sample): inline it is base64 in every entry; in a
    # sidecar (what a split over SIDECAR_ABOVE_SAMPLES gets) the entry holds its size and hash.
    sidecar_bytes = HEADER.size + per_shard * SIDECAR_RECORD.size + merkle.depth(shards) * merkle.HASH_BYTES
    inline = replace(entry, samples=bytes(per_shard * RECORD.size))
    entry = replace(entry, sidecar=SidecarRef(sha256="0" * 64, size=sidecar_bytes))
    index_bytes = shards * (len(json_bytes(entry.to_json())) + 2)
    inline_index_bytes = shards * (len(json_bytes(inline.to_json())) + 2)
    dataset_bytes = n * per_sample
    nodes = math.ceil(args.world / args.gpus_per_node)

    plan = _time_plan(sizes, args)
    setup = _time_setup(sizes, args)
    per_rank = n // args.world
    epoch_s = per_rank / args.images_per_s
    shard_reads = shards + args.world * args.workers  # each shard once, plus a split at every worker boundary
    out = {
        "samples": n,
        "world": args.world,
        "nodes": nodes,
        "bytes_per_sample": per_sample,
        "dataset_bytes": dataset_bytes,
        "samples_per_shard": per_shard,
        "shards": shards,
        "split_index_bytes": index_bytes,
        "split_index_bytes_inline_tables": inline_index_bytes,
        "index_entry_bytes": index_bytes // shards,
        "index_entry_bytes_inline_table": inline_index_bytes // shards,
        "sidecar_bytes_per_shard": sidecar_bytes,
        "sidecar_bytes_per_rank_per_epoch": sidecar_bytes * plan["keyed"]["rank_shards"],
        "shards_per_rank_per_epoch": shards / args.world,
        "samples_per_rank_per_epoch": per_rank,
        "epoch_s": epoch_s,
        "get_requests_per_s": shard_reads / epoch_s,
        "read_bytes_per_s": dataset_bytes / epoch_s,
        "node_bytes_per_epoch": dataset_bytes * args.gpus_per_node / args.world,
        "driver_plan_disk_bytes": n * SAMPLE_RECORD_BYTES,
        **plan,
        "setup": setup,
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(
        f"{n:,} samples of {_human(payload)} on {args.world:,} GPUs ({nodes:,} nodes), "
        f"{args.workers} workers per rank, batch {args.batch_size}"
    )
    print(f"  on disk: {_human(per_sample)} per sample, {_human(dataset_bytes)} in all")
    print(
        f"  shards: {shards:,} of {per_shard:,} samples ({args.shard_mb:.0f} MB); "
        f"{shards / args.world:.1f} shards per rank per epoch"
    )
    print(
        f"  split index: {_human(index_bytes)} (JSON, read by every rank at start; "
        f"{_human(inline_index_bytes)} with the per-sample tables inline)"
    )
    print(
        f"  compact index (what a reader reads instead): {_human(setup['compact_index_bytes'])}; in a fresh process "
        f"reading it into a source took {setup['read_s'] * 1000:.0f} ms, making a ShardedDataset of it "
        f"{setup['dataset_s'] * 1000:.0f} ms, a worker's ranged fetcher {setup['fetcher_s'] * 1000:.0f} ms; "
        f"peak memory {(setup['rss_peak'] - setup['rss_before']) / 1e6:.0f} MB over the "
        f"{setup['rss_before'] / 1e6:.0f} MB before"
    )
    print(
        f"  per-sample table sidecars: {_human(sidecar_bytes)} per shard, "
        f"{_human(out['sidecar_bytes_per_rank_per_epoch'])} per rank per epoch "
        f"(the {plan['keyed']['rank_shards']:,} shards its workers read)"
    )
    print(f"  epoch: {per_rank:,} samples per rank, {epoch_s:.0f} s at {args.images_per_s:.0f} images/s per GPU")
    print(
        f"  object store: ~{out['get_requests_per_s']:,.0f} GET/s, {_human(out['read_bytes_per_s'])}/s "
        f"over the whole run; {_human(out['node_bytes_per_epoch'])} per node per epoch"
    )
    print(
        f"  converter driver: ~{_human(out['driver_plan_disk_bytes'])} of temporary files to plan "
        f"({SAMPLE_RECORD_BYTES} B per input), its memory flat"
    )
    mb = 1e6
    for kind, what in (
        ("keyed", "plan version 4 (keyed block order, the default)"),
        ("whole", "plan version 3 (the whole epoch's block permutation)"),
    ):
        if kind not in plan:
            print(f"  {what}: not run ({plan['blocks']:,} blocks, over --max-blocks)")
            continue
        p = plan[kind]
        print(
            f"  planning one worker's epoch, {what}: {p['one_worker_s']:.3f} s (sequence {p['sequence_s']:.3f} s, "
            f"its starts {p['starts_s'] * 1000:.1f} ms, the worker's share {p['plan_s'] * 1000:.1f} ms, its order "
            f"{p['order_s'] * 1000:.1f} ms; each other worker of rank {plan['rank']} after it: at most "
            f"{p['other_workers_max_s'] * 1000:.1f} ms); peak memory {p['rss_peak'] / mb:.0f} MB "
            f"({p['rss_before'] / mb:.0f} MB resident before planning: the interpreter, torch and numpy, the shard "
            f"sizes; so planning added at most {(p['rss_peak'] - p['rss_before']) / mb:.0f} MB); "
            f"share {p['share_samples']:,} samples in {p['share_ranges']:,} ranges; {plan['blocks']:,} blocks of "
            f"{args.block}"
        )


if __name__ == "__main__":
    main()
