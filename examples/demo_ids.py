"""The ID-labelled tensor-files recipe end to end: partition and labels in, a training loop out.

    python examples/demo_ids.py [--dir DIR] [--samples 600] [--workers 2]

Makes ``data/<ID>.pt`` (one 3x32x32 float32 tensor each, 10 classes) with ``partition.json``
and ``labels.json``, converts them with ``shardify convert ids ... --pt-to-npy``, trains a
small classifier for two epochs on ``train`` and evaluates on ``validation``, printing the
IDs of a few samples with their label and prediction.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch


def make_source(work: Path, *, samples: int, classes: int = 10) -> None:
    """``data/<ID>.pt``, ``partition.json`` (80% train) and ``labels.json``; each class adds its pattern."""
    g = torch.Generator().manual_seed(0)
    patterns = torch.randn(classes, 3, 32, 32, generator=g)
    (work / "data").mkdir(parents=True, exist_ok=True)
    ids = [f"patient{i:05d}" for i in range(samples)]
    labels = {ident: int(torch.randint(0, classes, (), generator=g)) for ident in ids}
    for ident in ids:
        x = torch.randn(3, 32, 32, generator=g) + 0.2 * patterns[labels[ident]]  # learnable
        torch.save(x, work / "data" / f"{ident}.pt")
    cut = samples * 4 // 5
    (work / "partition.json").write_text(json.dumps({"train": ids[:cut], "validation": ids[cut:]}))
    (work / "labels.json").write_text(json.dumps(labels))


def run(work: Path, *, samples: int, workers: int) -> dict[str, Any]:
    from shardify.cli import main as shardify
    from shardify.reader import ShardedDataset, make_loader

    make_source(work, samples=samples)
    print(f"1. made {samples} tensors in {work / 'data'}, partition.json and labels.json")
    code = shardify(
        [
            "convert",
            "ids",
            str(work / "data"),
            str(work / "shards"),
            "--partition",
            str(work / "partition.json"),
            "--labels",
            str(work / "labels.json"),
            "--pt-to-npy",
            "--quiet",
        ]
    )
    print(f"2. shardify convert ids ... --pt-to-npy: exit code {code}")

    device = "cuda" if torch.cuda.is_available() else "cpu"
    train = ShardedDataset(work / "shards", split="train", batch_size=32, shuffle=True, seed=0, fields=("npy", "cls"))
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    losses = []
    with make_loader(train, num_workers=workers, device=device) as loader:
        for epoch in range(2):
            train.set_epoch(epoch)
            total, n = 0.0, 0
            for x, y in loader:  # x: float32 [32, 3, 32, 32], y: int64 [32], both on the device
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                total, n = total + loss.item() * len(y), n + len(y)
            losses.append(total / n)
            print(f"3. epoch {epoch}: {n} samples, {len(train)} batches, mean loss {losses[-1]:.3f}")

    val = ShardedDataset(work / "shards", split="validation", batch_size=64, fields=("npy", "cls", "json"))
    seen: dict[str, tuple[int, int]] = {}
    with torch.no_grad(), make_loader(val, num_workers=workers, device=device) as loader:
        for x, y, meta in loader:  # meta["path"]: the IDs of the batch
            pred = model(x).argmax(1)
            seen.update(zip(meta["path"], zip(y.tolist(), pred.tolist())))
    correct = sum(label == p for label, p in seen.values())
    print(
        f"4. validation: {len(seen)} IDs, accuracy {correct / len(seen):.2f}; first: "
        + ", ".join(f"{i} (label {label}, predicted {p})" for i, (label, p) in list(seen.items())[:3])
    )
    return {"exit_code": code, "losses": losses, "validation": seen}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="work folder (default: a temporary one, removed at the end)")
    ap.add_argument("--samples", type=int, default=600)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="shardify-demo-ids-"))
    try:
        return run(work, samples=args.samples, workers=args.workers)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
