"""``ReadOptions``: every option of a ``ShardedDataset`` in one frozen, picklable dataclass."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from shardify.tario import DEFAULT_MAX_MEMBER

__all__ = ["ReadOptions"]


@dataclass(frozen=True)
class ReadOptions:
    """Every option of a :class:`ShardedDataset` (see its docstring); picklable to workers."""

    batch_size: int
    shuffle: bool = False
    seed: int = 0
    drop_last: bool = False
    transform: Callable[..., Any] | None = None
    fields: tuple[str, ...] | None = None
    map: Callable[[dict[str, Any]], Any] | None = None
    collate_fn: Callable[[list[Any]], Any] | None = None
    shuffle_buffer: int = 1024
    shuffle_block: int = 4
    bucket_length: Callable[[Any], int] | None = None
    bucket_buffer: int | None = None
    on_error: Literal["raise", "skip"] = "raise"
    allow_pickle: bool = False
    verify: bool = False
    samples_per_epoch: int | None = None
    mark_repeats: bool = False
    max_member_bytes: int = DEFAULT_MAX_MEMBER

    def __post_init__(self) -> None:
        if self.samples_per_epoch is not None and self.samples_per_epoch < 0:
            raise ValueError(f"{self.samples_per_epoch=} should be >= 0")
        if self.batch_size < 1:
            raise ValueError(f"{self.batch_size=} should be >= 1")
        if self.shuffle_buffer < 1 or self.shuffle_block < 1:
            raise ValueError(f"{self.shuffle_buffer=} and {self.shuffle_block=} should be >= 1")
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"{self.on_error=} should be 'raise' or 'skip'")
        if self.fields is not None and self.map is not None:
            raise ValueError("pass fields=... or map=..., not both")
        if self.max_member_bytes < 0:
            raise ValueError(f"{self.max_member_bytes=} should be >= 0")
