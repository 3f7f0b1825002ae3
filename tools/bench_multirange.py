"""Client CPU of many small ranges of one file: one ``fetch_range`` per span against
``fetch_ranges`` (the spans in as few multi-range GETs as fit the Range header), over HTTP to
tools/rangeserver.py in its own process on 127.0.0.1.

``python tools/bench_multirange.py --spans 256 --span-bytes 5120 --rounds 20``: prints, per way,
the client's CPU and wall seconds per batch of spans (the median of ``rounds``, the two ways
alternating) and the GETs a batch took.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from shardify.remote import RetryPolicy, fetch_range, fetch_ranges, split_spans

__all__ = ["main"]

POLICY = RetryPolicy(retries=0, timeout_s=10.0)


def _spans(rng: random.Random, n: int, size: int, file_bytes: int) -> list[tuple[int, int]]:
    starts = sorted(rng.sample(range(0, file_bytes - size, size), n))
    return [(a, a + size) for a in starts]


def _one_by_one(url: str, spans: list[tuple[int, int]]) -> list[bytes]:
    return [fetch_range(url, a, b, retry=POLICY) for a, b in spans]


def _grouped(url: str, spans: list[tuple[int, int]]) -> list[bytes]:
    return [got for group in split_spans(spans) for got in fetch_ranges(url, group, retry=POLICY)]


def _time(fn: Callable[[], list[bytes]]) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=256)
    parser.add_argument("--span-bytes", type=int, default=5120)
    parser.add_argument("--file-mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as root:
        data = rng.randbytes(args.file_mib << 20)
        (Path(root) / "shard.tar").write_bytes(data)
        server = subprocess.Popen(
            [sys.executable, str(Path(__file__).parent / "rangeserver.py"), root],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout is not None
            url = f"{server.stdout.readline().strip()}/shard.tar"
            ways = {"one GET per span": _one_by_one, "multi-range GETs": _grouped}
            seen: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
            for i in range(args.rounds + 1):
                spans = _spans(rng, args.spans, args.span_bytes, len(data))
                for name, way in ways.items():
                    took = _time(lambda way=way, spans=spans: way(url, spans))
                    if i:  # the first round warms the connection and the page cache
                        seen[name].append(took)
                assert _grouped(url, spans) == [data[a:b] for a, b in spans]
            groups = len(split_spans(spans))
            what = f"{args.spans} spans of {args.span_bytes} bytes in a {args.file_mib} MiB file"
            print(f"{what}, median of {args.rounds}")
            for name, runs in seen.items():
                cpu = statistics.median(c for c, _ in runs)
                wall = statistics.median(w for _, w in runs)
                gets = args.spans if name.startswith("one") else groups
                print(
                    f"{name:18s} GETs {gets:4d}  client CPU {cpu * 1e3:7.2f} ms ({cpu / args.spans * 1e6:6.1f} us/span)"
                    f"  wall {wall * 1e3:7.2f} ms"
                )
        finally:
            if server.stdin is not None:
                server.stdin.close()
            server.wait(timeout=10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
