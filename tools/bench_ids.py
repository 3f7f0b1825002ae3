"""The seeds' recipe side by side: one ``torch.load`` per sample against shardify's ``.npy`` shards.

    python tools/bench_ids.py [--samples 4000] [--workers 2] [--epochs 3] [--batch-size 64] [--dir DIR]

Makes ``data/<ID>.pt`` tensors (3x32x32 float32, 10 classes) with a partition and a labels
file, converts them with ``shardify convert ids --pt-to-npy``, then times, epoch by epoch
and in turn (so load on the machine hits both alike):

- map-style: a ``Dataset`` whose ``__getitem__`` calls ``torch.load(weights_only=True)``,
  ``DataLoader(shuffle=True, num_workers, persistent_workers=True)``;
- shardify: ``ShardedDataset(fields=("npy", "cls"), shuffle=True)`` through ``make_loader``.

Both use the same workers and batch size; the files are read once first (warm page cache),
and each side's best epoch counts. An untimed pass then checks that both give the same
tensors (dtype, shape, values) and labels for every ID. Prints samples/s and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from benchlib import corpus
from torch.utils.data import DataLoader, Dataset


class TensorFiles(Dataset):
    """The map-style recipe: one ``data/<ID>.pt`` per sample, labels from a dict."""

    def __init__(self, root: Path, ids: list[str], labels: dict[str, int], *, with_id: bool = False) -> None:
        self.root, self.ids, self.labels, self.with_id = root, ids, labels, with_id

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> Any:
        ident = self.ids[index]
        x = torch.load(self.root / f"{ident}.pt", weights_only=True)
        return (x, self.labels[ident], ident) if self.with_id else (x, self.labels[ident])


def _epoch(loader: Iterable[Any]) -> tuple[int, float]:
    """Samples and seconds of one pass, consuming each batch like a training loop would."""
    t = time.perf_counter()
    n = 0
    for _x, y in loader:
        n += int(y.shape[0])
    return n, time.perf_counter() - t


def _check_same(src: Path, out: Path, ids: list[str], labels: dict[str, int], *, workers: int) -> int:
    """Every ID once on both sides with equal tensors and labels; returns the IDs checked."""
    from shardify.reader import ShardedDataset, make_loader

    ours: dict[str, tuple[torch.Tensor, int]] = {}
    ds = ShardedDataset(out, split="train", batch_size=64, fields=("npy", "cls", "json"))
    with make_loader(ds, num_workers=workers) as loader:
        for x, y, meta in loader:
            for i, ident in enumerate(meta["path"]):
                if ident in ours:
                    raise SystemExit(f"ID {ident} came twice from shardify")
                ours[ident] = (x[i].clone(), int(y[i]))
    theirs = DataLoader(TensorFiles(src, ids, labels, with_id=True), batch_size=64, num_workers=workers)
    checked = 0
    for x, y, idents in theirs:
        for i, ident in enumerate(idents):
            mine, label = ours.pop(ident)
            if mine.dtype != x.dtype or mine.shape != x[i].shape or not torch.equal(mine, x[i]) or label != int(y[i]):
                raise SystemExit(
                    f"ID {ident}: shardify gives {mine.dtype} {tuple(mine.shape)} label {label}, "
                    f"torch.load {x.dtype} {tuple(x[i].shape)} label {int(y[i])}"
                )
            checked += 1
    if ours:
        raise SystemExit(f"shardify gave {len(ours)} IDs the map-style recipe does not have")
    return checked


def run(work: Path, *, samples: int, workers: int, epochs: int, batch_size: int) -> dict[str, Any]:
    from shardify.convert.options import ConvertOptions
    from shardify.convert.write.run import convert_ids
    from shardify.reader import ShardedDataset, make_loader

    src = corpus.id_tensors(work, samples=samples)
    out = work / "shards"
    convert_ids(
        src["src"],
        out,
        partition=src["partition"],
        labels=src["labels"],
        pt_to_npy=True,
        options=ConvertOptions(progress=False, workers=workers, samples_per_shard=1000),
    )
    ids = json.loads(src["partition"].read_text())["train"]
    labels = json.loads(src["labels"].read_text())
    corpus.warm(src["src"], out)

    theirs = DataLoader(
        TensorFiles(src["src"], ids, labels),
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
    )
    ds = ShardedDataset(out, split="train", batch_size=batch_size, shuffle=True, fields=("npy", "cls"))
    times: dict[str, list[float]] = {"map-style torch.load": [], "shardify npy": []}
    with make_loader(ds, num_workers=workers) as ours:
        for epoch in range(epochs):
            ds.set_epoch(epoch)
            for name, loader in (("map-style torch.load", theirs), ("shardify npy", ours)):
                n, seconds = _epoch(loader)
                if n != samples:
                    raise SystemExit(f"{name} gave {n} samples in epoch {epoch}, expected {samples}")
                times[name].append(seconds)
    del theirs
    checked = _check_same(src["src"], out, ids, labels, workers=workers)
    best = {name: samples / min(t) for name, t in times.items()}
    return {
        "samples": samples,
        "workers": workers,
        "batch_size": batch_size,
        "epochs": epochs,
        "samples_per_s": best,
        "epoch_seconds": times,
        "ratio": best["shardify npy"] / best["map-style torch.load"],
        "same_tensors_checked": checked,
        "loadavg": os.getloadavg(),
        "cpus": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=4000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--dir", default=None, help="work folder (default: a temporary one, removed at the end)")
    args = ap.parse_args(argv)
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="shardify-bench-ids-"))
    try:
        result = run(work, samples=args.samples, workers=args.workers, epochs=args.epochs, batch_size=args.batch_size)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    print(
        f"{result['samples']} tensors 3x32x32 float32, batch {result['batch_size']}, "
        f"{result['workers']} workers, best epoch of {result['epochs']} (warm cache); "
        f"load average {result['loadavg'][0]:.1f} on {result['cpus']} CPUs"
    )
    for name, rate in result["samples_per_s"].items():
        epochs = ", ".join(f"{result['samples'] / s:.0f}" for s in result["epoch_seconds"][name])
        print(f"  {name:22s} {rate:8.0f} samples/s   (epochs: {epochs})")
    print(f"  ratio: {result['ratio']:.2f}x; same tensors and labels for all {result['same_tensors_checked']} IDs")
    return result


if __name__ == "__main__":
    main()
