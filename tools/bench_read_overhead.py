"""The reader's cost per sample outside decoding, run by hand (not a test).

    python tools/bench_read_overhead.py [--samples 100000] [--dataset DIR] [--loader]

Writes (once) a dataset of tiny samples (a label and 20 bytes of text) with ``ShardWriter``,
or reads ``--dataset``, then times two epochs of ``fields=("cls",)`` in one process, one
thread, and prints the CPU time per sample: what planning, shard reading, shuffling and
collating cost when there is nothing to decode. ``--loader``: through ``make_loader(num_workers=0)``,
so the training loop's side (the loader's own bookkeeping, its ``stats()`` timing) is counted too.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=100_000)
    p.add_argument("--dataset", default=None, help="a converted dataset with a cls field (default: make one)")
    p.add_argument("--loader", action="store_true", help="iterate make_loader(dataset, num_workers=0)")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from shardify.convert import ShardWriter
    from shardify.reader import ShardedDataset, make_loader

    root = Path(args.dataset or f"/tmp/shardify-bench-tiny-{args.samples}")
    if args.dataset is None and not (root / "manifest.json").exists():
        with ShardWriter(root, samples_per_shard=2000, fsync=False) as w:
            for i in range(args.samples):
                w.write({"cls": i % 10, "txt": "x" * 20})
    ds = ShardedDataset(str(root), split="train", batch_size=256, shuffle=True, seed=0, fields=("cls",))
    ds.set_epoch(0)
    for _ in ds:  # warm: page cache and shard layouts
        pass
    batches = make_loader(ds, num_workers=0) if args.loader else ds
    n = 0
    start = time.process_time()
    for epoch in (1, 2):
        ds.set_epoch(epoch)
        for labels in batches:
            n += len(labels)
    print(f"{root}: {n} samples in 2 epochs, {(time.process_time() - start) / n * 1e6:.2f} us CPU per sample")


if __name__ == "__main__":
    main()
