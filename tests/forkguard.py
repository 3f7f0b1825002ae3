"""A pytest plugin: a copy of the test session made by ``fork`` ends at once, silently.

A process forked inside a test is a copy of pytest. If something makes the child return into
pytest's code instead of ending (a SIGTERM handler that raises SystemExit, run between the fork
and the child's first step), the child would go on through the rest of the suite beside the
parent, share its temporary folders, and print a second report. Every test's start and report
check the process: a child exits at once, the parent's run is untouched.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

_getpid = os.getpid  # bound now: a test may patch os.getpid to play a new process
_SESSION_PID = _getpid()
_CHILD_EXIT = 70


def _end_if_forked() -> None:
    if _getpid() != _SESSION_PID:
        os.write(2, f"forkguard: process {_getpid()}, a fork of the test session {_SESSION_PID}, ends\n".encode())
        os._exit(_CHILD_EXIT)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    _end_if_forked()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _end_if_forked()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: Any) -> None:
    _end_if_forked()
