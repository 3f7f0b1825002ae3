"""Every code block of docs/keys-and-resume.md runs as written, in order, on a small dataset."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from shardify.convert import ShardWriter

PAGE = Path(__file__).parents[2] / "docs" / "keys-and-resume.md"


def blocks() -> list[tuple[str, str]]:
    return re.findall(r"```(python|bash)\n(.*?)```", PAGE.read_text(), flags=re.S)


def test_every_block_of_the_page_runs(tmp_path, monkeypatch, capsys):
    with ShardWriter(tmp_path / "out" / "mydata", split="train", samples_per_shard=10) as w:
        for i in range(30):
            w.write({"npy": np.full(2, i, np.uint8), "cls": i % 3})
    monkeypatch.chdir(tmp_path)
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    found = blocks()
    assert [kind for kind, _ in found].count("python") >= 4 and ("bash", found[0][1]) == found[0]
    namespace: dict = {}
    for kind, code in found:
        if kind == "bash":
            subprocess.run(code, shell=True, check=True, env=env, timeout=60)
        else:
            exec(compile(code, str(PAGE), "exec"), namespace)  # noqa: S102 - the page's own examples
    keys = (tmp_path / "train-keys.txt").read_text().splitlines()
    assert len(keys) == 30 and keys == namespace["keys"]
    out = capsys.readouterr().out
    assert "resumes epoch 1 after 3 batches" in out and "Call set_epoch(1)" in out
    assert namespace["state"]["epoch"] == 1 and namespace["state"]["batches"] == 3
