"""The protocol every reader stage follows, and the one generic stage: a map over a source.

A stage is an iterator holding its ``source`` (another stage, or a plain iterable at the chain's
start). ``state_dict()`` says where it stands as plain data (ints, strings, lists, dicts: what
JSON holds), and ``load_state_dict(state)``, called on a fresh stage before its first item, makes
it yield exactly the items that followed that state. A stage whose own place is its source's (a
map) saves its source's state under ``"source"``; a stage that holds items (a shuffle buffer, a
batch being cut) saves what it needs to skip or rebuild them, never the items themselves.
``skip(n)``, called on a fresh stage, makes it yield the items after its first ``n``: each stage
says what that means for its source (a map passes it down; ``Cut`` turns batches into samples),
so a chain resumes at a batch with ``chain.skip(k)`` and no code outside a stage knows its
state. ``check_midpoints`` (tests/reader/stages/conftest.py) checks both at midpoints for every stage.
"""

from __future__ import annotations

import collections
import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar, cast

__all__ = ["Stage", "Mapped", "source_state", "load_source_state", "skip_source"]

T = TypeVar("T")
U = TypeVar("U")


class Stage(ABC, Generic[T]):
    """An iterator over its source that can save and restore its place."""

    def __iter__(self) -> Iterator[T]:
        return self

    @abstractmethod
    def __next__(self) -> T: ...

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Where this stage stands, as plain data."""

    @abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Go on from ``state`` (from :meth:`state_dict`); called before the first item."""

    @abstractmethod
    def skip(self, n: int) -> None:
        """Yield the items after the first ``n`` this stage would yield; called before the first item."""


def source_state(source: object) -> dict[str, Any] | None:
    """The state of ``source`` if it is a stage; None for a plain iterable (it cannot resume)."""
    return source.state_dict() if isinstance(source, Stage) else None


def load_source_state(source: object, state: Mapping[str, Any] | None) -> None:
    """Restore ``source`` from ``state``; a plain iterable has no state to restore into."""
    if state is None:
        return
    if not isinstance(source, Stage):
        raise TypeError(f"cannot restore a state into {type(source).__name__}: it is not a Stage")
    source.load_state_dict(state)


def skip_source(source: object, n: int) -> None:
    """Make ``source`` yield its items after its first ``n``: a stage skips them itself (without
    reading them where it can); a plain iterator is advanced past them."""
    if isinstance(source, Stage):
        source.skip(n)
    else:
        collections.deque(itertools.islice(cast(Iterator[Any], source), n), maxlen=0)


class Mapped(Stage[U]):
    """``fn`` applied to each item of ``source``: its place is its source's."""

    def __init__(self, source: Iterator[T] | Stage[T], fn: Callable[[T], U]) -> None:
        self.source, self.fn = source, fn

    def __next__(self) -> U:
        return self.fn(next(self.source))

    def state_dict(self) -> dict[str, Any]:
        return {"source": source_state(self.source)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        load_source_state(self.source, state["source"])

    def skip(self, n: int) -> None:
        skip_source(self.source, n)
