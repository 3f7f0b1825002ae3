"""Every block of docs/tutorials/language-model.md runs as written, in order, and does what the page says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")

PAGE = Path(__file__).parents[2] / "docs" / "tutorials" / "language-model.md"
MARK = re.compile(r"<!-- run by tests/docs/test_docs_language_model\.py -->\n```(python|bash)\n(.*?)```", re.S)


def test_the_tutorial_trains_stops_and_resumes_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    blocks = MARK.findall(PAGE.read_text())
    assert [lang for lang, _ in blocks] == ["python", "bash", *["python"] * 7]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    namespace: dict = {}
    for lang, code in blocks:
        if lang == "bash":
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", code], env=env, capture_output=True, text=True)
            assert done.returncode == 0, done.stdout + done.stderr
            print(done.stdout)
        else:
            exec(compile(code, str(PAGE), "exec"), namespace)  # noqa: S102 - the page's own examples
    out = capsys.readouterr().out
    tokens = namespace["ds"].epoch_sizes()["tokens"]
    assert f"tokens: {tokens:,} in 800 documents" in out  # shardify info counts what the reader reads
    steps = 2 * len(namespace["TokenLoader"](namespace["TokenDataset"]("out/stories", seq_len=64, batch_size=16)))
    done = re.findall(r"^done: (\d+) steps, ([\d,]+) tokens$", out, re.M)
    assert done == [(str(steps), f"{2 * tokens:,}")] * 2  # the resumed run and the uninterrupted one
    resumed = re.search(r"^resumed at step (\d+): epoch (\d) after its batch (\d+)$", out, re.M)
    assert resumed is not None and resumed[1] == "60" and resumed[2] == "1"
    assert int(resumed[3]) == 60 - steps // 2  # the checkpoint fell in epoch 1, its batches counted
    assert "resumed weights equal the uninterrupted run's: True" in out
    # the page shows the output of its own runs
    text = PAGE.read_text()
    for line in re.findall(r"^(done: .*|resumed at .*|\d+ steps and .*)$", out, re.M):
        assert line in text, line
