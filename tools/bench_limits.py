"""Cost of convert_items' limits per item: the same conversion with and without
``item_timeout``/``max_worker_memory`` (supervised workers vs the plain process pool).

python tools/bench_limits.py [ITEMS]   (default 20,000 items of a 3x32x32 uint8 array and a label,
2 workers, no fsync; 3 rounds, the two sides alternating; prints each time and the best)
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time

import numpy as np

from shardify.convert import convert_items


def make(i: int) -> dict[str, object]:
    return {"npy": np.full((3, 32, 32), i % 251, dtype=np.uint8), "cls": i % 10}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    sides = (("plain", {}), ("limits", {"item_timeout": 60.0, "max_worker_memory": "1GiB"}))
    times: dict[str, list[float]] = {name: [] for name, _ in sides}
    for _ in range(3):
        for name, extra in sides:
            folder = tempfile.mkdtemp()
            started = time.perf_counter()
            convert_items(range(n), make, folder + "/out", workers=2, progress=False, fsync=False, **extra)
            times[name].append(time.perf_counter() - started)
            shutil.rmtree(folder)
    for name, got in times.items():
        print(f"{name:7s}", " ".join(f"{t:.2f}" for t in got), f"best {min(got):.2f} s = {n / min(got):,.0f} items/s")


if __name__ == "__main__":
    main()
