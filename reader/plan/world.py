"""Where this process stands: (rank, world) of the job and (worker, workers) of its DataLoader.

This is the only place that asks torch or the environment; everything after it (shard order,
assignment, shuffle) is a pure function of these numbers plus ``seed`` and ``epoch``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["World", "detect_world", "detect_rank_world"]


@dataclass(frozen=True, slots=True)
class World:
    """The job's ``rank``/``world`` and the DataLoader's ``worker``/``workers`` (0/1 in-process)."""

    rank: int = 0
    world: int = 1
    worker: int = 0
    workers: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise ValueError(f"{self.rank=} should be in [0, {self.world=})")
        if not 0 <= self.worker < self.workers:
            raise ValueError(f"{self.worker=} should be in [0, {self.workers=})")


def _env_int(name: str) -> int | None:
    text = os.environ.get(name)
    if text is None or text.strip() == "":
        return None
    try:
        return int(text)
    except ValueError as e:
        raise ValueError(f"environment variable {name}={text!r} should be an integer") from e


def detect_rank_world() -> tuple[int, int]:
    """``(rank, world)`` from torch.distributed when initialized, else RANK/WORLD_SIZE, else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    if world is None:
        return 0, 1
    return (rank or 0), world


def detect_world(rank_world: tuple[int, int] | None = None) -> World:
    """The full :class:`World` of the calling process; ``rank_world`` overrides the job part."""
    from torch.utils.data import get_worker_info

    rank, world = rank_world if rank_world is not None else detect_rank_world()
    info = get_worker_info()
    if info is None:
        return World(rank=rank, world=world)
    return World(rank=rank, world=world, worker=info.id, workers=info.num_workers)
