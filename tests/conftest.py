"""Shared test plumbing: a per-test time limit for modules that could hang if a promise broke, and
shardify's deprecated keywords made errors in the Python processes the tests start."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

OLD_KEYWORDS_FAIL = "error:ShardedDataset:DeprecationWarning"
"""pyproject.toml's filter of the old keywords' warning, for ``PYTHONWARNINGS`` (which matches a
literal start of the message, not a pattern)."""


@pytest.fixture(autouse=True, scope="session")
def _old_keywords_fail_in_child_processes() -> Iterator[None]:
    """A script a test runs (``python -c``, torchrun ranks) stops on an old ``ShardedDataset`` keyword
    too, instead of printing the warning to a stderr nobody reads; a test that sets its own
    ``PYTHONWARNINGS`` for a child keeps it."""
    given = os.environ.get("PYTHONWARNINGS")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONWARNINGS", f"{given},{OLD_KEYWORDS_FAIL}" if given else OLD_KEYWORDS_FAIL)
        yield


@pytest.fixture(autouse=True)
def _time_limit(request: pytest.FixtureRequest) -> Iterator[None]:
    """In a module that sets ``TIME_LIMIT_S``, a test past that many seconds fails instead of hanging."""
    seconds = getattr(request.module, "TIME_LIMIT_S", None)
    if seconds is None:
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"test ran past its {seconds} s limit: a hang?")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
