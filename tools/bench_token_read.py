"""Packed-token read throughput from local disk: ``TokenDataset`` and, when installed, LitData's ``TokensLoader``.

Makes a deterministic token corpus (``--docs`` documents of 1..``2 * --mean`` tokens, ids below
50,000, uint16, an end-of-document id), converts it with ``convert_tokens`` (chunked, the
default, and ``--layouts per-sample`` for the per-sample layout), then times one process
reading shuffled batches of ``--batch-size`` x ``--seq-len`` (inputs and labels, int64) until
``--batches`` batches or the epoch's end, best of ``--rounds`` (the files in the page cache
after the first), per second of wall time and per second of the process's CPU time (steadier
on a shared machine). With ``litdata`` installed (it is not a dependency), the same documents
are written by ``litdata.optimize`` and read by ``StreamingDataset(item_loader=TokensLoader(
block_size=seq_len + 1), shuffle=True)`` batched by ``StreamingDataLoader(num_workers=0)``.
Prints tokens per second (input tokens of the batches) for each.

Usage: ``python tools/bench_token_read.py [--docs 20000] [--mean 1000] [--seq-len 2048]
[--batch-size 8] [--batches 1200] [--rounds 5] [--layouts chunked per-sample] [--json]``
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from shardify.convert import convert_tokens
from shardify.reader import TokenDataset

VOCAB = 50_000
EOS = 0


def document(text: str) -> np.ndarray:
    """The tokens of document ``text`` (its number): a seeded draw, 1..2 * mean tokens."""
    number, mean = (int(x) for x in text.split())
    rng = np.random.default_rng(number)
    return rng.integers(1, VOCAB, size=int(rng.integers(1, 2 * mean)), dtype=np.int64)


def make_split(root: Path, docs: int, mean: int, chunk: int | None) -> int:
    """Convert the corpus into ``root``; its tokens."""
    texts = [f"{i} {mean}" for i in range(docs)]
    convert_tokens(
        texts, root, tokenizer=document, vocab_size=VOCAB, eos=EOS, chunk=chunk, workers=1, fsync=False, progress=False
    )
    return int(sum(len(document(t)) + 1 for t in texts))


def time_shardify(root: Path, args: argparse.Namespace) -> tuple[float, float]:
    """Best tokens per second, of wall time and of the process's CPU time, of ``args.rounds``
    reads of up to ``args.batches`` batches."""
    best = cpu_best = 0.0
    for r in range(args.rounds):
        ds = TokenDataset(root, seq_len=args.seq_len, batch_size=args.batch_size, seed=r)
        t0, c0 = time.perf_counter(), time.process_time()
        n = 0
        for i, b in enumerate(ds):
            n += int(b["input_ids"].numel())
            if i + 1 == args.batches:
                break
        best = max(best, n / (time.perf_counter() - t0))
        cpu_best = max(cpu_best, n / max(time.process_time() - c0, 1e-9))
        ds.close()
    return best, cpu_best


def time_litdata(folder: Path, args: argparse.Namespace) -> tuple[float, float] | str:
    """Best tokens/s (wall, CPU) of LitData's TokensLoader on the same documents (or why it was not run)."""
    try:
        import litdata  # not a dependency: install it by hand to compare
        from litdata.streaming.item_loader import TokensLoader
    except ImportError as e:
        return f"not run: {e}"
    out = folder / "litdata"
    texts = [f"{i} {args.mean}" for i in range(args.docs)]

    litdata.optimize(
        fn=_lit_tokens,
        inputs=texts,
        output_dir=str(out),
        chunk_size=(args.seq_len + 1) * 1024,
        item_loader=TokensLoader(),
        num_workers=1,
    )
    best = cpu_best = 0.0
    for r in range(args.rounds):
        ds = litdata.StreamingDataset(
            str(out), item_loader=TokensLoader(block_size=args.seq_len + 1), shuffle=True, seed=r
        )
        loader = litdata.StreamingDataLoader(ds, batch_size=args.batch_size, num_workers=0)
        t0, c0 = time.perf_counter(), time.process_time()
        n = 0
        for i, b in enumerate(loader):
            inputs, labels = b[:, :-1].long(), b[:, 1:].long()
            n += int(inputs.numel()) + 0 * int(labels.numel())
            if i + 1 == args.batches:
                break
        best = max(best, n / (time.perf_counter() - t0))
        cpu_best = max(cpu_best, n / max(time.process_time() - c0, 1e-9))
    return best, cpu_best


def _lit_tokens(text: str) -> Any:
    import torch

    tokens = document(text)
    return torch.from_numpy(np.append(tokens, EOS).astype(np.int32))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=20_000)
    p.add_argument("--mean", type=int, default=1000)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--batches", type=int, default=1200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--layouts", nargs="+", default=["chunked"], choices=["chunked", "per-sample"])
    p.add_argument("--no-litdata", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="bench_token_read_"))
    out: dict[str, Any] = {"docs": args.docs, "seq_len": args.seq_len, "batch_size": args.batch_size}
    try:
        for layout in args.layouts:
            root = folder / layout
            out["tokens"] = make_split(root, args.docs, args.mean, 256 if layout == "chunked" else None)
            wall, cpu = time_shardify(root, args)
            out[f"shardify_{layout}_tokens_per_s"] = round(wall)
            out[f"shardify_{layout}_tokens_per_cpu_s"] = round(cpu)
        if not args.no_litdata:
            lit = time_litdata(folder, args)
            if isinstance(lit, str):
                out["litdata_tokens_per_s"] = lit
            else:
                out["litdata_tokens_per_s"], out["litdata_tokens_per_cpu_s"] = round(lit[0]), round(lit[1])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {v:,}" if isinstance(v, int) else f"{k}: {v}")
    return out


if __name__ == "__main__":
    main()
