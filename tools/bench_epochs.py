"""Memory over epochs: the resident memory of each DataLoader worker after each epoch.

Run by hand (not a test):
    python tools/bench_epochs.py [--rows 1300000] [--data DIR] [--epochs 5] [--world 4] [--rank 0]
                                 [--workers 2] [--batch-size 256]

Converts (once, cached in --data) the listing of tools/bench_scale.py, then reads rank
``--rank`` of ``--world`` for ``--epochs`` shuffled epochs through ``make_loader`` with
persistent workers (the default), calling ``set_epoch`` each time as a training loop does.
After each epoch it prints every worker's resident memory (``VmRSS``) and peak (``VmHWM``)
from ``/proc``, and that of this process. Flat means the last epoch's figures equal the
first's to within noise: nothing per epoch or per sample is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from shardify.reader import BatchOptions


def _status_kb(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of ``pid``, in KB."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                out[name] = int(value.split()[0])
    return out


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                kids.append(int(entry))
    return sorted(kids)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_300_000)
    ap.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "shardify-bench-scale")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=256)
    args = ap.parse_args()
    from bench_start import converted_listing

    ds_path = converted_listing(args.data, args.rows)
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(args.rank), str(args.world)
    from shardify.reader import ShardedDataset, make_loader

    ds = ShardedDataset(
        ds_path, batch_size=args.batch_size, shuffle=True, seed=0, batching=BatchOptions(drop_last=True)
    )
    rows = []
    with make_loader(ds, num_workers=args.workers) as loader:
        for epoch in range(args.epochs):
            ds.set_epoch(epoch)
            t0 = time.perf_counter()
            samples = 0
            for batch in loader:
                samples += len(batch["__key__"]) if isinstance(batch, dict) else len(batch[0])
            seconds = time.perf_counter() - t0
            workers = {pid: _status_kb(pid) for pid in _children(os.getpid())}
            row = {
                "epoch": epoch,
                "samples": samples,
                "seconds": round(seconds, 1),
                "main_rss_mb": round(_status_kb(os.getpid())["VmRSS"] / 1024),
                "worker_rss_mb": [round(w["VmRSS"] / 1024) for w in workers.values()],
                "worker_peak_mb": [round(w["VmHWM"] / 1024) for w in workers.values()],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    first, last = rows[0]["worker_rss_mb"], rows[-1]["worker_rss_mb"]
    print(
        json.dumps(
            {
                "rows": args.rows,
                "rank": args.rank,
                "world": args.world,
                "workers": args.workers,
                "worker_rss_growth_mb_first_to_last_epoch": [b - a for a, b in zip(first, last)],
            }
        )
    )


if __name__ == "__main__":
    main()
