"""Time to the first batch, shardify next to webdataset and a plain image folder, each in a fresh process.

Run by hand (not a test):
    python tools/bench_first_batch.py [--data DIR] [--repeat 7] [--corpus photos,arrays] [--scale]
                                      [--old-code DIR]
    python tools/bench_first_batch.py --breakdown [--scale-rows 1300000] [--rank 3] [--world 64]
    python tools/bench_first_batch.py --next-epoch [--step-ms 50] [--corpus photos] [--old-code DIR]

Makes (once, cached in ``--data``) two corpora (``tools/benchlib/corpus.py``): ``--photos``
photo-like JPEGs of ImageNet sizes (20 classes, converted with shardify's image-folder
converter) and ``--arrays`` ``3x32x32`` uint8 arrays with int labels (written with
``ShardWriter`` into 32 shards). Then, for
each corpus, it reads the same tar shards with shardify (``ShardedDataset`` + ``make_loader``)
and with webdataset (``WebDataset(...).shuffle(1000)``, its default ``initial=100``, in a
DataLoader), and the photos also as a plain ImageFolder-style map dataset in a DataLoader
(``shuffle=True``): ``--workers`` workers, batches of ``--batch-size``, shuffle on, photos
cropped (RandomResizedCrop 224 + flip) to uint8 CHW. Every measurement is a fresh Python
process, the systems alternating, ``--repeat`` times; it prints min and median of

- ``iter->first``: from ``iter(loader)`` to the first batch (dataset and loader built before);
- ``setup+first``: from constructing the dataset (imports done) to the first batch;

and the imports, separately. ``--next-epoch`` times, instead, shardify's first batch of epoch 1
with persistent workers, after a loop whose steps take ``--step-ms`` read epoch 0 (from
``iter(loader)`` after ``set_epoch(1)`` to the first batch): the epoch boundary. ``--scale`` also
times shardify at ``--scale-rows`` small
samples (the corpus's listing of IDs, labels and captions, converted) as rank ``--rank`` of
``--world`` (batch 256). ``--breakdown`` says where that first batch goes, in one fresh
process: resolving the source (manifest and index), the epoch's sequence (once per process),
planning one worker's share for ``--world`` and for world 4096, scanning one shard's headers,
and the first batch through a DataLoader with ``--workers`` workers. ``--old-code DIR`` (repeatable) adds shardify run
from another checkout (e.g. ``mkdir /tmp/base && git archive HEAD~3 | tar -x -C /tmp/base``),
alternating with this one: before/after on a shared machine. The page cache is warmed once before the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

# -- one measurement, in a fresh process ----------------------------------------------------------

_CROP = r'''
import math, random
import numpy as np
import torch
from PIL import Image

def crop_flip(img, size=224):
    """RandomResizedCrop (torchvision's parameter draw) + horizontal flip on a PIL image, to uint8 CHW."""
    w, h = img.size
    area = w * h
    for _ in range(10):
        target = area * random.uniform(0.08, 1.0)
        aspect = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            x, y = random.randint(0, w - cw), random.randint(0, h - ch)
            break
    else:
        cw, ch = min(w, h), min(w, h)
        x, y = (w - cw) // 2, (h - ch) // 2
    img = img.resize((size, size), Image.BILINEAR, box=(x, y, x + cw, y + ch))
    if random.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1).contiguous()
'''


def _use_code(code: str) -> None:
    """Import ``shardify`` (and its ``convert``/``reader`` folders) from the checkout ``code``."""
    import importlib.abc
    import importlib.util

    places = {"shardify": "shardify", "shardify.convert": "convert", "shardify.reader": "reader"}

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
            if name not in places:
                return None
            folder = os.path.join(code, places[name])
            return importlib.util.spec_from_file_location(
                name, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder]
            )

    sys.meta_path.insert(0, Finder())


def child(spec: dict) -> dict:
    """Build the loader of ``spec`` and time its first batch (runs in a fresh process)."""
    if spec.get("code"):
        _use_code(spec["code"])
    t0 = time.perf_counter()
    system, kind, workers, bs = spec["system"], spec["corpus"], spec["workers"], spec["batch_size"]
    import torch

    if system == "shardify":
        from shardify.reader import BatchOptions, ShardedDataset, make_loader
        from shardify.reader import transforms as T

        if kind == "scale":
            os.environ["RANK"], os.environ["WORLD_SIZE"] = str(spec["rank"]), str(spec["world"])
        t1 = time.perf_counter()
        if kind == "photos":
            ds = ShardedDataset(
                spec["dataset"],
                batch_size=bs,
                shuffle=True,
                seed=0,
                transform=T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()]),
            )
        elif kind == "arrays":
            ds = ShardedDataset(spec["dataset"], batch_size=bs, shuffle=True, seed=0, fields=("npy", "cls"))
        else:
            ds = ShardedDataset(
                spec["dataset"],
                batch_size=bs,
                shuffle=True,
                seed=0,
                fields=("cls", "txt"),
                batching=BatchOptions(collate_fn=list),
            )
        loader = make_loader(ds, num_workers=workers)
        if spec.get("next_epoch"):  # epoch 0 through a loop of step_s steps; then time epoch 1's first batch
            for _ in loader:
                time.sleep(spec["step_s"])
            ds.set_epoch(1)
    elif system == "webdataset":
        import webdataset as wds
        from torch.utils.data import DataLoader, default_collate

        ns: dict = {}
        exec(_CROP, ns)
        t1 = time.perf_counter()
        with open(os.path.join(spec["dataset"], "train.json")) as f:
            urls = [os.path.join(spec["dataset"], s["url"]) for s in json.load(f)["shardlist"]]
        pipe = wds.WebDataset(urls, shardshuffle=len(urls), seed=0, empty_check=False).shuffle(1000)
        if kind == "photos":
            pipe = pipe.decode("pil").to_tuple("jpg;png", "cls").map_tuple(ns["crop_flip"], int)
        else:
            pipe = pipe.decode().to_tuple("npy", "cls")
        pipe = pipe.batched(bs, collation_fn=default_collate, partial=True)
        loader = DataLoader(pipe, batch_size=None, num_workers=workers, persistent_workers=workers > 0)
    else:  # an ImageFolder-style map dataset, as with torchvision
        from PIL import Image
        from torch.utils.data import DataLoader, Dataset

        ns = {}
        exec(_CROP, ns)
        crop_flip = ns["crop_flip"]

        class Folder(Dataset):
            def __init__(self, root: str) -> None:
                classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
                self.samples = [
                    (os.path.join(dirpath, n), label)
                    for label, c in enumerate(classes)
                    for dirpath, _, names in sorted(os.walk(os.path.join(root, c)))
                    for n in sorted(names)
                ]

            def __len__(self) -> int:
                return len(self.samples)

            def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
                path, label = self.samples[i]
                with open(path, "rb") as f:
                    return crop_flip(Image.open(f).convert("RGB")), label

        t1 = time.perf_counter()
        loader = DataLoader(
            Folder(spec["folder"]), batch_size=bs, shuffle=True, num_workers=workers, persistent_workers=workers > 0
        )
    t2 = time.perf_counter()
    it = iter(loader)
    batch = next(it)
    t3 = time.perf_counter()
    n = len(batch[0]) if isinstance(batch, (tuple, list)) and kind != "scale" else len(batch)
    del it, batch
    if hasattr(loader, "close"):
        loader.close()
    torch.set_num_threads(1)
    return {"import_s": t1 - t0, "setup_s": t2 - t1, "iter_first_s": t3 - t2, "setup_first_s": t3 - t1, "batch": n}


def run_child(spec: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{spec['system']} on {spec['corpus']} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- where the first batch of one rank of a large world goes -------------------------------------

_STAGES = r"""
import json, os, sys, time
t0 = time.perf_counter()
import torch
from shardify.reader import BatchOptions, ShardedDataset
from shardify.reader.io.sources import resolve_source
from shardify.reader.plan.assign import plan_worker, sequence_starts
from shardify.reader.plan.mix import epoch_sequence
from shardify.tario import scan_layout
t_import = time.perf_counter()
ds_path, rank, world, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
src = resolve_source(ds_path)
t_resolve = time.perf_counter()
seq = epoch_sequence([src.sizes], counts=None, seed=0, epoch=0, shuffle=True, block=4)
starts = sequence_starts(seq)
t_sequence = time.perf_counter()
plan_worker(seq, rank=rank, world=world, worker=0, workers=workers, batch_size=256, drop_last=True, starts=starts)
t_plan = time.perf_counter()
plan_worker(seq, rank=rank, world=4096, worker=0, workers=workers, batch_size=256, drop_last=True, starts=starts)
t_plan4096 = time.perf_counter()
with open(src.shards[0].url, "rb") as f:
    layout = scan_layout(f, shard=src.shards[0].url)
t_scan = time.perf_counter()
os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
t_start = time.perf_counter()
ds = ShardedDataset(ds_path, batch_size=256, shuffle=True, fields=("cls", "txt"),
                    batching=BatchOptions(collate_fn=list))
loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
it = iter(loader)
next(it)
t_first = time.perf_counter()
print(json.dumps({"import_s": t_import - t0, "resolve_s": t_resolve - t_import,
                  "sequence_s": t_sequence - t_resolve, "plan_s": t_plan - t_sequence,
                  "plan_world4096_s": t_plan4096 - t_plan, "scan_one_shard_s": t_scan - t_plan4096,
                  "shard_samples": len(layout), "shards": len(src.shards), "samples": src.num_samples,
                  "first_batch_s": t_first - t_start}))
"""


def breakdown(dataset: Path, args: argparse.Namespace) -> int:
    """Print where the first batch of rank ``--rank`` of ``--world`` goes (one fresh process)."""
    argv = [str(dataset), str(args.rank), str(args.world), str(args.workers)]
    out = subprocess.run([sys.executable, "-c", _STAGES, *argv], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(out.stderr)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"{r['samples']} samples in {r['shards']} shards ({r['shard_samples']} in shard 0); "
        f"rank {args.rank} of {args.world}, {args.workers} workers"
    )
    print(
        f"  first batch {r['first_batch_s']:.2f} s after ShardedDataset(...); separately: resolve source "
        f"{r['resolve_s'] * 1000:.0f} ms, the epoch's sequence {r['sequence_s'] * 1000:.0f} ms (once per process), "
        f"then plan one worker {r['plan_s'] * 1000:.1f} ms (world 4096: "
        f"{r['plan_world4096_s'] * 1000:.1f} ms), scan one shard's headers {r['scan_one_shard_s'] * 1000:.0f} ms; "
        f"imports {r['import_s']:.1f} s"
    )
    if args.json:
        print(json.dumps(r))
    return 0


# -- the runs -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("/tmp/shardify-bench-first"))
    ap.add_argument("--photos", type=int, default=6400)
    ap.add_argument("--arrays", type=int, default=50_000)
    ap.add_argument("--corpus", default="photos,arrays", help="comma-separated: photos, arrays")
    ap.add_argument("--systems", default="shardify,webdataset,folder")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--scale", action="store_true", help="also rank --rank of --world at --scale-rows samples")
    ap.add_argument("--scale-only", action="store_true", help="only the --scale measurement")
    ap.add_argument("--scale-rows", type=int, default=1_300_000)
    ap.add_argument("--rank", type=int, default=3)
    ap.add_argument("--world", type=int, default=64)
    ap.add_argument(
        "--old-code",
        type=Path,
        action="append",
        default=[],
        help="a checkout of shardify to time beside this one (repeatable)",
    )
    ap.add_argument(
        "--next-epoch",
        action="store_true",
        help="shardify only: time the first batch of epoch 1 (persistent workers), after epoch 0 was read "
        "by a loop whose steps take --step-ms",
    )
    ap.add_argument("--step-ms", type=float, default=50.0, help="the training step of --next-epoch's loop")
    ap.add_argument("--breakdown", action="store_true", help="only where the --scale first batch goes, by stage")
    ap.add_argument("--json", action="store_true", help="also print every measurement as JSON")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    # Deferred: a child (above) must choose its checkout (--old-code) before anything imports shardify.
    from benchlib import corpus, timing

    if args.breakdown:
        return breakdown(corpus.listing_dataset(args.data, args.scale_rows), args)

    args.data.mkdir(parents=True, exist_ok=True)
    base = {"workers": args.workers, "batch_size": args.batch_size}
    if args.next_epoch:
        base.update(next_epoch=True, step_s=args.step_ms / 1000)
        args.systems = "shardify"
    codes = [("", "shardify")] + [(str(c.resolve()), f"shardify@{c.name}") for c in args.old_code]
    runs: list[tuple[str, dict]] = []  # (label, spec)
    corpora = [] if args.scale_only else [c for c in args.corpus.split(",") if c]
    systems = [s for s in args.systems.split(",") if s]
    for kind in corpora:
        if kind == "photos":
            folder, dataset = corpus.photo_dataset(args.data, args.photos)
            corpus.warm(folder, dataset)
            paths = {"dataset": str(dataset), "folder": str(folder)}
        elif kind == "arrays":
            per_shard = -(-args.arrays // 32)
            dataset = corpus.arrays_dataset(
                args.data / f"arrays-{args.arrays}", args.arrays, samples_per_shard=per_shard, shard_size=None
            )
            corpus.warm(dataset)
            paths = {"dataset": str(dataset)}
        else:
            raise SystemExit(f"unknown corpus {kind!r}; want photos or arrays")
        for system in systems:
            if system == "folder" and kind != "photos":
                continue
            for code, label in codes if system == "shardify" else [("", system)]:
                runs.append((f"{kind:7s} {label}", {**base, **paths, "system": system, "corpus": kind, "code": code}))
    if args.scale or args.scale_only:
        dataset = corpus.listing_dataset(args.data, args.scale_rows)
        corpus.warm(dataset)
        for code, label in codes:
            runs.append(
                (
                    f"{args.scale_rows} samples, rank {args.rank}/{args.world}, batch 256: {label}",
                    {
                        **base,
                        "batch_size": 256,
                        "dataset": str(dataset),
                        "system": "shardify",
                        "corpus": "scale",
                        "code": code,
                        "rank": args.rank,
                        "world": args.world,
                    },
                )
            )
    results: dict[str, list[dict]] = {label: [] for label, _ in runs}
    load = os.getloadavg()[0]
    for _ in range(args.repeat):
        for label, spec in runs:  # alternating, so that a busy moment slows every system alike
            results[label].append(run_child(spec))
    print(
        f"{args.workers} workers, batch {args.batch_size}, shuffle on, {args.repeat} fresh processes each "
        f"(load average {load:.1f} -> {os.getloadavg()[0]:.1f}); seconds, min / median"
    )
    print(f"{'':60s} {'iter->first':>15s} {'setup+first':>15s} {'imports':>8s}")
    for label, rs in results.items():
        first, setup = (timing.min_median([r[k] for r in rs]) for k in ("iter_first_s", "setup_first_s"))
        print(f"{label:60s} {first:>15s} {setup:>15s} {statistics.median(r['import_s'] for r in rs):8.2f}")
    if args.json:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
