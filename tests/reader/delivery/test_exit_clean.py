"""After the documented recovery from a killed worker, nothing of the loader runs at interpreter exit.

A loop stopped by an error raised in its own body (torch's SIGCHLD handler, when a worker dies
while the loop runs its own code), or one that keeps its iterator, leaves the loader's
generator suspended. Unless the loader closes it when a state is loaded, a new iteration
starts or the loader closes, its clean-up runs at interpreter shutdown, when the modules it
needs are gone: ``Exception ignored in: <generator object Loader._run ...> ... TypeError:
'NoneType' object is not callable``.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from shardify.convert import ShardWriter
from shardify.reader import ShardedDataset, make_loader

TIME_LIMIT_S = 120

# Imported by the child first: a clean-up of the loader that runs during interpreter shutdown
# fails there (as the weakref module's did), so that it shows in stderr whatever the order in
# which the interpreter clears its modules.
PROBE = """
import sys
from shardify.reader.delivery import loader as _loader

_shut_down = _loader.Loader._shut_down


def _probed(self, workers):
    if sys.is_finalizing():
        raise RuntimeError("the loader cleans up at interpreter shutdown")
    return _shut_down(self, workers)


_loader.Loader._shut_down = _probed
"""

CHILD = """
import os, signal, sys, time
sys.path.insert(0, os.path.dirname(__file__))
import probe  # noqa: F401
from shardify.errors import WorkerError
from shardify.reader import ShardedDataset, make_loader

ds = ShardedDataset(sys.argv[1], batch_size=8, fields=("npy", "cls"))
with make_loader(ds, num_workers=2) as loader:
    batches = iter(loader)
    got = 0
    try:
        for i, batch in enumerate(batches):
            got += 1
            if i == 2:
                os.kill(loader.dataloader._iterator._workers[0].pid, signal.SIGKILL)
                for _ in range(200):  # the loop's own code, until torch's handler interrupts it
                    time.sleep(0.05)
    except (WorkerError, RuntimeError) as e:
        print("recovering from", type(e).__name__)
    loader.load_state_dict(loader.state_dict())
    rest = sum(1 for _ in loader)
    print("batches", got + rest, len(ds))
"""


def _small(root: Path, n: int = 400) -> Path:
    with ShardWriter(root, split="train", samples_per_shard=50) as w:
        for i in range(n):
            w.write({"npy": np.full(4, i % 251, np.uint8), "cls": i % 3})
    return root


def test_no_traceback_at_exit_after_the_documented_recovery(tmp_path):
    root = _small(tmp_path / "ds")
    (tmp_path / "probe.py").write_text(PROBE)
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    done = subprocess.run([sys.executable, str(script), str(root)], capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    assert "recovering from" in done.stdout and "batches 50 50" in done.stdout, done.stdout
    assert "Exception ignored" not in done.stderr, done.stderr


def test_the_loader_closes_a_kept_iteration_when_a_state_is_loaded_or_another_begins(tmp_path):
    ds = ShardedDataset(_small(tmp_path / "ds", n=40), batch_size=4, fields=("cls",))
    loader = make_loader(ds)
    first = iter(loader)
    next(first)
    loader.load_state_dict(loader.state_dict())
    assert inspect.getgeneratorstate(first) == inspect.GEN_CLOSED
    second = iter(loader)
    next(second)
    third = iter(loader)
    assert inspect.getgeneratorstate(second) == inspect.GEN_CLOSED
    next(third)
    loader.close()
    assert inspect.getgeneratorstate(third) == inspect.GEN_CLOSED
