"""Which byte ranges and requests read a batch of samples: pure functions, no I/O.

:func:`sample_runs` joins the wanted samples of each shard into runs (neighbours within a gap,
up to a size), each read as one range; :func:`request_groups` puts the runs of each shard into
requests: all of them in multi-range requests (as many as one ``Range`` header holds,
:func:`~shardify.remote.split_spans`) where the shard's host serves those, else one request a
run. A shard's sample ``i`` spans bytes ``ends[i]..ends[i + 1]`` of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from shardify.remote import split_spans

__all__ = ["Run", "request_groups", "sample_runs"]

Run = tuple[int, list[int]]
"""``(shard, sorted positions)``: samples read as one range, from the first's start to the last's end."""


def sample_runs(
    wanted: Iterable[tuple[int, int]],
    ends_of: Callable[[int], Sequence[int]],
    gap_of: Callable[[int], int],
    max_bytes: int,
) -> list[Run]:
    """``wanted`` ``(shard, position)`` pairs (repeats read once) as runs, in shard then
    position order: a sample joins the run before it when the bytes between them are at most
    ``gap_of(shard)`` and the run stays within ``max_bytes`` (a sample larger than that is a
    run alone)."""
    runs: list[Run] = []
    shard, gap = -1, 0
    ends: Sequence[int] = ()
    for s, pos in sorted(set(wanted)):
        if s != shard:
            shard, ends, gap = s, ends_of(s), gap_of(s)
            runs.append((s, [pos]))
            continue
        mine = runs[-1][1]
        if ends[pos] - ends[mine[-1] + 1] <= gap and ends[pos + 1] - ends[mine[0]] <= max_bytes:
            mine.append(pos)
        else:
            runs.append((s, [pos]))
    return runs


def request_groups(
    runs: Sequence[Run], ends_of: Callable[[int], Sequence[int]], multi_range: Callable[[int], bool]
) -> list[list[Run]]:
    """The requests that read ``runs``, each a list of runs of one shard, in their order: the
    runs of a shard for which ``multi_range(shard)`` in as few multi-range requests as the
    ``Range`` header allows; every other run a request of its own."""
    by_shard: dict[int, list[Run]] = {}
    for run in runs:
        by_shard.setdefault(run[0], []).append(run)
    groups: list[list[Run]] = []
    for shard, mine in by_shard.items():
        if len(mine) == 1 or not multi_range(shard):
            groups += [[run] for run in mine]
            continue
        ends = ends_of(shard)
        at = 0
        for spans in split_spans([(ends[r[1][0]], ends[r[1][-1] + 1]) for r in mine]):
            groups.append(mine[at : at + len(spans)])
            at += len(spans)
    return groups
