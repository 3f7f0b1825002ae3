"""The DataLoader's worker processes seen from the loader: how one died, forking them cheaply,
and letting go of what a kept error would hold."""

from __future__ import annotations

import gc
import signal
import traceback
from typing import Any

from torch.utils.data import DataLoader

__all__ = ["how_died", "fork_frozen", "release_frames"]


def how_died(workers: Any) -> str | None:
    """How the first dead worker process of a DataLoader iterator ended, if one did."""
    for i, process in enumerate(getattr(workers, "_workers", ())):
        code = process.exitcode
        if code is None:
            continue
        if code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
            if -code == signal.SIGKILL:
                how += " (out of memory?)"
        else:
            how = f"exited with code {code}"
        return f"worker {i} (pid {process.pid}) {how}"
    return None


def release_frames(error: BaseException) -> None:
    """Clear the local variables of the finished frames in ``error``'s tracebacks (and its causes').

    They are torch's frames (user code ran in the workers) and hold the DataLoader iterator,
    its pipes and its prefetched batches in shared memory: a caller that keeps the error (a
    notebook, a logger) would keep all that open.
    """
    seen: set[int] = set()
    stack = [error]
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        stack.extend(x for x in (e.__cause__, e.__context__) if x is not None)


def fork_frozen(dataloader: DataLoader[Any]) -> Any:
    """``iter(dataloader)``, its worker processes forked with the garbage collector's objects frozen.

    A forked worker inherits every object of this process (torch's, the split index's); each
    of its full collections would walk them all, and write to every page it touches, so the
    pages shared with this process get copied. Frozen before the fork (``gc.freeze``), they
    are never walked by the workers; this process unfreezes them once they are started.
    """
    if dataloader.num_workers == 0:
        return iter(dataloader)
    gc.freeze()
    try:
        return iter(dataloader)
    finally:
        gc.unfreeze()
