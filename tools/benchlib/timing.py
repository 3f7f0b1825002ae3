"""Timing runs and printing results, the same way in every tool.

Figures are the best (the least disturbed run on a shared machine) with the median beside it;
a result is a flat dict printed as one JSON line (``--json``) or as a markdown table.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["runs", "best_of", "min_median", "summary", "markdown_table", "emit"]


def runs(
    fn: Callable[[], object],
    repeat: int,
    *,
    clock: Callable[[], float] = time.perf_counter,
    sync: Callable[[], object] | None = None,
) -> list[float]:
    """Seconds of each of ``repeat`` calls of ``fn`` (``clock``: wall time, or ``time.process_time``);
    ``sync`` (e.g. ``torch.cuda.synchronize``) runs before the clock starts and before it stops."""
    out = []
    for _ in range(repeat):
        if sync is not None:
            sync()
        t = clock()
        fn()
        if sync is not None:
            sync()
        out.append(clock() - t)
    return out


def best_of(fn: Callable[[], object], repeat: int, *, clock: Callable[[], float] = time.perf_counter) -> float:
    """The fastest of ``repeat`` calls of ``fn``, in seconds."""
    return min(runs(fn, repeat, clock=clock))


def summary(values: Sequence[float]) -> dict[str, float]:
    """``{"best": min, "median": median}`` of ``values``."""
    return {"best": min(values), "median": statistics.median(values)}


def min_median(values: Sequence[float], fmt: str = ".3f") -> str:
    """``"min / median"`` of ``values``, for a table cell."""
    return f"{min(values):{fmt}} / {statistics.median(values):{fmt}}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table of ``rows`` under ``headers`` (cells as they print)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def emit(result: dict[str, Any], *, as_json: bool, text: str = "") -> None:
    """Print ``result`` as one JSON line (``as_json``), else ``text`` (or the result as a
    two-column markdown table when ``text`` is empty)."""
    if as_json:
        print(json.dumps(result), flush=True)
    else:
        print(text or markdown_table(["figure", "value"], sorted(result.items())), flush=True)
