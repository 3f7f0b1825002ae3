"""kill -9 in the middle of ``ShardWriter`` and ``convert_items``: the output is complete or
refused by the reader as unfinished, and the same script run again ends byte-identical to an
uninterrupted run in another folder.

A real subprocess runs the user's script; it kills its own process group (itself and any
workers) with SIGKILL at a point the test picks: after ``k`` samples reached the shard
stream, or inside the finish (before or after the manifest is written).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shardify.errors import ManifestError
from shardify.reader import ShardedDataset

TIME_LIMIT_S = 120

SCRIPT = r"""
import os, signal, sys
import numpy as np
from shardify.convert import ShardWriter, convert_items
from shardify.convert.write import shardstream as stream_mod
from shardify.convert.pyapi import pywriter, fromitems as items_mod

kind, out, kill = sys.argv[1], sys.argv[2], sys.argv[3]

def die():
    os.killpg(0, signal.SIGKILL)  # this process and its workers, at once

if kill.isdigit():  # after that many samples reached the shard stream
    done = [0]
    for name in ("add", "add_encoded"):
        real = getattr(stream_mod.ShardStream, name)
        def patched(self, *a, _real=real, **k):
            if done[0] == int(kill):
                die()
            done[0] += 1
            return _real(self, *a, **k)
        setattr(stream_mod.ShardStream, name, patched)
elif kill == "manifest":  # right after the manifest is written, before the wids copy and the cleanup
    from shardify.convert.write import finish as finish_mod
    real_name = finish_mod.index_name
    finish_mod.index_name = lambda split, version=None: die() if version is None else real_name(split, version)
elif kill in ("finish", "done"):  # in the finish: before the manifest, or when all is written
    from shardify.convert.write import session as session_mod
    real_publish = session_mod.publish_splits
    def publish(*a, _real=real_publish, **k):
        if kill == "finish":
            die()
        _real(*a, **k)
        die()
    session_mod.publish_splits = publish

CHANGED = len(sys.argv) > 4  # the user's script changed: one sample differs

def sample(i):
    if CHANGED and i == 30:
        return {"npy": np.zeros((1, 2), dtype=np.int16), "cls": 0, "txt": "changed"}
    if i % 9 == 4:
        return None
    return {"npy": np.full((i % 3 + 1, 2), i, dtype=np.int16), "cls": i % 3, "txt": "t" * (i % 5)}

N = 40
if kind == "writer":
    with ShardWriter(out, split="train", samples_per_shard=4, classes=("a", "b", "c")) as w:
        for i in range(N):
            s = sample(i)
            if s is not None:
                w.write(s)
else:
    convert_items(range(N), sample, out, split="train", samples_per_shard=4, classes=("a", "b", "c"),
                  workers=2, chunk_size=3, progress=False)
"""

KEPT = 40 - 4  # items 4, 13, 22, 31 are filtered


def run(tmp_path: Path, kind: str, out: Path, kill: str = "-", *extra: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    return subprocess.run(
        [sys.executable, str(script), kind, str(out), kill, *extra],
        capture_output=True,
        text=True,
        start_new_session=True,
        timeout=90,
    )


def samples(out: Path) -> list[int]:
    ds = ShardedDataset(out, batch_size=1, fields=("npy",))
    return sorted(int(x.reshape(-1)[0]) for x in ds)


@pytest.mark.parametrize("kind", ["writer", "items"])
@pytest.mark.parametrize("kill", ["0", "6", "8", "35", "finish", "manifest", "done"])
def test_kill_9_then_the_same_script_ends_byte_identical(tmp_path: Path, tree_bytes, kind: str, kill: str) -> None:
    ref = tmp_path / "ref"
    clean = run(tmp_path, kind, ref)
    assert clean.returncode == 0, clean.stderr

    out = tmp_path / "out"
    killed = run(tmp_path, kind, out, kill)
    assert killed.returncode == -9, killed.stderr
    if kill in ("manifest", "done"):  # the manifest was written: complete and readable, right away
        assert samples(out) == samples(ref) and len(samples(out)) == KEPT
    else:
        assert not (out / "manifest.json").exists()
        with pytest.raises(
            ManifestError,
            match=r"unfinished: a conversion into this folder was interrupted .*"
            r"\.shardify-work.*run it again to finish",
        ):
            ShardedDataset(out, batch_size=1, fields=("npy",))

    again = run(tmp_path, kind, out)
    if kill == "done":  # nothing was left to do: a finished split is not written again without overwrite
        assert again.returncode == 1 and "already finished there; pass --overwrite" in again.stderr
    else:
        assert again.returncode == 0, again.stderr
    assert tree_bytes(out) == tree_bytes(ref)
    assert not (out / ".shardify-work").exists()


@pytest.mark.parametrize("kind", ["writer", "items"])
def test_a_rerun_with_changed_samples_never_changes_a_listed_version(tmp_path: Path, tree_bytes, kind: str) -> None:
    """Killed after the manifest listed the split, then run again with one sample changed: the
    shards a reader may be reading are not replaced; the error says to pass overwrite."""
    out = tmp_path / "out"
    assert run(tmp_path, kind, out, "manifest").returncode == -9
    shards = {name: data for name, data in tree_bytes(out).items() if name.endswith(".tar")}
    if kind == "items":  # its records would reuse the shards without running fn: lose them, as a crash may
        for record in (out / ".shardify-work" / "train").glob("0*.json"):
            record.unlink()
    again = run(tmp_path, kind, out, "-", "changed")
    assert again.returncode == 1
    assert "written again differs from the one the manifest already lists" in again.stderr, again.stderr
    assert "pass overwrite=True" in again.stderr
    assert {name: data for name, data in tree_bytes(out).items() if name.endswith(".tar")} == shards
    assert samples(out) == sorted(i for i in range(40) if i % 9 != 4)
