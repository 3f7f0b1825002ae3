"""The loader's state: a small versioned dict saying where an epoch stands, and its loading.

Version 4: ``epoch``; ``batches`` consumed by each rank in the current part of
the epoch, read under ``world`` ranks x ``workers`` (DataLoader workers, 0 counting as 1);
``history``: the earlier parts of the epoch read on other topologies, ``[world, workers,
batches]`` each (see :mod:`shardify.reader.plan.resume`); ``plan_version``: the plan's version
(:data:`~shardify.reader.plan.resume.PLAN_VERSION`);
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

A state of another version, or of another plan version, is refused with
:class:`~shardify.errors.ResumeError` naming the version found and the one this reader reads.

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
from typing import Any

from shardify.errors import ResumeError
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
from shardify.reader.plan.resume import PLAN_VERSION, Segment

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
    "plan_version",
    "plan",
    "data",
)
"""The fields of a version 4 state that ``check`` covers (all of them but ``check``)."""

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
    "plan_version",
    "plan",
    "data",
)
"""The fields of a dataset (per-process) state that its ``check`` covers."""


def _field_check(name: str, value: Any) -> str:
    """12 hex digits of SHA-256 over a field's name and its canonical JSON (tuples as lists)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(f"{name}\n{text}".encode()).hexdigest()[:12]


def seal_state(state: dict[str, Any]) -> dict[str, Any]:
    """A copy of a version 4 ``state`` (a loader's or a dataset's) with its ``check`` made anew:
    for a tool or a test that changes a state on purpose (loading refuses a state edited without it)."""
    body = {k: v for k, v in state.items() if k != "check"}
    names = _ITER_CHECKED if body.get("kind") == ITER_STATE_KIND else _CHECKED
    return {**body, "check": {name: _field_check(name, body[name]) for name in names if name in body}}


def make_state(
    ds: StateSource, *, epoch: int, batches: int, history: tuple[Segment, ...], world: int, workers: int
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
            "plan_version": PLAN_VERSION,
            "plan": plan_fields(b),
            "data": identities(b),
        }
    )


def _check_integrity(state: dict[str, Any], names: tuple[str, ...] = _CHECKED, what: str = "loader") -> None:
    """Refuse a version 4 state whose fields do not match their checksums, naming the field."""
    lead = f"{what} state was edited or is incomplete:"
    missing = [name for name in names if name not in state]
    if missing:
        raise ValueError(
            f"{lead} field {missing[0]!r} is missing"
            + (f" ({len(missing)} fields are: {', '.join(missing)})" if len(missing) > 1 else "")
        )
    check = state.get("check")
    if not isinstance(check, dict):
        raise ValueError(f"{lead} field 'check' is {check!r}; a version 4 state carries a checksum of each field")
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
        raise ValueError(f"{lead} field {extra[0]!r} is not part of a version 4 state")


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


def _int(state: dict[str, Any], name: str, low: int, what: str = "loader") -> int:
    value = state.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{what} state field {name!r} is {value!r}; want an int >= {low}")
    return value


def _check_plan(ds: ResumeBasis, state: dict[str, Any], *, what: str) -> None:
    """Refuse a state whose plan options (those that decide an epoch's batches) are not ``ds``'s."""
    saved = state.get("plan")
    if not isinstance(saved, dict):
        raise ValueError(f"{what} state field 'plan' is {saved!r}; want a dict")
    for name, value in plan_fields(ds).items():
        if saved.get(name) != value:
            raise ValueError(f"{what} state field 'plan.{name}' is {saved.get(name)!r}, this {what} has {value!r}")


def _check_version(state: dict[str, Any], *, what: str) -> None:
    """Refuse a state of another state version, naming the one found and the one wanted."""
    version = state.get("version")
    if version != STATE_VERSION or isinstance(version, bool):
        raise ResumeError(
            f"{what} state field 'version' is {version!r}; this reader reads state version {STATE_VERSION} only "
            "(states of earlier versions were never released)"
        )


def _check_plan_version(state: dict[str, Any], *, what: str) -> None:
    """Refuse a state of another plan version, naming the one found and the one wanted."""
    found = state.get("plan_version")
    if found != PLAN_VERSION or isinstance(found, bool):
        raise ResumeError(
            f"{what} state field 'plan_version' is {found!r}; this reader plans epochs with "
            f"plan version {PLAN_VERSION} only"
        )


def _history(state: dict[str, Any], *, what: str) -> tuple[Segment, ...]:
    """The ``history`` segments a state names, checked."""
    raw = state.get("history")
    try:
        return tuple(Segment(*(int(x) for x in seg)) for seg in raw)  # type: ignore[union-attr]
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} state field 'history' is {raw!r}; want [[world, workers, batches], ...]") from e


def epoch_batches(ds: StateSource, epoch: int, *, history: tuple[Segment, ...], world: int) -> int:
    """Batches per rank in the part of ``epoch`` read after ``history`` (the whole epoch without one).
    With a history it plans the rest here once, so that a bad state fails now and not in a worker."""
    return basis_of(ds).inputs.rank_batches(epoch, world=world, history=history)


def load_state(
    ds: StateSource, state: dict[str, Any], *, world: int, workers: int
) -> tuple[int, int, tuple[Segment, ...]]:
    """``(epoch, batches, history)`` to resume ``ds`` at ``state`` under ``(world, workers)``."""
    b = basis_of(ds)
    _check_version(state, what="loader")
    _check_integrity(state)
    _check_plan_version(state, what="loader")
    _check_data(b, state.get("data"))
    if state.get("seed") != b.inputs.seed:
        raise ValueError(f"loader state field 'seed' is {state.get('seed')!r}, this loader has {b.inputs.seed!r}")
    epoch, batches = _int(state, "epoch", 0), _int(state, "batches", 0)
    saved_world, saved_workers = _int(state, "world", 1), _int(state, "workers", 1)
    _check_plan(b, state, what="loader")
    history = _history(state, what="loader")
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
    have = b.inputs.rank_batches(epoch, world=world, history=history)
    if batches > have:
        raise ValueError(f"loader state has {batches=} but each rank has {have} batches in epoch {epoch}")
    return epoch, batches, history


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
            "plan_version": PLAN_VERSION,
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
    _check_version(state, what="dataset")
    _check_integrity(state, _ITER_CHECKED, "dataset")
    _check_plan_version(state, what="dataset")
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
    history = _history(state, what="dataset")
    return IterPosition(
        epoch=_int(state, "epoch", 0, "dataset"),
        role=role,
        workers=workers,
        world=world,
        batches=_int(state, "batches", 0, "dataset"),
        history=history,
    )
