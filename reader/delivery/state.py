"""The loader's state: a small versioned dict saying where an epoch stands, and its loading.

Version 3 (written now): ``epoch``; ``batches`` consumed by each rank in the current part of
the epoch, read under ``world`` ranks x ``workers`` (DataLoader workers, 0 counting as 1);
``history``: the earlier parts of the epoch read on other topologies, ``[world, workers,
batches]`` each (see :mod:`shardify.reader.plan.resume`); ``layout`` of the epoch's sequence;
``seed`` and ``plan``, the options that must match to resume; ``num_batches``, an epoch's
batches per rank; ``data``, one ``{"version", "digest"}`` per stream: the split's version
token and a short digest of what defines the epoch's sequence (each shard's file name,
sample count, and size and SHA-256 from the split index; see :func:`data_identity`); and
``check``, a short checksum of every other field, so that a state edited by hand, cut short
or mixed from two states is refused naming the field. All of it is plain JSON.

Refused, with the field, the value found and what this loader has: another seed or plan
option (batch size, shuffle, block, buffer, ``drop_last``, bucketing, stream sizes and
counts), another dataset or dataset version (``data``), an edited or incomplete state
(``check``). ``fields``, ``transform``, ``map`` and ``on_error`` may differ: they change what
is made of a sample, not which samples an epoch holds.

Version 2 (without ``data`` and ``check``) still loads, except mid-epoch in an epoch that
reads part of a pass of a stream (``samples_per_epoch`` or weights giving a count that is not
a whole multiple of the stream's size): the rule for that part changed after version 2
(:mod:`shardify.reader.plan.mix`), so such a state would resume another sequence. Version 1
(``epoch``, ``batches``, ``seed``, ``world``, ``num_batches``, maybe ``workers``) still loads:
it is finished with the whole-shard layout it was saved under.

Loaded under the same world and workers, the resumed epoch yields exactly the batches the
saved run had left; under others, the part read so far becomes one more history entry and
what is left is planned for the new topology. Every rank saves the same state in a training
loop that steps together, so any rank's state serves all.

The dataset's own state (:func:`make_iter_state`, :func:`load_iter_state`) is one process's
place in its share instead: DataLoader worker ``worker`` of ``workers`` has yielded
``batches`` of its plan role's batches of ``epoch``. torchdata's ``StatefulDataLoader`` (and
Lightning through it) asks each worker for it after every batch it makes, keeps the one that
goes with the last batch the training loop took, and gives it back to the same worker of a
new loader, which then yields exactly the batches after it. It carries ``data`` and ``check``
as the loader's state does, and is refused the same way when edited, cut or from other data.

States are made from and checked against a :class:`ResumeBasis`: a plain frozen value of what
must match to resume (the plan's inputs, bucketing, each stream's data identity and name),
built once by the dataset (``ShardedDataset.resume_basis``); a dataset given instead is read
for its ``resume_basis``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardify.reader.delivery.basis import (
    STATE_VERSION,
    ResumeBasis,
    StateSource,
    basis_of,
    data_identity,
    identities,
    plan_fields,
)
from shardify.reader.delivery.shared_epoch import MAX_SEGMENTS
from shardify.reader.plan.assign import batches_per_rank
from shardify.reader.plan.resume import LAYOUTS, Segment

if TYPE_CHECKING:
    pass

__all__ = [
    "ResumeBasis",
    "StateSource",
    "STATE_VERSION",
    "ITER_STATE_KIND",
    "IterPosition",
    "make_state",
    "load_state",
    "epoch_batches",
    "make_iter_state",
    "load_iter_state",
    "seal_state",
    "data_identity",
]


_CHECKED = (
    "version",
    "epoch",
    "batches",
    "seed",
    "world",
    "workers",
    "num_batches",
    "history",
    "layout",
    "plan",
    "data",
)
"""The fields of a version 3 state that ``check`` covers (all of them but ``check``)."""

_ITER_CHECKED = (
    "kind",
    "version",
    "epoch",
    "worker",
    "workers",
    "world",
    "batches",
    "seed",
    "history",
    "layout",
    "plan",
    "data",
)
"""The fields of a dataset (per-process) state that its ``check`` covers."""


def _field_check(name: str, value: Any) -> str:
    """12 hex digits of SHA-256 over a field's name and its canonical JSON (tuples as lists)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(f"{name}\n{text}".encode()).hexdigest()[:12]


def seal_state(state: dict[str, Any]) -> dict[str, Any]:
    """A copy of a version 3 ``state`` (a loader's or a dataset's) with its ``check`` made anew:
    for a tool or a test that changes a state on purpose (loading refuses a state edited without it)."""
    body = {k: v for k, v in state.items() if k != "check"}
    names = _ITER_CHECKED if body.get("kind") == ITER_STATE_KIND else _CHECKED
    return {**body, "check": {name: _field_check(name, body[name]) for name in names if name in body}}


def make_state(
    ds: StateSource, *, epoch: int, batches: int, history: tuple[Segment, ...], layout: int, world: int, workers: int
) -> dict[str, Any]:
    """The state of ``ds`` after ``batches`` batches of ``epoch`` under ``(world, workers)``."""
    b = basis_of(ds)
    return seal_state(
        {
            "version": STATE_VERSION,
            "epoch": epoch,
            "batches": batches,
            "seed": b.inputs.seed,
            "world": world,
            "workers": workers,
            "num_batches": b.inputs.rank_batches(epoch, world=world),  # a whole epoch's: len(dataset)
            "history": [[s.world, s.workers, s.batches] for s in history],
            "layout": layout,
            "plan": plan_fields(b),
            "data": identities(b),
        }
    )


def _check_integrity(state: dict[str, Any], names: tuple[str, ...] = _CHECKED, what: str = "loader") -> None:
    """Refuse a version 3 state whose fields do not match their checksums, naming the field."""
    lead = f"{what} state was edited or is incomplete:"
    missing = [name for name in names if name not in state]
    if missing:
        raise ValueError(
            f"{lead} field {missing[0]!r} is missing"
            + (f" ({len(missing)} fields are: {', '.join(missing)})" if len(missing) > 1 else "")
        )
    check = state.get("check")
    if not isinstance(check, dict):
        raise ValueError(f"{lead} field 'check' is {check!r}; a version 3 state carries a checksum of each field")
    for name in names:
        if name not in check:
            raise ValueError(f"{lead} field 'check' has no checksum of field {name!r}")
        try:
            found = _field_check(name, state[name])
        except (TypeError, ValueError):
            found = None
        if found != check[name]:
            raise ValueError(
                f"{lead} field {name!r} is {state[name]!r}, which does not match its checksum "
                f"{check[name]!r} (saved with the state)"
            )
    extra = sorted(set(state) - set(names) - {"check"})
    if extra:
        raise ValueError(f"{lead} field {extra[0]!r} is not part of a version 3 state")


def _check_data(ds: ResumeBasis, saved: Any, what: str = "loader") -> None:
    """Refuse a state saved on other data: another dataset, conversion or version."""
    have = identities(ds)
    if not isinstance(saved, list) or len(saved) != len(have):
        raise ValueError(f"{what} state field 'data' is {saved!r}; this loader reads {len(have)} stream(s): {have!r}")
    for i, (found, mine) in enumerate(zip(saved, have)):
        name = ds.names[i]
        if not isinstance(found, dict):
            raise ValueError(f"{what} state field 'data[{i}]' is {found!r}; want {{'version': ..., 'digest': ...}}")
        if found.get("version") != mine["version"]:
            raise ValueError(
                f"{what} state field 'data[{i}].version' is {found.get('version')!r}, this loader reads version "
                f"{mine['version']!r} of {name}: the state was saved on another version of the dataset (converted "
                "again), whose epochs hold other samples; resume with a dataset of the saved version"
            )
        if found.get("digest") != mine["digest"]:
            raise ValueError(
                f"{what} state field 'data[{i}].digest' is {found.get('digest')!r}, this loader has "
                f"{mine['digest']!r} for {name}: the state was saved on other data (other shards, sample counts or "
                "checksums: another dataset or conversion)"
            )


def _check_part_passes(ds: ResumeBasis, epoch: int, batches: int, history: tuple[Segment, ...]) -> None:
    """A version 2 state mid-epoch where a stream reads part of a pass: that part changed since."""
    if not batches and not history:
        return
    sizes = list(ds.stream_samples)
    counts = list(ds.stream_counts)
    part = [i for i, (c, n) in enumerate(zip(counts, sizes)) if n and c % n]
    if part:
        i = part[0]
        raise ValueError(
            f"loader state field 'version' is 2, saved {batches} batches into epoch {epoch}, in which stream {i} "
            f"reads {counts[i]} of its {sizes[i]} samples (plan.stream_counts {counts}, not whole passes); "
            "this loader (state version 3) takes that part of a pass by another rule, so the rest of the saved "
            f"epoch cannot be resumed. Restart epoch {epoch} (set_epoch({epoch}) without loading the state) or go "
            f"on with epoch {epoch + 1}"
        )


def _int(state: dict[str, Any], name: str, low: int, what: str = "loader") -> int:
    value = state.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{what} state field {name!r} is {value!r}; want an int >= {low}")
    return value


def _check_plan(ds: ResumeBasis, state: dict[str, Any], *, what: str, version: int = STATE_VERSION) -> None:
    """Refuse a state whose plan options (those that decide an epoch's batches) are not ``ds``'s."""
    saved = state.get("plan")
    if not isinstance(saved, dict):
        raise ValueError(f"{what} state field 'plan' is {saved!r}; want a dict")
    for name, value in plan_fields(ds, version).items():
        if saved.get(name) != value:
            raise ValueError(f"{what} state field 'plan.{name}' is {saved.get(name)!r}, this {what} has {value!r}")


def _history_and_layout(state: dict[str, Any], *, what: str) -> tuple[tuple[Segment, ...], int]:
    """The ``history`` segments and the ``layout`` a state names, checked."""
    raw = state.get("history")
    try:
        history = tuple(Segment(*(int(x) for x in seg)) for seg in raw)  # type: ignore[union-attr]
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} state field 'history' is {raw!r}; want [[world, workers, batches], ...]") from e
    layout = state.get("layout")
    if layout not in LAYOUTS:
        raise ValueError(f"{what} state field 'layout' is {layout!r}; want one of {LAYOUTS}")
    return history, layout


def epoch_batches(ds: StateSource, epoch: int, *, history: tuple[Segment, ...], layout: int, world: int) -> int:
    """Batches per rank in the part of ``epoch`` read after ``history`` (the whole epoch without one).
    With a history it plans the rest here once, so that a bad state fails now and not in a worker."""
    return basis_of(ds).inputs.rank_batches(epoch, world=world, history=history, layout=layout)


def load_state(
    ds: StateSource, state: dict[str, Any], *, world: int, workers: int
) -> tuple[int, int, tuple[Segment, ...], int]:
    """``(epoch, batches, history, layout)`` to resume ``ds`` at ``state`` under ``(world, workers)``."""
    b = basis_of(ds)
    version = state.get("version")
    if version not in (1, 2, STATE_VERSION) or isinstance(version, bool):
        raise ValueError(f"loader state field 'version' is {version!r}; this loader reads 1, 2 and {STATE_VERSION}")
    if version == STATE_VERSION:
        _check_integrity(state)
        _check_data(b, state.get("data"))
    if state.get("seed") != b.inputs.seed:
        raise ValueError(f"loader state field 'seed' is {state.get('seed')!r}, this loader has {b.inputs.seed!r}")
    epoch, batches = _int(state, "epoch", 0), _int(state, "batches", 0)
    saved_world = _int(state, "world", 1)
    saved_workers = _int(state, "workers", 1) if "workers" in state else workers
    if version == 1:
        if len(b.inputs.stream_sizes) > 1 or b.inputs.samples_per_epoch != b.num_samples:
            raise ValueError(
                "a version 1 loader state was saved from one source read whole each epoch; "
                "this loader mixes streams or sets samples_per_epoch"
            )
        expected = batches_per_rank(
            b.num_samples, world=saved_world, batch_size=b.inputs.batch_size, drop_last=b.inputs.drop_last
        )
        if state.get("num_batches") != expected:
            raise ValueError(
                f"loader state field 'num_batches' is {state.get('num_batches')!r}, this dataset "
                f"has {expected} under world {saved_world}"
            )
        history: tuple[Segment, ...] = ()
        layout = 1
    else:
        _check_plan(b, state, what="loader", version=version)
        history, layout = _history_and_layout(state, what="loader")
        if version == 2:
            _check_part_passes(b, epoch, batches, history)
    segment = Segment(saved_world, saved_workers, batches)
    if (saved_world, saved_workers) != (world, workers):
        if b.bucketed:
            raise ValueError(
                f"this loader state was saved with world={saved_world}, workers={saved_workers}; with "
                f"bucket_length, a resume needs the same world and workers (have {world=}, {workers=})"
            )
        if len(history) >= MAX_SEGMENTS:
            raise ValueError(
                f"epoch {epoch} was resumed on another topology {len(history)} times already; "
                f"a state holds at most {MAX_SEGMENTS}"
            )
        history, batches, saved_world = history + (segment,), 0, world
    have = b.inputs.rank_batches(epoch, world=world, history=history, layout=layout)
    if batches > have:
        raise ValueError(f"loader state has {batches=} but each rank has {have} batches in epoch {epoch}")
    return epoch, batches, history, layout


ITER_STATE_KIND = "shardify.iter"
"""The ``kind`` of a dataset (per-process) state, told apart from a loader's state."""


@dataclass
class IterPosition:
    """Where one process's iteration of an epoch stands: its plan role's batches taken so far."""

    epoch: int
    role: int
    workers: int
    world: int
    batches: int
    layout: int
    history: tuple[Segment, ...] = ()


def make_iter_state(ds: StateSource, pos: IterPosition) -> dict[str, Any]:
    """The dataset state of a process at ``pos``: small, versioned, checked when loaded."""
    b = basis_of(ds)
    return seal_state(
        {
            "kind": ITER_STATE_KIND,
            "version": STATE_VERSION,
            "epoch": pos.epoch,
            "worker": pos.role,
            "workers": pos.workers,
            "world": pos.world,
            "batches": pos.batches,
            "seed": b.inputs.seed,
            "history": [[s.world, s.workers, s.batches] for s in pos.history],
            "layout": pos.layout,
            "plan": plan_fields(b),
            "data": identities(b),
        }
    )


def load_iter_state(ds: StateSource, state: dict[str, Any], *, world: int, workers: int) -> IterPosition:
    """The position ``state`` (from :func:`make_iter_state`) holds, checked against ``ds`` here.

    It resumes only under the same ``world`` and ``workers`` (0 counting as 1): one worker's
    place says nothing about the others', so another topology needs the loader's state.
    """
    b = basis_of(ds)
    if not isinstance(state, dict) or state.get("kind") != ITER_STATE_KIND:
        kind = state.get("kind") if isinstance(state, dict) else type(state).__name__
        raise ValueError(
            f"dataset state field 'kind' is {kind!r}; want {ITER_STATE_KIND!r} (a loader's state "
            "goes to loader.load_state_dict)"
        )
    if state.get("version") != STATE_VERSION:
        raise ValueError(
            f"dataset state field 'version' is {state.get('version')!r}; this reader reads {STATE_VERSION}"
        )
    _check_integrity(state, _ITER_CHECKED, "dataset")
    _check_data(b, state.get("data"), "dataset")
    if state.get("seed") != b.inputs.seed:
        raise ValueError(f"dataset state field 'seed' is {state.get('seed')!r}, this dataset has {b.inputs.seed!r}")
    _check_plan(b, state, what="dataset")
    saved_world, saved_workers = _int(state, "world", 1, "dataset"), _int(state, "workers", 1, "dataset")
    if (saved_world, saved_workers) != (world, workers):
        raise ValueError(
            f"this dataset state was saved by a process of world={saved_world}, workers={saved_workers}; "
            f"this one has {world=}, {workers=}. A dataset state resumes only the same topology: "
            "to change it, save and load the state of make_loader's loader instead"
        )
    role = _int(state, "worker", 0, "dataset")
    if role >= workers:
        raise ValueError(f"dataset state field 'worker' is {role}; want < {workers=}")
    history, layout = _history_and_layout(state, what="dataset")
    return IterPosition(
        epoch=_int(state, "epoch", 0, "dataset"),
        role=role,
        workers=workers,
        world=world,
        batches=_int(state, "batches", 0, "dataset"),
        history=history,
        layout=layout,
    )
