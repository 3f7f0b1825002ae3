"""Planning a packed-token epoch at scale, on paper: seconds and memory of one worker's plan.

Run by hand (a test runs it small):
    python tools/sim_tokens.py [--tokens 1e12] [--docs 1e9] [--shard-tokens 1e8] [--seq-len 2048]
                               [--world 1024] [--workers 8] [--batch-size 8] [--map 1e6]

Builds the plan's only input synthetically, each shard's token total (no file, no document
length: a reader loads a shard's lengths when it reads the shard), then times in a fresh
(spawned) process, whose peak resident memory it reports, what a worker of rank
``world // 2`` does: the epoch's plan (:class:`~shardify.reader.tokens.plan.TokenPlan`), what
two earlier parts of a resumed epoch left (``remaining_runs``, parts read on other worlds),
its batch count, its first batch mapped to streams, sequences and shards; then the mapping of
``--map`` more positions (the worker's whole share when it is smaller) through the keyed order,
as the worker does batch by batch. It prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from multiprocessing import get_context
from multiprocessing.connection import Connection

from benchlib import memory


def _child(args: argparse.Namespace, conn: Connection) -> None:
    import numpy as np

    from shardify.reader.tokens.plan import Runs, TokenPlan, batch_positions, rank_batches, remaining_runs

    shards = max(1, round(args.tokens / args.shard_tokens))
    rng = np.random.default_rng(0)
    per = args.tokens / shards
    totals = np.maximum(1, rng.normal(per, per / 20, size=shards)).astype(np.int64)
    totals[-1] += int(args.tokens) - int(totals.sum())
    base = memory.memory_kib("self")["VmRSS"] * 1024
    rank, world, B = args.world // 2, args.world, args.batch_size
    t0 = time.perf_counter()
    n = int(totals.sum())  # one stream: its shards end to end
    plan = TokenPlan(totals=(n,), counts=(n,), seq_len=args.seq_len, seed=0, epoch=3)
    starts = np.concatenate(([0], np.cumsum(totals)))  # a stream's shard starts, as the reader keeps them
    history = ((max(1, world // 2), 1000), (world * 2, 10))
    runs = Runs(remaining_runs(plan.units, history, batch_size=B))
    num = rank_batches(runs.total, world=world, batch_size=B)
    pos = batch_positions(runs, rank=rank, world=world, batch=args.workers - 1, batch_size=B)
    stream, seq = plan.units_at(pos[pos >= 0])
    np.searchsorted(starts, plan.take_start(0) + seq * args.seq_len, side="right")
    t1 = time.perf_counter()
    share = min(int(args.map), -(-num // args.workers) * B)
    batches = -(-share // B)
    for b in range(0, batches * args.workers, args.workers * 1024):
        # the worker's batches, 1024 at a time, as positions (its share of the rank's runs)
        rows = np.concatenate(
            [
                batch_positions(runs, rank=rank, world=world, batch=k, batch_size=B)
                for k in range(b, min(b + args.workers * 1024, batches * args.workers), args.workers)
            ]
        )
        stream, seq = plan.units_at(rows[rows >= 0])
        np.searchsorted(starts, plan.take_start(0) + seq * args.seq_len, side="right")
    t2 = time.perf_counter()
    conn.send(
        {
            "tokens": int(args.tokens),
            "documents": int(args.docs),
            "shards": shards,
            "sequences": plan.units,
            "world": world,
            "workers": args.workers,
            "rank_batches": num,
            "plan_s": round(t1 - t0, 4),
            "mapped_positions": share,
            "map_s": round(t2 - t1, 3),
            "map_us_per_sequence": round((t2 - t1) / max(1, share) * 1e6, 3),
            "plan_memory_bytes": int(totals.nbytes + starts.nbytes),
            "document_lengths_never_loaded_bytes": int(args.docs) * 4,
            "rss_before": base,
            "rss_peak": round(memory.peak_mib() * 2**20),
        }
    )


def main(argv: list[str] | None = None) -> dict[str, object]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=float, default=1e12)
    p.add_argument("--docs", type=float, default=1e9)
    p.add_argument("--shard-tokens", type=float, default=1e8)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--world", type=int, default=1024)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--map", type=float, default=1e6)
    args = p.parse_args(argv)
    ctx = get_context("spawn")
    here, there = ctx.Pipe()
    child = ctx.Process(target=_child, args=(args, there))
    child.start()
    out: dict[str, object] = here.recv()
    child.join()
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
