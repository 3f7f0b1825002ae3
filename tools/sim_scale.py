"""Sizing a run at internet scale, on paper: the numbers behind docs/scale.md.

Run by hand (not a test):
    python tools/sim_scale.py [--samples 1e9] [--world 10000] [--sample-kb 110] [--shard-mb 256]
                              [--workers 8] [--batch-size 256] [--images-per-s 2500]

Computes from the format (tar member sizes, split-index entries) and times the reader's
real plan function (``shardify.reader.plan.assign.plan_worker``, a pure function of the
shard sizes) for one rank of the world; nothing is read or written.
"""

from __future__ import annotations

import argparse
import json
import math
import time

from shardify.manifest import json_bytes
from shardify.tarfmt import member_size

SAMPLE_RECORD_BYTES = 110
"""Converter driver memory per input while planning (measured by tools/bench_scale.py at
1.3 M listing rows: SampleTable record ~100 B + key ~12 B + order 8 B)."""


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


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
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    n = int(args.samples)
    payload = int(args.sample_kb * 1000)
    per_sample = member_size(payload) + member_size(3)  # image + .cls (format 2: no .json for a valid ID key)
    per_shard = max(1, int(args.shard_mb * 1e6) // per_sample)
    shards = math.ceil(n / per_shard)
    sizes = [per_shard] * (shards - 1) + [n - per_shard * (shards - 1)]
    entry = {"url": "train-000000.tar", "nsamples": per_shard, "filesize": per_shard * per_sample + 1024,
             "sha256": "0" * 64}
    index_bytes = shards * (len(json_bytes(entry)) + 2)
    dataset_bytes = n * per_sample
    nodes = math.ceil(args.world / args.gpus_per_node)

    from shardify.reader.plan.assign import plan_worker

    t0 = time.perf_counter()
    plan = plan_worker(sizes, seed=0, epoch=1, shuffle=True, rank=args.world // 2, world=args.world, worker=0,
                       workers=args.workers, batch_size=args.batch_size, drop_last=True)
    plan_s = time.perf_counter() - t0
    ranges = getattr(plan, "ranges", None)

    per_rank = n // args.world
    epoch_s = per_rank / args.images_per_s
    shard_reads = shards + args.world * args.workers  # each shard once, plus a split at every worker boundary
    out = {
        "samples": n, "world": args.world, "nodes": nodes, "bytes_per_sample": per_sample,
        "dataset_bytes": dataset_bytes, "samples_per_shard": per_shard, "shards": shards,
        "split_index_bytes": index_bytes, "shards_per_rank_per_epoch": shards / args.world,
        "samples_per_rank_per_epoch": per_rank, "epoch_s": epoch_s,
        "get_requests_per_s": shard_reads / epoch_s, "read_bytes_per_s": dataset_bytes / epoch_s,
        "node_bytes_per_epoch": dataset_bytes * args.gpus_per_node / args.world,
        "driver_plan_memory_bytes": n * SAMPLE_RECORD_BYTES,
        "plan_one_worker_s": plan_s, "plan_ranges": len(ranges) if ranges is not None else None,
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{n:,} samples of {_human(payload)} on {args.world:,} GPUs ({nodes:,} nodes), "
          f"{args.workers} workers per rank, batch {args.batch_size}")
    print(f"  on disk: {_human(per_sample)} per sample, {_human(dataset_bytes)} in all")
    print(f"  shards: {shards:,} of {per_shard:,} samples ({args.shard_mb:.0f} MB); "
          f"{shards / args.world:.1f} shards per rank per epoch")
    print(f"  split index: {_human(index_bytes)} (JSON, read by every rank at start)")
    print(f"  epoch: {per_rank:,} samples per rank, {epoch_s:.0f} s at {args.images_per_s:.0f} images/s per GPU")
    print(f"  object store: ~{out['get_requests_per_s']:,.0f} GET/s, {_human(out['read_bytes_per_s'])}/s "
          f"over the whole run; {_human(out['node_bytes_per_epoch'])} per node per epoch")
    print(f"  converter driver: ~{_human(out['driver_plan_memory_bytes'])} to plan in one process "
          f"({SAMPLE_RECORD_BYTES} B per input)")
    print(f"  plan of one worker (world {args.world:,}): {plan_s * 1000:.0f} ms (this machine)")


if __name__ == "__main__":
    main()
