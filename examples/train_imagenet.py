"""ImageNet-style DDP training on shardify shards: a script to copy and adapt.

    torchrun --nproc_per_node=8 examples/train_imagenet.py --data out/imagenet --epochs 90 \\
        --batch-size 256 --workers 8 --checkpoint ckpt.pt --checkpoint-every 1000

Runs as one process per GPU under torchrun (NCCL), or on the CPU (gloo) when there is no
GPU. Each rank builds the same ShardedDataset: the reader gives every rank the same number
of batches, so DDP never waits on a rank that ran out of data. ``set_epoch`` gives a new
order and new augmentations each epoch. The checkpoint holds the model, the optimizer and
the loader's position; restarting the same command resumes mid-epoch with exactly the
batches that were left. The model here is a small CNN so that the script runs anywhere:
put your own (torchvision's resnet50, say) in ``build_model``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from shardify.reader import BatchOptions, ShardedDataset, make_loader
from shardify.reader import transforms as T


def build_model(num_classes: int) -> nn.Module:
    """A small CNN; replace with the network you train."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, num_classes),
    )


def with_key(sample: dict[str, Any]) -> tuple[Any, Any, str]:
    """Output (image, label, key): used with --log-keys to record which samples each rank saw."""
    image = next(v for k, v in sample.items() if isinstance(v, torch.Tensor) and v.dim() == 3)
    return image, sample["cls"], sample["__key__"]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="shardify dataset (folder or URL)")
    ap.add_argument("--split", default="train")
    ap.add_argument("--epochs", type=int, default=90)
    ap.add_argument("--batch-size", type=int, default=256, help="per rank")
    ap.add_argument("--workers", type=int, default=8, help="DataLoader workers per rank")
    ap.add_argument("--size", type=int, default=224, help="training crop size")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint", default=None, help="checkpoint file: saved periodically, resumed if it exists")
    ap.add_argument("--checkpoint-every", type=int, default=1000, help="steps between checkpoints")
    ap.add_argument("--max-steps", type=int, default=None, help="stop (after a checkpoint) once this many steps ran")
    ap.add_argument("--log-keys", default=None, help="append each rank's batch keys to FILE.rank<N>.jsonl")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    cuda = torch.cuda.is_available()
    if distributed:
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    rank = dist.get_rank() if distributed else 0
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)

    ds = ShardedDataset(
        args.data,
        split=args.split,
        batch_size=args.batch_size,
        shuffle=True,
        seed=args.seed,
        transform=T.imagenet_train(args.size),
        batching=BatchOptions(drop_last=True),
        map=with_key if args.log_keys else None,
    )
    loader = make_loader(ds, num_workers=args.workers, device=device)
    num_classes = max(len(ds.source.classes), 1000 if not ds.source.classes else 1)
    model = build_model(num_classes).to(device)
    if distributed:
        model = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)

    start_epoch, step = 0, 0
    if args.checkpoint and Path(args.checkpoint).exists():
        state = torch.load(args.checkpoint, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
        start_epoch, step = state["loader"]["epoch"], state["step"]
        if rank == 0:
            print(f"resumed at epoch {start_epoch}, batch {state['loader']['batches']}, step {step}", flush=True)

    def save() -> None:
        if rank == 0 and args.checkpoint:
            tmp = f"{args.checkpoint}.tmp"
            torch.save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "loader": loader.state_dict(),
                    "step": step,
                },
                tmp,
            )
            os.replace(tmp, args.checkpoint)
        if distributed:
            dist.barrier()

    log = open(f"{args.log_keys}.rank{rank}.jsonl", "a") if args.log_keys else None
    for epoch in range(start_epoch, args.epochs):
        ds.set_epoch(epoch)
        model.train()
        t0, seen, epoch_steps = time.perf_counter(), 0, 0
        for batch in loader:
            images, labels = batch[0], batch[1]
            loss = F.cross_entropy(model(images), labels.to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            epoch_steps += 1
            seen += len(labels)
            if log is not None:
                log.write(json.dumps({"epoch": epoch, "step": step, "keys": list(batch[2])}) + "\n")
                log.flush()
            if args.checkpoint and step % args.checkpoint_every == 0:
                save()
            if args.max_steps is not None and step >= args.max_steps:
                save()
                print(f"rank {rank}: stopping at step {step} (--max-steps)", flush=True)
                if distributed:
                    dist.destroy_process_group()
                return
        dt = time.perf_counter() - t0
        print(
            f"rank {rank}: epoch {epoch}: {epoch_steps} steps, {seen} samples, {seen / dt:.0f} samples/s, "
            f"loss {loss.item():.3f}",
            flush=True,
        )
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
