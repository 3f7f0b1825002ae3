"""What ``shardify bench`` measures: the reader on a dataset, next to bare decoding and webdataset.

Not imported by a training job: it holds the measurements (:mod:`~shardify.cli.bench.measure`),
what it is set against (:mod:`~shardify.cli.bench.compare`: bare processes, webdataset), the
fast-IDCT comparison (:mod:`~shardify.cli.bench.fastdecode`), the memory read from ``/proc``
(:mod:`~shardify.cli.procmem`), the shuffle figures from the
plan (:mod:`~shardify.cli.bench.shufflequality`) and the table
(:mod:`~shardify.cli.bench.table`). ``tools/bench_read.py`` runs it on a synthetic dataset.
"""

from __future__ import annotations

from shardify.cli.bench.measure import run_bench
from shardify.cli.bench.shufflequality import class_mixing, permutation_classes, shuffle_quality
from shardify.cli.bench.table import format_bench
from shardify.cli.procmem import child_pids, process_memory

__all__ = [
    "run_bench",
    "format_bench",
    "shuffle_quality",
    "class_mixing",
    "permutation_classes",
    "process_memory",
    "child_pids",
]
