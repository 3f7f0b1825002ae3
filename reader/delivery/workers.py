"""The DataLoader's worker processes seen from the loader: how one died, forking them cheaply,
stopping them in bounded time, and letting go of what a kept error would hold."""

from __future__ import annotations

import gc
import logging
import signal
import time
import traceback
from typing import Any

import torch
from torch.utils.data import DataLoader

__all__ = ["STOP_GRACE_S", "how_died", "fork_frozen", "release_frames", "stop_workers"]

log = logging.getLogger("shardify.reader")

STOP_GRACE_S = 3.0
"""How long all the worker processes of a loader together get to exit when told to, before they are
terminated (then killed): torch's own shutdown gives each worker 5 s in turn, 40 s for 8 workers
busy with a batch (or stuck) when the loader closes."""


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


def stop_workers(workers: Any, *, grace_s: float = STOP_GRACE_S) -> None:
    """Stop the worker processes of the DataLoader iterator ``workers`` in bounded time.

    Every worker is told to stop at once (as torch does), then all are waited for against one
    deadline ``grace_s`` away; those still running are terminated, then killed, against a second
    one. torch's ``_shutdown_workers`` then finds them gone and closes the queues and the pin thread.
    """
    processes = list(getattr(workers, "_workers", ()))
    if processes and not getattr(workers, "_shutdown", True):
        if getattr(workers, "_worker_pids_set", False):  # ours to end now: not a death torch reports
            torch._C._remove_worker_pids(id(workers))
            workers._worker_pids_set = False
        workers._workers_done_event.set()
        for i, q in enumerate(workers._index_queues):
            if workers._persistent_workers or workers._workers_status[i]:
                q.put(None)
                workers._workers_status[i] = False
        _join_all(processes, grace_s)
        for end in ("terminate", "kill"):
            alive = [p for p in processes if p.is_alive()]
            if not alive:
                break
            log.warning(
                "DataLoader workers (pids %s) did not stop within %g s of being told to; %s them",
                ", ".join(str(p.pid) for p in alive),
                grace_s,
                "terminating" if end == "terminate" else "killing",
            )
            for p in alive:
                getattr(p, end)()
            _join_all(alive, grace_s)
    shutdown = getattr(workers, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def _join_all(processes: list[Any], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    for p in processes:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
