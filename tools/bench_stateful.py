"""What reading under torchdata's StatefulDataLoader costs against make_loader, and a state's size.

    python tools/bench_stateful.py [--samples 2000] [--shards 100] [--workers 2] [--epochs 3]

Writes ``--samples`` random 64x64 JPEGs in ``--shards`` shards (``benchlib.corpus.noise_dataset``), then times
epochs of the same ``ShardedDataset`` (batch 32, a 48-pixel random crop) read through
``make_loader`` and through ``StatefulDataLoader(batch_size=None)``, in turn, best epoch of
each. StatefulDataLoader calls ``ds.state_dict()`` in the worker after every batch; that call
is timed on its own too (in this process, mid-epoch), with the pickled size of a state.
"""

from __future__ import annotations

import argparse
import pickle
import tempfile
import time
from pathlib import Path

from benchlib import corpus

from shardify.reader import ShardedDataset, make_loader
from shardify.reader import transforms as T


def main() -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--shards", type=int, default=100)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    a = p.parse_args()
    root = corpus.noise_dataset(Path(tempfile.mkdtemp()) / "ds", a.samples, shards=a.shards)
    ds = ShardedDataset(root, batch_size=32, shuffle=True, seed=0, transform=T.RandomResizedCrop(48))
    loaders = {
        "make_loader": make_loader(ds, num_workers=a.workers),
        "StatefulDataLoader": StatefulDataLoader(
            ds, batch_size=None, num_workers=a.workers, persistent_workers=a.workers > 0
        ),
    }
    best = {name: float("inf") for name in loaders}
    for epoch in range(a.epochs):
        ds.set_epoch(epoch)
        for name, loader in loaders.items():
            t = time.perf_counter()
            n = sum(1 for _ in loader)
            best[name] = min(best[name], time.perf_counter() - t)
    for name, s in best.items():
        print(f"{name}: best epoch {s:.2f} s, {a.samples / s:,.0f} samples/s ({n} batches)")
    it = iter(ds)
    next(it)
    calls = 20_000
    t = time.perf_counter()
    for _ in range(calls):
        state = ds.state_dict()
    print(
        f"ds.state_dict(): {(time.perf_counter() - t) / calls * 1e6:.1f} us a call, "
        f"{len(pickle.dumps(state))} bytes pickled ({len(ds.source.shards)} shards)"
    )


if __name__ == "__main__":
    main()
