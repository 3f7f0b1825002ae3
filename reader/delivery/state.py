"""The loader's state: a small versioned dict saying where an epoch stands, and its loading.

Version 2: ``epoch``; ``batches`` consumed by each rank in the current part of the epoch,
read under ``world`` ranks x ``workers`` (DataLoader workers, 0 counting as 1); ``history``:
the earlier parts of the epoch read on other topologies, ``[world, workers, batches]`` each
(see :mod:`shardify.reader.plan.resume`); ``layout`` of the epoch's sequence; ``seed`` and
``plan``, the options that must match to resume; ``num_batches``, an epoch's batches per rank.
Version 1 (``epoch``, ``batches``, ``seed``, ``world``, ``num_batches``, maybe ``workers``)
still loads: it is finished with the whole-shard layout it was saved under.

Loaded under the same world and workers, the resumed epoch yields exactly the batches the
saved run had left; under others, the part read so far becomes one more history entry and
what is left is planned for the new topology. Every rank saves the same state in a training
loop that steps together, so any rank's state serves all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardify.reader.plan.assign import batches_per_rank, sequence_length
from shardify.reader.plan.resume import Segment

if TYPE_CHECKING:
    from shardify.reader.dataset import ShardedDataset

__all__ = ["STATE_VERSION", "make_state", "load_state"]

STATE_VERSION = 2


def _plan_fields(ds: ShardedDataset) -> dict[str, Any]:
    o = ds.options
    return {"batch_size": o.batch_size, "drop_last": o.drop_last, "shuffle": o.shuffle,
            "shuffle_block": o.shuffle_block, "shuffle_buffer": o.shuffle_buffer,
            "streams": [sum(s) for s in ds._stream_sizes], "stream_counts": list(ds.stream_counts)}


def make_state(ds: ShardedDataset, *, epoch: int, batches: int, history: tuple[Segment, ...], layout: int,
               world: int, workers: int) -> dict[str, Any]:
    """The state of ``ds`` after ``batches`` batches of ``epoch`` under ``(world, workers)``."""
    return {
        "version": STATE_VERSION,
        "epoch": epoch,
        "batches": batches,
        "seed": ds.options.seed,
        "world": world,
        "workers": workers,
        "num_batches": len(ds),
        "history": [[s.world, s.workers, s.batches] for s in history],
        "layout": layout,
        "plan": _plan_fields(ds),
    }


def _int(state: dict[str, Any], name: str, low: int) -> int:
    value = state.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"loader state field {name!r} is {value!r}; want an int >= {low}")
    return value


def load_state(ds: ShardedDataset, state: dict[str, Any], *, world: int,
               workers: int) -> tuple[int, int, tuple[Segment, ...], int]:
    """``(epoch, batches, history, layout)`` to resume ``ds`` at ``state`` under ``(world, workers)``."""
    from shardify.reader.dataset import LAYOUTS, MAX_SEGMENTS

    version = state.get("version")
    if version not in (1, STATE_VERSION):
        raise ValueError(f"loader state field 'version' is {version!r}; this loader reads 1 and {STATE_VERSION}")
    if state.get("seed") != ds.options.seed:
        raise ValueError(f"loader state field 'seed' is {state.get('seed')!r}, this loader has {ds.options.seed!r}")
    epoch, batches = _int(state, "epoch", 0), _int(state, "batches", 0)
    saved_world = _int(state, "world", 1)
    saved_workers = _int(state, "workers", 1) if "workers" in state else workers
    if version == 1:
        if len(ds.streams) > 1 or ds.samples_per_epoch != ds.num_samples:
            raise ValueError("a version 1 loader state was saved from one source read whole each epoch; "
                             "this loader mixes streams or sets samples_per_epoch")
        expected = batches_per_rank(ds.num_samples, world=saved_world, batch_size=ds.options.batch_size,
                                    drop_last=ds.options.drop_last)
        if state.get("num_batches") != expected:
            raise ValueError(f"loader state field 'num_batches' is {state.get('num_batches')!r}, this dataset "
                             f"has {expected} under world {saved_world}")
        history: tuple[Segment, ...] = ()
        layout = 1
    else:
        plan = _plan_fields(ds)
        saved = state.get("plan")
        if not isinstance(saved, dict):
            raise ValueError(f"loader state field 'plan' is {saved!r}; want a dict")
        for name, value in plan.items():
            if saved.get(name) != value:
                raise ValueError(f"loader state field 'plan.{name}' is {saved.get(name)!r}, this loader has {value!r}")
        raw = state.get("history")
        try:
            history = tuple(Segment(*(int(x) for x in seg)) for seg in raw)  # type: ignore[union-attr]
        except (TypeError, ValueError) as e:
            raise ValueError(f"loader state field 'history' is {raw!r}; want [[world, workers, batches], ...]") from e
        layout = state.get("layout")
        if layout not in LAYOUTS:
            raise ValueError(f"loader state field 'layout' is {layout!r}; want one of {LAYOUTS}")
    segment = Segment(saved_world, saved_workers, batches)
    if (saved_world, saved_workers) != (world, workers):
        if ds.options.bucket_length is not None:
            raise ValueError(f"this loader state was saved with world={saved_world}, workers={saved_workers}; with "
                             f"bucket_length, a resume needs the same world and workers (have {world=}, {workers=})")
        if len(history) >= MAX_SEGMENTS:
            raise ValueError(f"epoch {epoch} was resumed on another topology {len(history)} times already; "
                             f"a state holds at most {MAX_SEGMENTS}")
        history, batches, saved_world = history + (segment,), 0, world
    if history:  # plans the rest once here, so that a bad state fails now and not in a worker
        left = sequence_length(ds.epoch_sequence(epoch, history=history, layout=layout))
    else:
        left = ds.samples_per_epoch
    have = batches_per_rank(left, world=world, batch_size=ds.options.batch_size, drop_last=ds.options.drop_last)
    if batches > have:
        raise ValueError(f"loader state has {batches=} but each rank has {have} batches in epoch {epoch}")
    return epoch, batches, history, layout
