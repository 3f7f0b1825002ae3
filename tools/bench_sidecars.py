"""Index bytes a rank reads: per-sample tables inline in the JSON index against in sidecars.

Run by hand (not a test):
    python tools/bench_sidecars.py [--samples 100000] [--per-shard 1000] [--world 16] [--delay-ms 0]

Writes the same split of tiny samples twice with ShardWriter: once with the per-sample tables
inline (the sidecar threshold above the split), once in sidecars (``<shard>.idx``, threshold
0); serves both over HTTP on 127.0.0.1 (tools/rangeserver.py) and reads one epoch of each as
rank ``world // 2`` of ``world`` (one process, ranged reads), counting the body bytes the
server sent by kind of file: JSON (manifest and split index), sidecars, shards (byte ranges),
and the seconds the epoch took (``read_s``, after the index is read); ``--delay-ms`` makes the
server wait that long before every answer (a remote store's latency).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rangeserver  # noqa: E402 - beside this file

from shardify.convert import ShardWriter  # noqa: E402
from shardify.convert.write import finish  # noqa: E402
from shardify.reader import ShardedDataset  # noqa: E402


def _kind(path: str) -> str:
    return "json" if path.endswith(".json") else "sidecars" if path.endswith(".idx") else "shards"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--per-shard", type=int, default=1000)
    ap.add_argument("--world", type=int, default=16)
    ap.add_argument("--delay-ms", type=float, default=0.0, help="added before every answer of the server")
    args = ap.parse_args(argv)
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(args.world // 2), str(args.world)
    out: dict[str, object] = {
        "samples": args.samples,
        "per_shard": args.per_shard,
        "world": args.world,
        "delay_ms": args.delay_ms,
    }
    with tempfile.TemporaryDirectory(prefix="shardify-sidecars-") as tmp:
        for name, above in (("inline", args.samples), ("sidecars", 0)):
            finish.SIDECAR_ABOVE_SAMPLES = above  # the writer's threshold, for this run only
            with ShardWriter(Path(tmp) / name, samples_per_shard=args.per_shard, fsync=False) as w:
                for i in range(args.samples):
                    w.write({"cls": i % 10, "txt": "x" * 20})
        with rangeserver.serve(tmp, rangeserver.Behaviour(delay_s=args.delay_ms / 1000)) as (base, served):
            for name in ("inline", "sidecars"):
                served.reset()
                ds = ShardedDataset(f"{base}/{name}", batch_size=256, shuffle=True, seed=0, fields=("__key__",))
                began = time.perf_counter()
                read = sum(len(b) for b in ds)
                seconds = time.perf_counter() - began
                row = {"samples_read": read, "json": 0, "sidecars": 0, "shards": 0, "sidecar_gets": 0}
                for path, sent in served.sent_by_path.items():
                    row[_kind(path)] += sent
                row["sidecar_gets"] = sum(p.endswith(".idx") for p in served.paths)
                row["shards_read"] = len({p for p in served.paths if p.endswith(".tar")})
                row["read_s"] = round(seconds, 3)
                out[name] = row
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
