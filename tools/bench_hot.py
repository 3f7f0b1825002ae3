"""The reader's and writer's hot paths, for comparing two trees: prints the CPU seconds of one.

    python tools/bench_hot.py jpeg|arrays|write DATA_DIR [--no-check] [--scale 1.0]

The tree measured is the one the running Python imports ``shardify`` from, so two trees (two
venvs, or two editable installs) are compared by running this file with each in turn,
alternating (``farm-bench --vs`` or a shell loop), each with its own ``DATA_DIR``: each side
converts its data with its own code, since the format may differ.

- ``jpeg``: 400 photo-like JPEGs of ImageNet's sizes (``benchlib.corpus.photo_dataset``) x 3
  epochs with ``transforms.imagenet_train(224)`` (RandomResizedCrop + flip), one process, batch 32.
- ``arrays``: 20,000 3x32x32 uint8 arrays and a label x 3 epochs, batch 256, one process.
- ``write``: ``ShardWriter`` of the same 20,000 arrays (``npy`` + ``cls``).

``--no-check`` reads with ``DecodeOptions(check_samples=False)``; ``--scale`` multiplies the
counts (a quick run). Prints ``<cpu seconds> <samples>``.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import corpus  # noqa: E402


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def write(data: Path, n: int) -> tuple[float, int]:
    from shardify.convert import ShardWriter

    arrays, labels = corpus.arrays(n)
    out = data / "written"
    shutil.rmtree(out, ignore_errors=True)
    t = _cpu()
    with ShardWriter(out, fsync=False) as w:
        for a, y in zip(arrays, labels):
            w.write({"npy": a, "cls": y})
    return _cpu() - t, n


def read(what: str, data: Path, scale: float, check: bool) -> tuple[float, int]:
    from shardify.reader import DecodeOptions, ShardedDataset, make_loader
    from shardify.reader import transforms as T

    kw: dict[str, Any]
    if what == "jpeg":
        _, path = corpus.photo_dataset(data, max(20, int(400 * scale)))
        kw = {"transform": T.imagenet_train(224), "fields": ("image", "cls"), "batch_size": 32}
    else:
        n = max(256, int(20000 * scale))
        path = corpus.arrays_dataset(data / f"arrays-{n}", n)
        kw = {"fields": ("npy", "cls"), "batch_size": 256}
    if not check:
        kw["decoding"] = DecodeOptions(check_samples=False)
    ds = ShardedDataset(str(path), shuffle=True, seed=0, **kw)
    t, n = _cpu(), 0
    for epoch in range(3):
        ds.set_epoch(epoch)
        with make_loader(ds, num_workers=0) as loader:
            for _, labels in loader:
                n += len(labels)
    return _cpu() - t, n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["jpeg", "arrays", "write"])
    ap.add_argument("data", type=Path)
    ap.add_argument("--no-check", action="store_true", help="DecodeOptions(check_samples=False)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the sample counts")
    args = ap.parse_args(argv)
    args.data.mkdir(parents=True, exist_ok=True)
    if args.what == "write":
        cpu, n = write(args.data, max(100, int(20000 * args.scale)))
    else:
        cpu, n = read(args.what, args.data, args.scale, not args.no_check)
    print(f"{cpu:.3f} {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
