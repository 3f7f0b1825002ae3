"""Start-up benchmark: time to the first batch of one rank of a large world, and where it goes.

Run by hand (not a test):
    python tools/bench_start.py [--rows 1300000] [--data DIR] [--rank 3] [--world 64] [--workers 2]

Converts (once, cached in --data) the listing of tools/bench_scale.py, then times for rank
``--rank`` of ``--world`` (through RANK/WORLD_SIZE, as torchrun sets them), in a fresh
process each: resolving the source (manifest and index), the epoch's sequence (once per
process), planning one worker's share of it for ``--world`` and for world 4096, scanning one shard's headers, and
the first batch through
a DataLoader with ``--workers`` workers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
import torch
from shardify.reader import BatchOptions, ShardedDataset
from shardify.reader.io.sources import resolve_source
from shardify.reader.plan.assign import plan_worker, sequence_starts
from shardify.reader.plan.mix import epoch_sequence
from shardify.tario import scan_layout
t_import = time.perf_counter()
ds_path, rank, world, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
src = resolve_source(ds_path)
t_resolve = time.perf_counter()
seq = epoch_sequence([src.sizes], counts=None, seed=0, epoch=0, shuffle=True, block=4)
starts = sequence_starts(seq)
t_sequence = time.perf_counter()
plan_worker(seq, rank=rank, world=world, worker=0, workers=workers, batch_size=256, drop_last=True, starts=starts)
t_plan = time.perf_counter()
plan_worker(seq, rank=rank, world=4096, worker=0, workers=workers, batch_size=256, drop_last=True, starts=starts)
t_plan4096 = time.perf_counter()
with open(src.shards[0].url, "rb") as f:
    layout = scan_layout(f, shard=src.shards[0].url)
t_scan = time.perf_counter()
os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
t_start = time.perf_counter()
ds = ShardedDataset(ds_path, batch_size=256, shuffle=True, fields=("cls", "txt"),
                    batching=BatchOptions(collate_fn=list))
loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
it = iter(loader)
next(it)
t_first = time.perf_counter()
print(json.dumps({"import_s": t_import - t0, "resolve_s": t_resolve - t_import,
                  "sequence_s": t_sequence - t_resolve, "plan_s": t_plan - t_sequence,
                  "plan_world4096_s": t_plan4096 - t_plan, "scan_one_shard_s": t_scan - t_plan4096,
                  "shard_samples": len(layout), "shards": len(src.shards), "samples": src.num_samples,
                  "first_batch_s": t_first - t_start}))
"""


def converted_listing(data: Path, rows: int) -> Path:
    """The listing of tools/bench_scale.py with ``rows`` rows, converted (both cached in ``data``)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_scale import make_listing

    data.mkdir(parents=True, exist_ok=True)
    listing = data / f"listing-{rows}.jsonl"
    make_listing(listing, rows)
    ds = data / f"ds-{rows}"
    if not (ds / "manifest.json").exists():
        t0 = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "shardify.convert",
                "convert",
                "listing",
                str(listing),
                str(ds),
                "--quiet",
                "--no-fsync",
            ],
            check=True,
        )
        print(f"converted {listing} into {ds} in {time.perf_counter() - t0:.0f} s")
    return ds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_300_000)
    ap.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "shardify-bench-scale")
    ap.add_argument("--rank", type=int, default=3)
    ap.add_argument("--world", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    ds = converted_listing(args.data, args.rows)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(ds), str(args.rank), str(args.world), str(args.workers)],
        capture_output=True,
        text=True,
        env={**os.environ},
    )
    if out.returncode:
        raise SystemExit(out.stderr)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"{r['samples']} samples in {r['shards']} shards ({r['shard_samples']} in shard 0); "
        f"rank {args.rank} of {args.world}, {args.workers} workers"
    )
    print(
        f"  first batch {r['first_batch_s']:.2f} s after ShardedDataset(...); separately: resolve source "
        f"{r['resolve_s'] * 1000:.0f} ms, the epoch's sequence {r['sequence_s'] * 1000:.0f} ms (once per process), "
        f"then plan one worker {r['plan_s'] * 1000:.1f} ms (world 4096: "
        f"{r['plan_world4096_s'] * 1000:.1f} ms), scan one shard's headers {r['scan_one_shard_s'] * 1000:.0f} ms; "
        f"imports {r['import_s']:.1f} s"
    )


if __name__ == "__main__":
    main()
