"""An OSError while the output is written: one error naming the output, the lock released, nothing finished.

The same rule holds where a conversion opens its output and where a ShardWriter finishes
its split (:func:`shardify.convert.write.outfs.undone_on_failure`).
"""

from __future__ import annotations

import errno

import pytest

from shardify.convert import ShardWriter
from shardify.convert.write import session as session_mod
from shardify.convert.write.outfs import WORK_DIR, is_locked
from shardify.convert.write.session import ConversionSession
from shardify.errors import OutputError


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_failing_finish_of_a_shard_writer_names_the_output_and_releases_it(tmp_path, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setattr("shardify.convert.write.session.publish_splits", _disk_full)
    w = ShardWriter(out, split="train")
    w.open()
    w.write({"cls": 1, "txt": "a"})
    with pytest.raises(
        OutputError,
        match=rf"{out}: writing the output failed: .*No space left on device.*"
        "nothing was marked finished",
    ) as e:
        w.close()
    assert isinstance(e.value.__cause__, OSError)
    assert not is_locked(out)
    assert not (out / "manifest.json").exists()  # nothing finished; a rerun starts over


def test_a_failing_open_of_the_output_names_it_and_releases_the_lock(tmp_path, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setattr(session_mod, "_remove_temp_files", _disk_full)
    with pytest.raises(OutputError, match=rf"{out}: writing the output failed: .*nothing was marked finished"):
        ConversionSession.open(out, {"train": "f"}, overwrite=False)
    assert not is_locked(out)
    assert not (out / WORK_DIR).exists()  # released: the lock's folder went with it
    monkeypatch.undo()
    ConversionSession.open(out, {"train": "f"}, overwrite=False).release()  # the folder is free again
