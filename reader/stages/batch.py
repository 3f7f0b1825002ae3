"""Batching stages: ``Cut`` and ``Bucketed`` group items into batches, ``Fill`` replaces skipped samples.

- :class:`Cut`: groups of the plan's ``sizes``, in order. State ``{"batches": k, "source": ...}``:
  the groups yielded and the source's state; restored, it goes on with ``sizes[k:]``. Skipping
  ``k`` groups skips the source's first ``sum(sizes[:k])`` items.
- :class:`Bucketed`: groups of samples of similar length (``bucket_length``), drawn by a seeded
  RNG from a buffer. The groups depend on everything before them, so its state is
  ``{"batches": k}`` only: a restored one replays its source from the start and drops its
  first ``k`` groups (a resume with bucketing decodes the share again up to there).
- :class:`Fill`: replaces each skipped sample (:class:`~shardify.reader.sample.bad.Bad`) by
  a repeat of a good sample of the same batch, so that every rank still yields the same
  number of batches. A batch with no good sample waits for the next good one. State
  ``{"source": ..., "yielded": n}``: the source's state before the first batch it held, and
  how many batches it yielded since (a restore pulls those again and drops them); the last
  good sample, which pads batches at the very end, is not kept (a restored stage with no good
  sample left raises, as a fresh one would).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from shardify.errors import SampleError
from shardify.reader.sample.bad import Bad
from shardify.reader.sample.collate import bucket_batches
from shardify.reader.stages.base import Stage, load_source_state, skip_source, source_state

__all__ = ["Cut", "Bucketed", "Fill", "fill", "is_bad"]


def is_bad(x: object) -> bool:
    """Whether ``x`` is a skipped sample (a :class:`Bad` marker)."""
    return isinstance(x, Bad)


class Cut(Stage[list[Any]]):
    """Lists of ``sizes[i]`` items of ``source``, one per size."""

    def __init__(self, source: Iterator[Any], sizes: Sequence[int]) -> None:
        self.source, self.sizes = source, sizes
        self.batches = 0

    def __next__(self) -> list[Any]:
        if self.batches >= len(self.sizes):
            raise StopIteration
        source = self.source
        try:
            group = [next(source) for _ in range(self.sizes[self.batches])]
        except StopIteration:
            raise RuntimeError(f"the source ended within batch {self.batches} of {len(self.sizes)}") from None
        self.batches += 1
        return group

    def state_dict(self) -> dict[str, Any]:
        return {"batches": self.batches, "source": source_state(self.source)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        load_source_state(self.source, state["source"])
        self.batches = int(state["batches"])

    def skip(self, n: int) -> None:
        """The first ``n`` groups are the source's first ``sum(sizes[:n])`` items."""
        n = min(n, len(self.sizes))
        skip_source(self.source, sum(self.sizes[:n]))
        self.batches = n


class Bucketed(Stage[list[Any]]):
    """``ceil(n / batch_size)`` lists of the ``n`` items of ``make_source()``, grouped by ``length``
    (a skipped sample counts as 0) within ``buffer_size`` items, in an order drawn from ``make_rng()``."""

    def __init__(
        self,
        make_source: Callable[[], Iterator[Any]],
        *,
        batch_size: int,
        length: Callable[[Any], int],
        buffer_size: int,
        make_rng: Callable[[], Any],
    ) -> None:
        self.make_source, self.make_rng = make_source, make_rng
        self.batch_size, self.length, self.buffer_size = batch_size, length, buffer_size
        self.batches, self._skip = 0, 0
        self._groups: Iterator[list[Any]] | None = None

    def _key(self, x: Any) -> int:
        return 0 if is_bad(x) else self.length(x)

    def __next__(self) -> list[Any]:
        if self._groups is None:
            groups = bucket_batches(
                self.make_source(),
                batch_size=self.batch_size,
                length=self._key,
                buffer_size=self.buffer_size,
                rng=self.make_rng(),
                drop_last=False,
            )
            self._groups = itertools.islice(groups, self._skip, None)
        group = next(self._groups)
        self.batches += 1
        return group

    def state_dict(self) -> dict[str, Any]:
        return {"batches": self.batches}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.batches = self._skip = int(state["batches"])

    def skip(self, n: int) -> None:
        """The groups depend on everything before them: replay the source and drop ``n`` groups."""
        self.batches = self._skip = n


def fill(items: list[Any], donor: Any) -> list[Any]:
    """Replace each Bad by the nearest earlier good item of the batch, else the next, else ``donor``."""
    out = list(items)
    good = [i for i, x in enumerate(out) if not is_bad(x)]
    for i, x in enumerate(out):
        if is_bad(x):
            j = bisect.bisect_left(good, i)
            out[i] = out[good[j - 1]] if j > 0 else (out[good[j]] if j < len(good) else donor)
    return out


class Fill(Stage[list[Any]]):
    """Each group of ``source`` with its skipped samples replaced (see :func:`fill`); ``on_bad``
    is told of each skipped sample. A group with no good sample takes the first good sample of
    the next group (it is held until one arrives), or at the very end the last good sample
    seen; so the batch count never changes. Only when no good sample was met does it raise."""

    def __init__(self, source: Iterator[list[Any]], *, on_bad: Callable[[Bad], None]) -> None:
        self.source, self.on_bad = source, on_bad
        self._held: list[list[Any]] = []
        self._ready: list[list[Any]] = []
        self._mark: dict[str, Any] | None = None  # the source's state before the first held group
        self._since_mark = 0  # groups yielded since the mark
        self._drop = 0  # restored: groups to pull again and drop
        self._last_good: Any = None
        self._seen_good = False
        self._first_bad: Bad | None = None
        self._done = False

    def __next__(self) -> list[Any]:
        while True:
            while not self._ready:
                if self._done:
                    raise StopIteration
                self._pull()
            group = self._ready.pop(0)
            self._since_mark += 1
            if self._drop:
                self._drop -= 1
                continue
            return group

    def _pull(self) -> None:
        if not self._held:
            self._mark, self._since_mark = source_state(self.source), 0
        try:
            items = next(self.source)
        except StopIteration:
            self._done = True
            self._end()
            return
        good = None
        for x in items:
            if isinstance(x, Bad):
                self.on_bad(x)
                self._first_bad = self._first_bad or x
            elif good is None:
                good = x
        if good is None:
            self._held.append(items)
            return
        self._ready = [fill(h, good) for h in self._held]
        self._held = []
        filled = fill(items, good)
        self._last_good, self._seen_good = filled[-1], True
        self._ready.append(filled)

    def _end(self) -> None:
        held, self._held = self._held, []
        if not held:
            return
        if not self._seen_good:
            first = self._first_bad or Bad("?", None, "?", lost=False)
            raise SampleError(
                f"every sample of this worker's {len(held)} remaining batches was skipped; "
                f"nothing to pad them with (first: {first.reason})",
                shard=first.shard,
                key=first.key,
            )
        self._ready = [fill(h, self._last_good) for h in held]

    def state_dict(self) -> dict[str, Any]:
        if self._held or self._ready:
            return {"source": self._mark, "yielded": self._since_mark}
        return {"source": source_state(self.source), "yielded": 0}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        load_source_state(self.source, state["source"])
        self._drop = int(state["yielded"])

    def skip(self, n: int) -> None:
        """One group out per group in: skip the source's first ``n`` (as a restored state, the
        last good sample before them is not kept)."""
        skip_source(self.source, n)
