"""The stage protocol and its shared check, on a tiny counting stage."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from shardify.reader.stages.base import Mapped, Stage


class Count(Stage[int]):
    def __init__(self, n: int) -> None:
        self.n, self.i = n, 0

    def __next__(self) -> int:
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return self.i - 1

    def state_dict(self) -> dict[str, Any]:
        return {"i": self.i}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.i = int(state["i"])

    def skip(self, n: int) -> None:
        self.i = min(n, self.n)


class Forgetful(Count):
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass  # a broken stage: restarts from the beginning


@pytest.mark.parametrize("n", [0, 1, 7])
def test_mapped_over_a_stage_restores_at_every_midpoint(n: int, check_midpoints: Any) -> None:
    full = check_midpoints(lambda: Mapped(Count(n), lambda x: x * x), range(n + 1))
    assert full == [x * x for x in range(n)]


def test_the_check_fails_on_a_stage_that_does_not_restore(check_midpoints: Any) -> None:
    with pytest.raises(AssertionError, match="restored at item 2"):
        check_midpoints(lambda: Mapped(Forgetful(5), str), [2])


def test_a_plain_iterable_source_cannot_be_restored() -> None:
    stage = Mapped(iter([1, 2]), str)
    assert stage.state_dict() == {"source": None}
    with pytest.raises(TypeError, match="not a Stage"):
        Mapped(iter([1]), str).load_state_dict({"source": {"i": 1}})
