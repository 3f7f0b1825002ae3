"""A packed-token reader's state: where an epoch stands, in a few integers, plain JSON.

``kind`` and ``version``; ``epoch``; ``history``: the earlier parts of the epoch, ``[world,
batches]`` each (:data:`~shardify.reader.tokens.plan.Segment`); ``world`` and ``batches``: the
current part's ranks and the batches every rank has taken in it; what must match to resume
(``seed``, ``seq_len``, ``batch_size``, ``shuffle``, ``counts``: each stream's tokens an epoch,
``data``: each stream's :func:`~shardify.reader.delivery.basis.data_identity`); and ``check``,
16 hex digits of SHA-256 over the rest, so an edited, cut or mixed state is refused.

Loaded under the same world, the epoch goes on with exactly the batches the saved run had left
(whatever the worker count: workers only deal a rank's batches); under another, the current
part becomes one more history entry and what is left is planned over the new world, every
sequence once (:func:`~shardify.reader.tokens.plan.remaining_runs`). Anything else is refused
with :class:`~shardify.errors.ResumeError` naming the field, the value found and the one expected.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardify.errors import ResumeError
from shardify.reader.delivery.basis import data_identity
from shardify.reader.io.source import Source
from shardify.reader.tokens.plan import Segment

__all__ = ["KIND", "STATE_VERSION", "Resume", "plan_fields", "make_state", "check_state", "stream_identity"]

KIND = "shardify-token-reader"
STATE_VERSION = 1


@dataclass(frozen=True)
class Resume:
    """A loaded state's place: ``epoch``, its earlier parts, the current part's world and batches taken."""

    epoch: int
    history: tuple[Segment, ...]
    world: int
    batches: int


def stream_identity(source: Source, totals: Sequence[int]) -> dict[str, Any]:
    """A stream's data identity (its shards' names, counts, sizes, SHA-256) and its token totals."""
    ident = data_identity(source)
    tokens = hashlib.sha256(json.dumps([int(t) for t in totals]).encode()).hexdigest()[:16]
    return {**ident, "tokens": tokens}


def plan_fields(
    *, seed: int, seq_len: int, batch_size: int, shuffle: bool, counts: Sequence[int], data: list[dict[str, Any]]
) -> dict[str, Any]:
    """What must match to resume, as a state holds it."""
    return {
        "seed": seed,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "shuffle": shuffle,
        "counts": [int(c) for c in counts],
        "data": data,
    }


def _check(fields: dict[str, Any]) -> str:
    text = json.dumps({k: v for k, v in fields.items() if k != "check"}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def make_state(fields: dict[str, Any], at: Resume) -> dict[str, Any]:
    """The state of a reader whose :func:`plan_fields` are ``fields``, at ``at``."""
    state: dict[str, Any] = {
        "kind": KIND,
        "version": STATE_VERSION,
        "epoch": at.epoch,
        "history": [list(s) for s in at.history],
        "world": at.world,
        "batches": at.batches,
        **fields,
    }
    state["check"] = _check(state)
    return state


def check_state(fields: dict[str, Any], state: Any) -> Resume:
    """The :class:`Resume` of ``state`` for a reader of :func:`plan_fields` ``fields``; ResumeError
    naming what does not match."""
    if not isinstance(state, dict) or state.get("kind") != KIND:
        raise ResumeError(
            f"not a token reader's state: found {type(state).__name__} "
            f"{str(state)[:80] if isinstance(state, dict) else ''}; a state is what TokenDataset.state_dict() returns"
        )
    if state.get("version") != STATE_VERSION:
        raise ResumeError(f"state version {state.get('version')!r}, this reader reads {STATE_VERSION}")
    if state.get("check") != _check(state):
        raise ResumeError("state field 'check' does not match its other fields (edited, cut short or mixed)")
    for name, want in fields.items():
        if state.get(name) != want:
            raise ResumeError(f"state field {name!r} is {state.get(name)!r}, this dataset has {want!r}")
    try:
        history = tuple((int(w), int(b)) for w, b in state["history"])
        epoch, world, batches = int(state["epoch"]), int(state["world"]), int(state["batches"])
    except (KeyError, TypeError, ValueError) as e:
        raise ResumeError(f"state fields 'epoch', 'history', 'world', 'batches' cannot be read: {e}") from e
    if epoch < 0 or world < 1 or batches < 0 or any(w < 1 or b < 0 for w, b in history):
        raise ResumeError(f"state holds a negative count or an empty world: {epoch=}, {world=}, {batches=}, {history=}")
    return Resume(epoch, history, world, batches)
