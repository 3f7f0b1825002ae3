"""The main job on a small built-in example: make images, convert them, stream them back.

    python examples/demo.py [--dir DIR]

Makes an ImageNet-style folder of synthetic photos (plus two broken files, to show the
report), converts it into shards, verifies them, then streams two epochs through the
training-side loader with augmentation and prints what happened at each step.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from shardify.reader import BatchOptions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="work folder (default: a temporary one, removed at the end)")
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--per-class", type=int, default=24)
    args = ap.parse_args()
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="shardify-demo-"))
    try:
        run(work, classes=args.classes, per_class=args.per_class)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


def run(work: Path, *, classes: int, per_class: int) -> None:
    from shardify.cli.common import count
    from shardify.convert.options import ConvertOptions
    from shardify.convert.synth import make_imagefolder
    from shardify.convert.verify import verify_dataset
    from shardify.convert.write.run import convert_imagefolder

    src, out = work / "images", work / "shards"
    t = time.perf_counter()
    make_imagefolder(src, classes=classes, per_class=per_class)
    (src / "n00000000" / "truncated.JPEG").write_bytes((src / "n00000000" / "n00000000_0.JPEG").read_bytes()[:5000])
    (src / "n00000001" / "notes.txt").write_text("not an image")
    n_files = sum(1 for p in src.rglob("*") if p.is_file())
    print(
        f"1. made {n_files} files in {src} ({classes} classes, one truncated JPEG, one text file) "
        f"in {time.perf_counter() - t:.1f} s"
    )

    t = time.perf_counter()
    result = convert_imagefolder(src, out, options=ConvertOptions(shard_size=1_000_000, progress=False))
    s = result.splits["train"]
    print(
        f"2. converted: {count(s.samples, 'sample')} in {count(s.shards, 'shard')} ({s.bytes / 1e6:.1f} MB) "
        f"in {time.perf_counter() - t:.2f} s; skipped {len(s.skipped)}, ignored {sum(s.ignored.values())}"
    )
    for p in s.skipped:
        print(f"   skipped {p.path}: {p.reason}")
    names = sorted(p.name for p in out.glob("train-*.tar"))
    print(f"   shards: {names[0]}" + (f" .. {names[-1]}" if len(names) > 1 else ""))

    report = verify_dataset(out, decode=True)
    print(f"3. verified (checksums, counts, key rules, every image decoded): {'ok' if report.ok else report.problems}")

    from shardify.reader import ShardedDataset, make_loader
    from shardify.reader import transforms as T

    ds = ShardedDataset(
        out,
        split="train",
        batch_size=16,
        shuffle=True,
        seed=0,
        transform=T.imagenet_train(224),
        batching=BatchOptions(drop_last=True),
    )
    loader = make_loader(ds, num_workers=2, device="cpu")
    for epoch in range(2):
        ds.set_epoch(epoch)
        t = time.perf_counter()
        first_labels = None
        n = 0
        for images, labels in loader:
            if first_labels is None:
                first_labels = labels[:8].tolist()
                shape, dtype = tuple(images.shape), images.dtype
                mean, std = images.float().mean().item(), images.float().std().item()
            n += images.shape[0]
        dt = time.perf_counter() - t
        print(
            f"4. epoch {epoch}: {n} samples in {len(ds)} batches of {shape} {dtype} "
            f"(normalized: mean {mean:+.2f}, std {std:.2f}) in {dt:.2f} s; first labels {first_labels}"
        )

    # checkpoint after 2 batches of epoch 1, then resume in a fresh loader: the same batches follow
    ds.set_epoch(1)
    it = iter(loader)
    seen = [next(it)[1].tolist() for _ in range(2)]
    rest = [labels.tolist() for _, labels in it]
    ds.set_epoch(1)
    it = iter(loader)
    for _ in range(2):
        next(it)
    state = loader.state_dict()
    del it
    resumed_ds = ShardedDataset(
        out,
        split="train",
        batch_size=16,
        shuffle=True,
        seed=0,
        transform=T.imagenet_train(224),
        batching=BatchOptions(drop_last=True),
    )
    resumed = make_loader(resumed_ds, num_workers=2, device="cpu")
    resumed.load_state_dict(state)
    again = [labels.tolist() for _, labels in resumed]
    print(
        f"5. checkpoint after {count(len(seen), 'batch', 'batches')} ({state_summary(state)}), resumed in a new "
        f"loader: {count(len(again), 'batch', 'batches')}, identical to the uninterrupted run: {again == rest}"
    )
    print("done.")


def state_summary(state: dict) -> str:
    """A loader state in a few words (the dict itself, checksums included, is ~900 characters)."""
    return f"state: epoch {state['epoch']}, {state['batches']} batches done, {len(json.dumps(state))} bytes as JSON"


if __name__ == "__main__":
    main()
