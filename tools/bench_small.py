"""Small samples, both layouts side by side: bytes per sample and read samples/s.

    python tools/bench_small.py [--samples 100000] [--chunk 256] [--workers 2] [--epochs 3]
                                [--batch-size 256] [--dir DIR]

Writes (once per folder) ``--samples`` random 3x32x32 uint8 arrays with an int label (10
classes; ``benchlib.corpus.arrays``) with ``ShardWriter``, once per sample (the default layout) and once with
``chunk=--chunk``; prints each layout's bytes per sample, then reads both with
``ShardedDataset(fields=("npy", "cls"), shuffle=True)`` through ``make_loader`` (persistent
workers), epoch by epoch and in turn (so load on the machine hits both alike), and prints
each side's best epoch in samples/s and the ratio. Every epoch must give every sample once.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from benchlib import corpus


def write(root: Path, *, samples: int, chunk: int | None) -> float:
    """The dataset at ``root`` (made if missing); returns its shard bytes per sample."""
    corpus.arrays_dataset(root, samples, classes=10, chunk=chunk)
    corpus.warm(root)
    shards = list(root.glob("train-*.tar"))
    return sum(p.stat().st_size for p in shards) / samples


def run(work: Path, *, samples: int, chunk: int, workers: int, epochs: int, batch_size: int) -> dict[str, Any]:
    from shardify.reader import ShardedDataset, make_loader

    names = {"per-sample": None, f"chunk={chunk}": chunk}
    roots = {name: work / f"small-{samples}-{c or 'plain'}" for name, c in names.items()}
    per_sample = {name: write(roots[name], samples=samples, chunk=c) for name, c in names.items()}
    sets = {
        name: ShardedDataset(roots[name], batch_size=batch_size, shuffle=True, fields=("npy", "cls")) for name in names
    }
    loaders = {name: make_loader(ds, num_workers=workers) for name, ds in sets.items()}
    times: dict[str, list[float]] = {name: [] for name in names}
    try:
        for epoch in range(epochs):
            for name, loader in loaders.items():
                sets[name].set_epoch(epoch)
                t = time.perf_counter()
                seen = np.zeros(10, dtype=np.int64)
                n = 0
                for _x, y in loader:
                    n += int(y.shape[0])
                    seen += np.bincount(y.numpy(), minlength=10)
                times[name].append(time.perf_counter() - t)
                if n != samples or seen.tolist() != [samples // 10 + (k < samples % 10) for k in range(10)]:
                    raise SystemExit(f"{name}: epoch {epoch} gave {n} samples, expected {samples}")
    finally:
        for loader in loaders.values():
            loader.close()
    best = {name: samples / min(t) for name, t in times.items()}
    return {
        "samples": samples,
        "chunk": chunk,
        "workers": workers,
        "batch_size": batch_size,
        "epochs": epochs,
        "bytes_per_sample": per_sample,
        "samples_per_s": best,
        "epoch_seconds": times,
        "read_ratio": best[f"chunk={chunk}"] / best["per-sample"],
        "loadavg": os.getloadavg(),
        "cpus": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--chunk", type=int, default=256, help="samples per chunk of the chunked layout (default: 256)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--dir", default=None, help="work folder, kept to reuse (default: a temporary one, removed)")
    ap.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = ap.parse_args(argv)
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="shardify-bench-small-"))
    try:
        r = run(
            work,
            samples=args.samples,
            chunk=args.chunk,
            workers=args.workers,
            epochs=args.epochs,
            batch_size=args.batch_size,
        )
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    print(
        f"{r['samples']} samples of 3x32x32 uint8 + int label, batch {r['batch_size']}, {r['workers']} workers, "
        f"best epoch of {r['epochs']} (warm cache); load average {r['loadavg'][0]:.1f} on {r['cpus']} CPUs"
    )
    for name, rate in r["samples_per_s"].items():
        epochs = ", ".join(f"{r['samples'] / s:.0f}" for s in r["epoch_seconds"][name])
        print(f"  {name:12s} {r['bytes_per_sample'][name]:7.0f} B/sample  {rate:9.0f} samples/s  (epochs: {epochs})")
    print(f"  chunked/per-sample read rate: {r['read_ratio']:.2f}x")
    if args.json:
        print(json.dumps(r))
    return r


if __name__ == "__main__":
    main()
