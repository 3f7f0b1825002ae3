"""What checking each sample against the index's checksum costs a read, run by hand (not a test).

    python tools/bench_sample_checks.py [--images 200] [--tiny 20000] [--rounds 5] [--dir DIR]

Two datasets, made once under ``--dir``: ``--images`` photo-like JPEGs at ImageNet's sizes
(``benchlib.corpus.photo_dataset``), read with ``T.imagenet_train(224)``; and ``--tiny`` tiny
samples, a label and 20 bytes of text (``benchlib.corpus.tiny_dataset``), read as
``fields=("cls",)``, and ``--tiny`` 3x32x32 arrays with a label (``benchlib.corpus.arrays_dataset``),
read as ``fields=("npy", "cls")``. Each is read one epoch at a time in this process (no workers, one thread),
shuffled, in turn under three settings, ``--rounds`` times (so load on the machine hits all
alike): ``check_samples=False`` (the header layout's reads, nothing checked), the default (each
sample read whole by its table and checked against its CRC-32), and the same with a SHA-256 of
each sample's bytes in place of the CRC-32 (what the check would cost with the table's former
digest). Prints the best CPU time per sample of each and its cost over the first.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from benchlib import corpus, timing


class _Equal:
    """Equal to any checksum: the SHA-256 variant's digests are made, not compared."""

    def __ne__(self, other: object) -> bool:
        return False

    def __getitem__(self, i: int) -> _Equal:
        return self


@contextmanager
def _sha256_check() -> Iterator[None]:
    """Each sample read hashed with SHA-256 where the reader makes its CRC-32."""
    from shardify.reader.io import seekread, shardfile

    saved = seekread.crc32, shardfile.ShardFiles.sample_ranges
    real = shardfile.ShardFiles.sample_ranges

    def ranges(self: Any, shard: int) -> Any:
        found = real(self, shard)
        return None if found is None else SimpleNamespace(ends=found.ends, crcs=_Equal())

    seekread.crc32 = lambda data, value=0: hashlib.sha256(data).digest()  # type: ignore[assignment]
    shardfile.ShardFiles.sample_ranges = ranges  # type: ignore[method-assign]
    try:
        yield
    finally:
        seekread.crc32, shardfile.ShardFiles.sample_ranges = saved  # type: ignore[method-assign]


def _epoch_cpu(make: Callable[[bool], Any], check: bool, epoch: int) -> tuple[float, int]:
    """CPU seconds and samples of one epoch of ``make(check)``."""
    ds = make(check)
    ds.set_epoch(epoch)
    n = 0
    start = time.process_time()
    for batch in ds:
        n += len(batch[-1]) if isinstance(batch, (tuple, list)) else len(batch)
    return time.process_time() - start, n


def compare(name: str, make: Callable[[bool], Any], rounds: int) -> None:
    settings = {"unchecked": (False, False), "CRC-32 (default)": (True, False), "SHA-256": (True, True)}
    per: dict[str, list[float]] = {k: [] for k in settings}
    _epoch_cpu(make, True, 0)  # warm: page cache, tables, layouts
    _epoch_cpu(make, False, 0)
    for r in range(rounds):
        for label, (check, sha) in settings.items():
            if sha:
                with _sha256_check():
                    s, n = _epoch_cpu(make, check, r + 1)
            else:
                s, n = _epoch_cpu(make, check, r + 1)
            per[label].append(s / n)
    base = min(per["unchecked"])
    rows = [[label, f"{min(v) * 1e6:.1f}", f"{(min(v) - base) / base * 100:+.1f}%"] for label, v in per.items()]
    print(f"\n{name}: {n} samples an epoch, best of {rounds} epochs, CPU per sample")
    print(timing.markdown_table(["check", "us per sample", "cost"], rows))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=200)
    p.add_argument("--tiny", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--dir", default="/tmp/shardify-bench-checks")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from shardify.reader import DecodeOptions, ShardedDataset
    from shardify.reader import transforms as T

    work = Path(args.dir)
    _, photos = corpus.photo_dataset(work, args.images, classes=10, samples_per_shard=100, shard_size=None)
    tiny = corpus.tiny_dataset(work / f"tiny-{args.tiny}", args.tiny)
    arrays = corpus.arrays_dataset(work / f"arrays-{args.tiny}", args.tiny, samples_per_shard=2000)

    def photo_ds(check: bool) -> Any:
        return ShardedDataset(
            photos,
            batch_size=32,
            shuffle=True,
            seed=0,
            transform=T.imagenet_train(224),
            decoding=DecodeOptions(check_samples=check),
        )

    def tiny_ds(check: bool) -> Any:
        return ShardedDataset(
            tiny, batch_size=256, shuffle=True, seed=0, fields=("cls",), decoding=DecodeOptions(check_samples=check)
        )

    compare(f"JPEGs, imagenet_train(224) ({photos.name})", photo_ds, args.rounds)

    def arrays_ds(check: bool) -> Any:
        return ShardedDataset(
            arrays,
            batch_size=256,
            shuffle=True,
            seed=0,
            fields=("npy", "cls"),
            decoding=DecodeOptions(check_samples=check),
        )

    compare(f"tiny samples, fields=('cls',) ({tiny.name})", tiny_ds, args.rounds)
    compare(f"3x32x32 arrays, fields=('npy', 'cls') ({arrays.name})", arrays_ds, args.rounds)


if __name__ == "__main__":
    main()
