"""Remote reading figures, run by hand through ``python tools/bench_read.py --remote``.

Serves a converted dataset with tools/rangeserver.py on 127.0.0.1 (optionally adding a delay
to every request) and measures (a) one epoch in one process, ImageNet training transform,
from local disk and over HTTP at each added latency (ranged reads), and the same for tiny
samples; (b) the bytes each of N simulated nodes fetches in an epoch over the bytes of the
samples its ranks consume (each node a process with its own cache folder and RANK/WORLD_SIZE).
"""

from __future__ import annotations

import base64
import contextlib
import json
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import rangeserver
from benchlib import corpus

from shardify.reader import CacheOptions, SamplingOptions, ShardedDataset
from shardify.reader import transforms as T
from shardify.sampletable import SampleTable
from shardify.sidecar import decode as decode_sidecar

__all__ = ["read_rate", "node_traffic", "tiny_dataset"]


def _epoch_seconds(
    spec: Any, *, transform: Any, fields: tuple[str, ...], requests: int, block: int
) -> tuple[float, int]:
    ds = ShardedDataset(
        spec,
        batch_size=64,
        shuffle=True,
        seed=0,
        transform=transform,
        fields=fields,
        sampling=SamplingOptions(shuffle_block=block),
        cache=CacheOptions(requests=requests),
    )
    ds.set_epoch(0)
    t0 = time.perf_counter()
    n = sum(len(b[-1]) for b in ds)
    return time.perf_counter() - t0, n


def read_rate(dataset: Path, *, delays_ms: list[float], photos: bool, requests: int, block: int) -> list[dict]:
    """Samples per second of one epoch in one process, local and over HTTP at each delay."""
    transform = T.imagenet_train(224) if photos else None
    fields = ("image", "cls") if photos else ("npy", "cls")
    _epoch_seconds(dataset, transform=transform, fields=fields, requests=requests, block=block)  # warm-up
    rows = []
    for delay in delays_ms:  # local and remote back to back, so that a busy machine slows both alike
        local_s, n = _epoch_seconds(dataset, transform=transform, fields=fields, requests=requests, block=block)
        with _server_process(dataset.parent, delay) as base:
            s, m = _epoch_seconds(
                f"{base}/{dataset.name}", transform=transform, fields=fields, requests=requests, block=block
            )
        rows.append({"delay_ms": delay, "local_per_s": n / local_s, "http_per_s": m / s, "ratio": local_s / s})
    return rows


@contextlib.contextmanager
def _server_process(root: Path, delay_ms: float) -> Iterator[str]:
    """The server in its own process, so that it does not share the reader's interpreter."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("rangeserver.py")), str(root), "--delay-ms", str(delay_ms)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc.stdout.readline().strip()  # type: ignore[union-attr]
    finally:
        proc.stdin.close()  # type: ignore[union-attr]
        proc.wait(timeout=30)


def _node(spec: str, rank: int, world: int, cache: str, out: Any) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    import torch

    torch.set_num_threads(1)
    ds = ShardedDataset(
        spec, batch_size=64, shuffle=True, seed=0, fields=("__key__", "cls"), cache=CacheOptions(dir=cache)
    )
    ds.set_epoch(0)
    out.put([k for keys, _ in ds for k in keys])


def _tables(dataset: Path, index: dict) -> list[SampleTable]:
    """Each shard's per-sample table: inline in the JSON index, or from its sidecar."""
    out = []
    for e in index["shardlist"]:
        if "samples" in e:
            out.append(SampleTable(base64.b64decode(e["samples"])))
        else:
            data = (dataset / f"{e['url']}.idx").read_bytes()
            out.append(decode_sidecar(data, shard=e["url"], ref=None, nsamples=e["nsamples"], filesize=e["filesize"]))
    return out


def node_traffic(dataset: Path, *, nodes: list[int], work: Path) -> list[dict]:
    """Bytes fetched per node over the bytes of the samples it consumed, for each node count:
    the samples' ranges alone, and with the index files (manifest, JSON or compact index,
    sidecars) the node fetched whole."""
    index = json.loads((dataset / "train.json").read_text())
    size: dict[str, int] = {}
    for e, table in zip(index["shardlist"], _tables(dataset, index)):
        for (a, b, _), key in zip(table.ranges(), _keys(dataset / e["url"])):
            size[key] = b - a
    rows = []
    ctx = multiprocessing.get_context("spawn")
    with rangeserver.serve(dataset.parent) as (base, served):
        for world in nodes:
            ratios, whole, metas = [], [], []
            for rank in range(world):
                served.reset()
                q = ctx.Queue()
                p = ctx.Process(
                    target=_node, args=(f"{base}/{dataset.name}", rank, world, str(work / f"n{world}-{rank}"), q)
                )
                p.start()
                keys = q.get(timeout=600)
                p.join()
                share = sum(size[k] for k in set(keys))
                meta = sum(n for path, n in served.sent_by_path.items() if path.endswith((".json", ".cidx", ".idx")))
                ratios.append((served.sent - meta) / share)
                whole.append(served.sent / share)
                metas.append(meta)
            rows.append(
                {
                    "nodes": world,
                    "max_over_share": max(ratios),
                    "mean_over_share": sum(ratios) / world,
                    "max_over_share_with_index": max(whole),
                    "index_bytes_per_node": max(metas),
                }
            )
    return rows


def _keys(shard: Path) -> list[str]:
    from shardify.tario import scan_layout

    with open(shard, "rb") as f:
        layout = scan_layout(f, shard=str(shard))
    return [layout.key(i) for i in range(len(layout))]


def tiny_dataset(out: Path, n: int) -> Path:
    """``n`` arrays of 3x32x32 uint8 (CIFAR-sized, ``benchlib.corpus.arrays``), 1,000 per shard, made once."""
    return corpus.arrays_dataset(out / f"tiny-{n}", n, classes=10, samples_per_shard=1000)
