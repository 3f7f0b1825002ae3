"""The one progress bar: rate and ETA on a terminal's stderr, nothing when stderr is a file or a pipe."""

from __future__ import annotations

import io
import sys

import pytest

from shardify.progress import progress_bar, wants_bar


class Terminal(io.StringIO):
    """A stream that says it is a terminal, and keeps what was written."""

    def isatty(self) -> bool:
        return True


def test_a_bar_on_a_terminal_shows_its_rate_and_eta():
    out = Terminal()
    bar = progress_bar(total=1000, desc="verify", unit="B", stream=out)
    assert bar is not None
    bar.update(500)
    bar.close()
    text = out.getvalue()
    assert "verify" in text and "500/1.00k" in text and "B/s" in text and "<" in text  # elapsed<remaining


@pytest.mark.parametrize("stream", [pytest.param(io.StringIO(), id="file-or-pipe"), pytest.param(None, id="stderr")])
def test_no_bar_when_the_stream_is_not_a_terminal(stream, monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # what a log file or pipe gives
    assert not wants_bar(True, stream)
    assert progress_bar(total=10, desc="x", unit="B", stream=stream) is None


def test_no_bar_when_not_asked_for():
    assert not wants_bar(False, Terminal())
    assert progress_bar(total=10, desc="x", unit="B", enabled=False, stream=Terminal()) is None


def test_the_conversion_bar_follows_the_same_rule(monkeypatch):
    from shardify.convert.write.progressbar import ProgressBar

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert ProgressBar(total=10, desc="train", enabled=True).bar is None
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    bar = ProgressBar(total=10, desc="train", enabled=True)
    bar.set(4, 4000)
    bar.close()
    assert "train" in term.getvalue() and "40%" in term.getvalue() and "MB/s" in term.getvalue()


def test_verify_shows_a_bar_of_bytes_on_a_terminal_only(tmp_path, monkeypatch):
    from shardify.convert import ShardWriter
    from shardify.convert.verify import verify_dataset

    root = tmp_path / "ds"
    with ShardWriter(root, split="train", samples_per_shard=5) as w:
        for i in range(10):
            w.write({"cls": i, "txt": f"sample {i}"})
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert verify_dataset(root, progress=True).ok
    assert "verify" in term.getvalue() and "B/s" in term.getvalue() and "100%" in term.getvalue()
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", piped)
    assert verify_dataset(root, progress=True).ok
    assert piped.getvalue() == ""
