"""Memory over epochs: many epochs through persistent DataLoader workers; memory and open files stay flat.

Makes a small synthetic ImageFolder (``benchlib.corpus.photos``, 200x150 JPEGs in 4 classes),
converts it, then reads it for ``--epochs`` epochs with ``--workers`` persistent workers
(RandomResizedCrop + flip, uint8 batches), calling ``set_epoch`` each time as a training loop
does. After each epoch it records the resident memory (VmRSS, and its peak VmHWM) and open file
descriptors of the main process and of each worker, and the main process's threads
(``benchlib.memory``). Exit code 1 if, after the first epoch, a process's fd count changes or
its RSS grows by more than ``--rss-slack-mb``.

``--rows N`` reads instead the corpus's listing of ``N`` small samples (IDs, labels, captions;
converted once under ``--cache``) with no transform, as rank ``--rank`` of ``--world`` (set
through RANK/WORLD_SIZE, as torchrun does): memory at ImageNet's sample count.

    python tools/soak.py                      # 10 epochs, 2 workers, 2000 images
    python tools/soak.py --epochs 4 --json    # what tests/reader/test_faults.py runs
    python tools/soak.py --rows 1300000 --world 4 --epochs 5 --batch-size 256   # 1.3 M samples, rank 0 of 4
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchlib import corpus, memory

from shardify.reader import BatchOptions

__all__ = ["EpochStats", "soak", "flat", "main"]


@dataclass(frozen=True)
class EpochStats:
    """One epoch's figures; memory in MiB (resident set size)."""

    epoch: int
    seconds: float
    samples: int
    main_rss_mib: float
    main_fds: int
    main_threads: int
    worker_rss_mib: tuple[float, ...]
    worker_fds: tuple[int, ...]
    main_shm_fds: int = 0
    worker_shm_fds: tuple[int, ...] = ()
    worker_peak_mib: tuple[float, ...] = ()


_SHM_CELLS = 8


def make_data(root: Path, *, images: int) -> Path:
    """A converted dataset of ``images`` small JPEGs in 4 classes, ~8 shards."""
    from shardify.convert.options import ConvertOptions
    from shardify.convert.write.run import convert_imagefolder

    src = corpus.photos(root / "src", max(4, images), classes=4, sizes=((200, 150), (150, 200)))
    out = root / "data"
    convert_imagefolder(
        src, out, options=ConvertOptions(samples_per_shard=max(1, images // 8), workers=1, progress=False, fsync=False)
    )
    return out


def _batch_len(batch: object) -> int:
    if isinstance(batch, dict):
        return len(batch["__key__"])
    return len(batch[0] if isinstance(batch, (tuple, list)) else batch)  # type: ignore[arg-type]


def _settled(read: Callable[[], list[tuple[int, int]]], *, quiet_s: float = 0.3, limit_s: float = 10.0) -> Any:
    """``read()`` once it has given the same answer for ``quiet_s``: the workers make the next
    epoch's first batch as an epoch ends (opening its shards), so their files are counted once
    that is done, not at whatever point of it the epoch's end falls."""
    last, since, deadline = read(), time.monotonic(), time.monotonic() + limit_s
    while time.monotonic() - since < quiet_s and time.monotonic() < deadline:
        time.sleep(0.02)
        now = read()
        if now != last:
            last, since = now, time.monotonic()
    return last


def soak(data: Path, *, epochs: int, workers: int, batch_size: int, size: int | None) -> list[EpochStats]:
    """Read ``data`` for ``epochs`` epochs with persistent workers; figures after each epoch.
    ``size``: the crop of the images (None: the dataset's default fields, no transform)."""
    from shardify.reader import ShardedDataset, make_loader
    from shardify.reader import transforms as T

    transform = None if size is None else T.imagenet_train(size)
    ds = ShardedDataset(
        data, batch_size=batch_size, shuffle=True, seed=0, transform=transform, batching=BatchOptions(drop_last=True)
    )
    stats: list[EpochStats] = []
    with make_loader(ds, num_workers=workers, persistent_workers=True) as loader:
        for epoch in range(epochs):
            ds.set_epoch(epoch)
            start, samples = time.perf_counter(), 0
            for batch in loader:
                samples += _batch_len(batch)
            seconds = time.perf_counter() - start
            kids = memory.child_pids()
            main_fds, main_shm = memory.fd_counts("self")
            workers_fds = _settled(lambda pids=kids: [memory.fd_counts(p) for p in pids])
            stats.append(
                EpochStats(
                    epoch=epoch,
                    seconds=round(seconds, 3),
                    samples=samples,
                    main_rss_mib=round(memory.rss_mib("self"), 1),
                    main_fds=main_fds,
                    main_threads=memory.threads("self"),
                    worker_rss_mib=tuple(round(memory.rss_mib(p), 1) for p in kids),
                    worker_fds=tuple(n for n, _ in workers_fds),
                    main_shm_fds=main_shm,
                    worker_shm_fds=tuple(n for _, n in workers_fds),
                    worker_peak_mib=tuple(round(memory.memory_kib(p).get("VmHWM", 0) / 1024, 1) for p in kids),
                )
            )
    return stats


def flat(stats: list[EpochStats], *, rss_slack_mib: float) -> list[str]:
    """What grew after the first epoch (empty when memory and fds stayed flat)."""
    from shardify.reader.delivery.batchpool import MAX_SLOTS

    problems: list[str] = []
    first, rest = stats[0], stats[1:]
    for s in stats:
        # Batch slots (shardify.reader.delivery.batchpool) are made as needed, up to MAX_SLOTS per worker;
        # the rest are a few shared cells (epoch, report, slot tokens).
        if s.main_shm_fds > MAX_SLOTS * len(s.worker_shm_fds) + _SHM_CELLS or any(
            n > MAX_SLOTS + _SHM_CELLS for n in s.worker_shm_fds
        ):
            problems.append(
                f"epoch {s.epoch}: shared-memory fds main {s.main_shm_fds} workers "
                f"{s.worker_shm_fds}, more than the batch slots can explain"
            )
    for s in rest:
        if s.main_fds != first.main_fds or s.worker_fds != first.worker_fds:
            problems.append(
                f"epoch {s.epoch}: fds main {s.main_fds} workers {s.worker_fds}, "
                f"epoch {first.epoch} had {first.main_fds} and {first.worker_fds}"
            )
        if len(s.worker_rss_mib) != len(first.worker_rss_mib):
            problems.append(
                f"epoch {s.epoch}: {len(s.worker_rss_mib)} workers, first epoch had {len(first.worker_rss_mib)}"
            )
    if rest:
        last = rest[-1]
        grew = last.main_rss_mib - first.main_rss_mib
        if grew > rss_slack_mib:
            problems.append(f"main RSS grew {grew:.1f} MiB from epoch {first.epoch} to {last.epoch}")
        for i, (a, b) in enumerate(zip(first.worker_rss_mib, last.worker_rss_mib)):
            if b - a > rss_slack_mib:
                problems.append(f"worker {i} RSS grew {b - a:.1f} MiB from epoch {first.epoch} to {last.epoch}")
    return problems


def _table(stats: list[EpochStats]) -> str:
    head = f"epoch  seconds  samples  main RSS MiB  {'worker RSS (peak) MiB':<30}"
    lines = [head + "  main fds  worker fds  shm fds      threads"]
    for s in stats:
        workers = ", ".join(f"{r:.1f} ({p:.0f})" for r, p in zip(s.worker_rss_mib, s.worker_peak_mib))
        shm = f"{s.main_shm_fds}/{','.join(map(str, s.worker_shm_fds))}"
        lines.append(
            f"{s.epoch:>5}  {s.seconds:>7.2f}  {s.samples:>7}  {s.main_rss_mib:>12.1f}  {workers:<30}  "
            f"{s.main_fds:>8}  {','.join(map(str, s.worker_fds)):>10}  {shm:<11}  {s.main_threads:>7}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--images", type=int, default=2000, help="synthetic images to convert (default 2000)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--size", type=int, default=112, help="crop size (default 112)")
    parser.add_argument("--data", type=Path, help="read this converted dataset instead of making one")
    parser.add_argument("--rows", type=int, help="read the listing corpus of this many small samples instead")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "shardify-bench-scale")
    parser.add_argument("--world", type=int, default=1, help="read as rank --rank of this many (default 1)")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument(
        "--rss-slack-mb",
        type=float,
        default=16.0,
        help="allowed RSS growth per process after the first epoch, MiB (default 16)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if args.epochs < 2:
        parser.error(f"--epochs {args.epochs}: need at least 2 to compare")
    if args.world > 1:
        os.environ["RANK"], os.environ["WORLD_SIZE"] = str(args.rank), str(args.world)
    with tempfile.TemporaryDirectory(prefix="shardify-soak-") as tmp:
        if args.rows:
            data, size = corpus.listing_dataset(args.cache, args.rows), None
        else:
            data, size = args.data or make_data(Path(tmp), images=args.images), args.size
        stats = soak(data, epochs=args.epochs, workers=args.workers, batch_size=args.batch_size, size=size)
    problems = flat(stats, rss_slack_mib=args.rss_slack_mb)
    if args.json:
        print(json.dumps({"epochs": [asdict(s) for s in stats], "problems": problems}))
    else:
        print(_table(stats))
        print(
            "\n".join(problems)
            if problems
            else f"flat: no fd change and RSS growth within {args.rss_slack_mb:g} MiB per process after epoch 0"
        )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
