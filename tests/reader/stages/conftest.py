"""The one save/restore check every reader stage passes: the ``check_midpoints`` fixture; and
``fake_reader``, a tiny in-memory shard reader (item ``(shard, i)`` has ``x = 100 * shard + i``).

``check_midpoints(make)``: ``make()`` builds a fresh stage (with its sources) over the same data.
For each midpoint: take that many items, save the state, then (1) the rest from the same stage,
(2) a fresh stage loaded with a JSON round trip of the state and (3) a fresh stage told to
``skip`` that many items all give exactly the items of an uninterrupted run after that point.
Items are compared with :func:`same` (tensors and arrays by value).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest
import torch

from shardify.reader.stages.base import Stage


def same(a: Any, b: Any) -> bool:
    """Deep equality that compares tensors and arrays by dtype, shape and value."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(torch.equal(a, b))
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def _take(stage: Stage[Any], n: int) -> list[Any]:
    return [next(stage) for _ in range(n)]


def check_midpoints(
    make: Callable[[], Stage[Any]], midpoints: Iterable[int] | None = None, *, skip: bool = True
) -> list[Any]:
    """Check save/restore (and, with ``skip``, :meth:`Stage.skip`) of ``make()``'s stage at each
    midpoint (default: start, 1, middle, last item, end); return the uninterrupted run's items."""
    full = list(make())
    n = len(full)
    default = (0, min(1, n), n // 2, max(n - 1, 0), n)
    points: Sequence[int] = sorted(set(midpoints if midpoints is not None else default))
    for k in points:
        stage = make()
        head = _take(stage, k)
        state = stage.state_dict()
        plain = json.loads(json.dumps(state))  # the state is plain data
        rest_same = list(stage)
        assert same(head + rest_same, full), f"the stage's own run differs after a state_dict() at {k}"
        fresh = make()
        fresh.load_state_dict(plain)
        rest = list(fresh)
        assert same(rest, full[k:]), f"restored at item {k} of {n}: {len(rest)} items, expected {n - k}"
        if skip:
            skipped = make()
            skipped.skip(k)
            rest = list(skipped)
            assert same(rest, full[k:]), f"skipped {k} items of {n}: {len(rest)} items, expected {n - k}"
    return full


@pytest.fixture(name="check_midpoints")
def check_midpoints_fixture() -> Callable[..., list[Any]]:
    """:func:`check_midpoints`, for the tests of every stage."""
    return check_midpoints


class FakeReader:
    """Records what it was asked to announce and read."""

    def __init__(self) -> None:
        self.reads: list[tuple[int, int, int]] = []
        self.announced: list[list[tuple[int, int, int]]] = []

    def announce(self, runs: Iterable[tuple[int, int, int]]) -> None:
        self.announced.append(list(runs))

    def read(self, shard: int, start: int, stop: int) -> Iterator[Any]:
        self.reads.append((shard, start, stop))
        for i in range(start, stop):
            yield {"__key__": f"s{shard}/{i}", "__shard__": f"shard-{shard}", "x": shard * 100 + i}


@pytest.fixture(name="fake_reader")
def fake_reader_fixture() -> type[FakeReader]:
    """:class:`FakeReader`, the class: each test makes as many as its stages need."""
    return FakeReader
