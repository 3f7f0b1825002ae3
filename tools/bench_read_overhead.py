"""The reader's cost per sample outside decoding, run by hand (not a test).

    python tools/bench_read_overhead.py [--samples 100000] [--dataset DIR] [--loader]
    python tools/bench_read_overhead.py --bookkeeping

Writes (once) a dataset of tiny samples (a label and 20 bytes of text) with ``ShardWriter``,
or reads ``--dataset``, then times two epochs of ``fields=("cls",)`` in one process, one
thread, and prints the CPU time per sample: what planning, shard reading, shuffling and
collating cost when there is nothing to decode. ``--loader``: through ``make_loader(num_workers=0)``,
so the training loop's side (the loader's own bookkeeping, its ``stats()`` timing) is counted too.
``--bookkeeping``: the per-batch cost of ``loader.stats()``'s timing alone, each part in a loop of
its own against the same loop without it (best of 7 CPU times): a figure too small for the
epochs above to resolve on a busy machine.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from collections.abc import Callable
from pathlib import Path

from benchlib import corpus, timing

BATCH = 256


def _best(fn: Callable[[], object]) -> float:
    """CPU seconds of the fastest of 7 calls of ``fn``."""
    return timing.best_of(fn, 7, clock=time.process_time)


def bookkeeping(n: int = 20_000) -> None:
    """Print the stats timing's CPU cost per batch of ``BATCH`` tiny samples, part by part."""
    import torch

    from shardify.reader.delivery.stats import LoaderMeter, StageTable
    from shardify.reader.stages.batch import Cut
    from shardify.reader.stages.collate import Collate
    from shardify.reader.stages.process import Process

    batch = (torch.zeros(BATCH, 3, 32, 32, dtype=torch.uint8), torch.zeros(BATCH, dtype=torch.int64))
    table, items = StageTable(1), list(range(BATCH))

    def drain(it: object) -> None:
        for _ in it:  # type: ignore[attr-defined]
            pass

    def meter() -> None:
        m = LoaderMeter()
        c = m.begin(0, batch_size=BATCH)
        drain(m.loop(c, m.workers(c, itertools.repeat(batch, n))))

    def cuts(make: Callable[[], object]) -> Callable[[], None]:
        return lambda: [drain(make()) for _ in range(n)]

    plain = _best(lambda: drain(itertools.repeat(batch, n)))
    parts = {
        "worker's timing and shared row": (_best(lambda: drain(table.timed(0, itertools.repeat(batch, n)))) - plain)
        / n,
        "loader's wrappers (waits, samples)": (_best(meter) - plain) / n,
        "batch read whole, then processed": (
            _best(cuts(lambda: Process(Cut(iter(items), [BATCH]), int, batched=True)))
            - _best(cuts(lambda: Cut(map(int, iter(items)), [BATCH])))
        )
        / n,
        "collate timer": (
            _best(lambda: drain(Collate(itertools.repeat(items, n), len)))
            - _best(lambda: drain(map(len, itertools.repeat(items, n))))
        )
        / n,
    }
    for name, s in parts.items():
        print(f"  {name:36s} {s * 1e6:6.2f} us per batch")
    total = sum(parts.values())
    print(f"total {total * 1e6:.2f} us per batch = {total / BATCH * 1e9:.1f} ns per sample at batch {BATCH}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=100_000)
    p.add_argument("--dataset", default=None, help="a converted dataset with a cls field (default: make one)")
    p.add_argument("--loader", action="store_true", help="iterate make_loader(dataset, num_workers=0)")
    p.add_argument("--bookkeeping", action="store_true", help="only the stats timing's cost per batch")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    if args.bookkeeping:
        bookkeeping()
        return
    from shardify.reader import ShardedDataset, make_loader

    root = Path(args.dataset or corpus.tiny_dataset(Path(f"/tmp/shardify-bench-tiny-{args.samples}"), args.samples))
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
