"""Shared test plumbing: a per-test time limit for modules that could hang if a promise broke."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest


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
