"""``progress_bar``: the one tqdm bar every long command shows (conversion, verify, bench).

A bar on stderr with its rate and ETA, shown only when asked for and when stderr is a
terminal: a job whose stderr goes to a log file or a pipe gets no bar (no carriage-return
noise in logs). tqdm is imported only when a bar is shown (~50 ms).
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

__all__ = ["progress_bar", "wants_bar"]


def wants_bar(enabled: bool, stream: TextIO | None = None) -> bool:
    """Whether a bar is shown: ``enabled`` and ``stream`` (default: stderr) is a terminal."""
    stream = sys.stderr if stream is None else stream
    if not enabled or stream is None:
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream
        return False


def progress_bar(
    *,
    total: float | None,
    desc: str,
    unit: str,
    enabled: bool = True,
    initial: float = 0,
    unit_scale: bool = True,
    stream: TextIO | None = None,
) -> Any:
    """A tqdm bar of ``total`` ``unit``s (rate and ETA) on ``stream`` (default: stderr), or
    None when :func:`wants_bar` says no; callers do ``if bar is not None: bar.update(n)``."""
    stream = sys.stderr if stream is None else stream
    if not wants_bar(enabled, stream):
        return None
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        unit=unit,
        unit_scale=unit_scale,
        file=stream,
        dynamic_ncols=True,
        smoothing=0.1,
    )
