"""The suite's guard against a forked copy of itself (tests/forkguard.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_FORKING_TESTS = """
import os

def test_forks_and_the_child_returns_into_pytest():
    pid = os.fork()
    if pid == 0:
        return  # what a SystemExit raised in the child between fork and its first step does
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 70

def test_after():
    pass
"""


def test_a_forked_copy_of_the_session_ends_before_it_reports_or_runs_another_test(tmp_path: Path) -> None:
    (tmp_path / "test_fork.py").write_text(_FORKING_TESTS)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "forkguard", "-p", "no:cacheprovider", "-q", "test_fork.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("passed") == 1 and "2 passed" in out.stdout, out.stdout
