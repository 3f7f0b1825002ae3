"""Loader states (version 4): an edited, cut or foreign state is refused naming the field, never
resumed into a different epoch; states of the unreleased versions 1 to 3 are refused naming the version."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardify.convert import ShardWriter
from shardify.errors import ResumeError
from shardify.reader import BatchOptions, SamplingOptions, ShardedDataset, make_loader
from shardify.reader.delivery.state import STATE_VERSION, load_state, make_state, seal_state

SIZES = [7, 2, 13, 30, 1]  # 53 samples
OPTIONS: dict[str, Any] = dict(
    batch_size=2, fields=("cls",), shuffle=True, seed=3, sampling=SamplingOptions(shuffle_buffer=4, shuffle_block=3)
)


def values(batches: list[Any]) -> list[list[int]]:
    return [[int(x) for x in (b[0] if isinstance(b, (list, tuple)) else b)] for b in batches]


def saved(root: Path, *, stop: int = 4, epoch: int = 2, **kw: Any) -> tuple[dict[str, Any], list[list[int]]]:
    """The state after ``stop`` batches of ``epoch``, and the uninterrupted epoch's batches."""
    options = {**OPTIONS, **kw}
    ds = ShardedDataset(root, **options)
    ds.set_epoch(epoch)
    full = values(list(make_loader(ds)))
    loader = make_loader(ShardedDataset(root, **options))
    loader.dataset.set_epoch(epoch)
    it = iter(loader)
    for _ in range(stop):
        next(it)
    return loader.state_dict(), full


def resumed(root: Path, state: dict[str, Any], **kw: Any) -> list[list[int]]:
    loader = make_loader(ShardedDataset(root, **{**OPTIONS, **kw}))
    loader.load_state_dict(state)
    return values(list(loader))


def _truncated_json(state: dict[str, Any]) -> dict[str, Any]:
    """A state file cut after its first lines, then closed so that it still parses."""
    lines = json.dumps(state, indent=1).splitlines()
    keep = [ln for ln in lines[:8] if ln.startswith(' "') and not ln.rstrip().endswith(("[", "{"))]
    return json.loads("{" + ",".join(ln.rstrip().rstrip(",") for ln in keep) + "}")


def _drop(name: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda s: {k: v for k, v in s.items() if k != name}


EDITS = [
    pytest.param(
        lambda s: {**s, "epoch": s["epoch"] + 1},
        "field 'epoch' is 3, which does not match its checksum",
        id="edited-epoch",
    ),
    pytest.param(lambda s: {**s, "batches": 2}, "field 'batches' is 2, which does not match", id="edited-batches"),
    pytest.param(
        lambda s: {**s, "history": [[2, 1, 3]]},
        r"field 'history' is \[\[2, 1, 3\]\], which does not",
        id="edited-history",
    ),
    pytest.param(lambda s: {**s, "seed": 4}, "field 'seed' is 4, which does not match", id="edited-seed"),
    pytest.param(
        lambda s: {**s, "plan": {**s["plan"], "batch_size": 3}}, "field 'plan' is .*, which does not", id="edited-plan"
    ),
    pytest.param(
        lambda s: {**s, "data": [{**s["data"][0], "version": "x"}]},
        "field 'data' is .*, which does not",
        id="edited-data",
    ),
    pytest.param(
        lambda s: {**s, "check": {**s["check"], "epoch": "0" * 12}},
        "field 'epoch' is 2, which does not",
        id="edited-check",
    ),
    pytest.param(_drop("history"), "field 'history' is missing", id="dropped-history"),
    pytest.param(_drop("batches"), "field 'batches' is missing", id="dropped-batches"),
    pytest.param(_drop("check"), "field 'check' is None", id="dropped-check"),
    pytest.param(
        lambda s: {**s, "check": {k: v for k, v in s["check"].items() if k != "plan_version"}},
        "field 'check' has no checksum of field 'plan_version'",
        id="dropped-checksum",
    ),
    pytest.param(_truncated_json, "field '[a-z_]+' is missing", id="truncated-json"),
    pytest.param(lambda s: {**s, "note": 1}, "field 'note' is not part of a version 4 state", id="added-field"),
]


@pytest.mark.parametrize("edit, message", EDITS)
def test_an_edited_or_incomplete_state_is_refused_naming_the_field(counting_dataset, edit, message):
    root = counting_dataset(SIZES)
    state, _ = saved(root)
    loader = make_loader(ShardedDataset(root, **OPTIONS))
    with pytest.raises(ValueError, match="loader state was edited or is incomplete: " + message):
        loader.load_state_dict(edit(json.loads(json.dumps(state))))
    assert loader.dataset.resume_point is None  # nothing of the refused state was taken


OTHER_OPTIONS = [
    pytest.param({"batch_size": 3}, "field 'plan.batch_size' is 2, this loader has 3", id="batch-size"),
    pytest.param({"shuffle": False}, "field 'plan.shuffle' is True, this loader has False", id="shuffle"),
    pytest.param(
        {"sampling": SamplingOptions(shuffle_buffer=4, shuffle_block=4)},
        "field 'plan.shuffle_block' is 3, this loader has 4",
        id="shuffle-block",
    ),
    pytest.param(
        {"sampling": SamplingOptions(shuffle_buffer=8, shuffle_block=3)},
        "field 'plan.shuffle_buffer' is 4, this loader has 8",
        id="shuffle-buffer",
    ),
    pytest.param(
        {"batching": BatchOptions(drop_last=True)},
        "field 'plan.drop_last' is False, this loader has True",
        id="drop-last",
    ),
    pytest.param({"seed": 4}, "field 'seed' is 3, this loader has 4", id="seed"),
    pytest.param(
        {"sampling": SamplingOptions(samples_per_epoch=40, shuffle_buffer=4, shuffle_block=3)},
        r"field 'plan.stream_counts' is \[53\], this loader has \[40\]",
        id="samples-per-epoch",
    ),
    pytest.param(
        {"batching": BatchOptions(bucket_length=int)},
        "field 'plan.bucketed' is False, this loader has True",
        id="bucketing",
    ),
]


@pytest.mark.parametrize("other, message", OTHER_OPTIONS)
def test_a_state_of_other_options_is_refused_naming_the_option(counting_dataset, other, message):
    root = counting_dataset(SIZES)
    state, _ = saved(root)
    loader = make_loader(ShardedDataset(root, **{**OPTIONS, **other}))
    with pytest.raises(ValueError, match=message):
        loader.load_state_dict(state)


def test_a_state_of_another_conversion_with_the_same_sizes_is_refused(counting_dataset, shards):
    root = counting_dataset(SIZES)
    other = counting_dataset(SIZES, name="other")
    state, full = saved(root)
    assert resumed(other, state) == full[4:]  # the same data in another folder resumes
    changed = counting_dataset(SIZES, name="changed")
    shards.write_dataset(changed, [[(k + "x", f) for k, f in s] for s in shards.counting(SIZES)])
    with pytest.raises(
        ValueError,
        match=r"field 'data\[0\].digest' is '[0-9a-f]{16}', this loader has "
        r"'[0-9a-f]{16}' for .*changed: the state was saved on other data",
    ):
        make_loader(ShardedDataset(changed, **OPTIONS)).load_state_dict(state)


def _write(out: Path, offset: int, *, overwrite: bool) -> None:
    with ShardWriter(out, split="train", samples_per_shard=6, overwrite=overwrite) as w:
        for i in range(30):
            w.write({"cls": i + offset})


def test_a_state_of_another_dataset_version_is_refused_naming_both(tmp_path):
    out = tmp_path / "ds"
    _write(out, 0, overwrite=False)
    state, full = saved(out)
    old = state["data"][0]["version"]
    assert old and state["version"] == STATE_VERSION
    assert resumed(out, json.loads(json.dumps(state))) == full[4:]  # a JSON round trip resumes exactly
    _write(out, 100, overwrite=True)  # converted again: same sizes, another version
    new = json.loads((out / "train.json").read_text())["shardify"]["version"]
    assert new != old
    with pytest.raises(
        ValueError,
        match=f"field 'data\\[0\\].version' is '{old}', this loader reads version "
        f"'{new}' of .*: the state was saved on another version",
    ):
        make_loader(ShardedDataset(out, **OPTIONS)).load_state_dict(state)


def test_other_fields_resume_the_same_samples(counting_dataset):
    """``fields`` changes what is made of a sample, not which samples: allowed."""
    root = counting_dataset(SIZES)
    state, full = saved(root)
    loader = make_loader(ShardedDataset(root, **{**OPTIONS, "fields": ("cls", "__key__")}))
    loader.load_state_dict(state)
    assert [[int(x) for x in cls] for cls, _ in loader] == full[4:]


def as_version_2(state: dict[str, Any]) -> dict[str, Any]:
    """A state as the unreleased version 2 wrote it (no ``data`` nor ``check``)."""
    plan = {k: v for k, v in state["plan"].items() if k not in ("bucketed", "bucket_buffer")}
    return {**{k: v for k, v in state.items() if k not in ("check", "data")}, "version": 2, "plan": plan}


def as_version_1(state: dict[str, Any]) -> dict[str, Any]:
    """A state as the unreleased version 1 wrote it."""
    return {k: state[k] for k in ("epoch", "batches", "seed", "world", "num_batches")} | {"version": 1}


@pytest.mark.parametrize("old", [as_version_1, as_version_2], ids=["version-1", "version-2"])
def test_a_state_of_an_earlier_version_is_refused_naming_both_versions(counting_dataset, old):
    root = counting_dataset(SIZES)
    state, _ = saved(root)
    found = old(state)["version"]
    loader = make_loader(ShardedDataset(root, **OPTIONS))
    with pytest.raises(ResumeError, match=f"field 'version' is {found}; this reader reads state version 4 only"):
        loader.load_state_dict(old(state))


@pytest.mark.parametrize("version", [1, 2, 3, 5])
def test_a_state_of_another_plan_version_is_refused_naming_both_versions(counting_dataset, version):
    root = counting_dataset(SIZES)
    state, _ = saved(root)
    with pytest.raises(ResumeError, match=rf"field 'plan_version' is {version}; .* plan version 4 only"):
        make_loader(ShardedDataset(root, **OPTIONS)).load_state_dict(seal_state({**state, "plan_version": version}))
    with pytest.raises(ResumeError, match=rf"field 'plan_version' is {version}; .* plan version 4 only"):
        ShardedDataset(root, **OPTIONS).load_state_dict(seal_state({**_iter_state(root), "plan_version": version}))


def test_a_state_naming_its_plan_version_layout_is_refused(counting_dataset):
    """The plan version's field was named ``layout`` in state version 3, before the first release:
    such a state is refused naming its version (or, relabelled, the field this reader wants)."""
    root = counting_dataset(SIZES)
    state, _ = saved(root)
    old = {("layout" if k == "plan_version" else k): v for k, v in state.items() if k != "check"}
    with pytest.raises(ValueError, match="field 'plan_version' is missing"):  # the field's name is checked
        make_loader(ShardedDataset(root, **OPTIONS)).load_state_dict(seal_state(old))
    with pytest.raises(ResumeError, match="field 'version' is 3; this reader reads state version 4 only"):
        make_loader(ShardedDataset(root, **OPTIONS)).load_state_dict(seal_state({**old, "version": 3}))


def test_a_dataset_state_of_an_earlier_version_is_refused_naming_both_versions(counting_dataset):
    root = counting_dataset(SIZES)
    with pytest.raises(ResumeError, match="dataset state field 'version' is 2; this reader reads state version 4 only"):
        ShardedDataset(root, **OPTIONS).load_state_dict(seal_state({**_iter_state(root), "version": 2}))


def test_seal_state_is_what_a_deliberate_edit_needs(counting_dataset):
    root = counting_dataset(SIZES)
    state, full = saved(root)
    assert resumed(root, seal_state({**state, "batches": 6})) == full[6:]
    with pytest.raises(ResumeError, match="field 'version' is 5; this reader reads state version 4 only"):
        make_loader(ShardedDataset(root, **OPTIONS)).load_state_dict(seal_state({**state, "version": 5}))


def _iter_state(root: Path, stop: int = 3) -> dict[str, Any]:
    """The dataset's own (per-process, StatefulDataLoader's) state after ``stop`` batches in this process."""
    ds = ShardedDataset(root, **OPTIONS)
    ds.set_epoch(2)
    it = iter(ds)
    for _ in range(stop):
        next(it)
    return json.loads(json.dumps(ds.state_dict()))


@pytest.mark.parametrize(
    "edit, message",
    [
        pytest.param(
            lambda s: {**s, "batches": s["batches"] + 1},
            "field 'batches' is 4, which does not match",
            id="edited-batches",
        ),
        pytest.param(lambda s: {**s, "worker": 1}, "field 'worker' is 1, which does not match", id="edited-worker"),
        pytest.param(_drop("data"), "field 'data' is missing", id="dropped-data"),
        pytest.param(_drop("check"), "field 'check' is None", id="dropped-check"),
    ],
)
def test_an_edited_dataset_state_is_refused_naming_the_field(counting_dataset, edit, message):
    root = counting_dataset(SIZES)
    state = _iter_state(root)
    ds = ShardedDataset(root, **OPTIONS)
    ds.load_state_dict(state)  # the state as saved loads
    with pytest.raises(ValueError, match="dataset state was edited or is incomplete: " + message):
        ShardedDataset(root, **OPTIONS).load_state_dict(edit(state))


def test_a_dataset_state_of_other_data_is_refused(counting_dataset, shards):
    root = counting_dataset(SIZES)
    state = _iter_state(root)
    changed = counting_dataset(SIZES, name="changed")
    shards.write_dataset(changed, [[(k + "x", f) for k, f in s] for s in shards.counting(SIZES)])
    with pytest.raises(ValueError, match=r"dataset state field 'data\[0\].digest' is '[0-9a-f]{16}'.*other data"):
        ShardedDataset(changed, **OPTIONS).load_state_dict(state)
    ShardedDataset(counting_dataset(SIZES, name="copy"), **OPTIONS).load_state_dict(state)  # a copy elsewhere loads


def test_a_state_is_made_from_the_datasets_plain_resume_basis(counting_dataset):
    """The state functions take a plain frozen value (what must match to resume), not the dataset."""
    root = counting_dataset([5, 7, 3])
    ds = ShardedDataset(root, batch_size=4, shuffle=True, seed=3)
    basis = ds.resume_basis
    assert pickle.loads(pickle.dumps(basis)) == basis and hash(basis) == hash(
        ShardedDataset(root, batch_size=4, shuffle=True, seed=3).resume_basis
    )
    kw = dict(epoch=1, batches=2, history=(), world=1, workers=1)
    state = make_state(basis, **kw)
    assert state == make_state(ds, **kw)
    assert load_state(basis, state, world=1, workers=1) == (1, 2, ())
    other = ShardedDataset(root, batch_size=4, shuffle=True, seed=4).resume_basis
    with pytest.raises(ValueError, match="field 'seed' is 3, this loader has 4"):
        load_state(other, state, world=1, workers=1)


@pytest.mark.parametrize("given", [None, [1, 2], "loader.pt", 3], ids=["None", "list", "str", "int"])
def test_anything_but_a_state_is_refused_saying_what_it_got_and_what_a_state_is(counting_dataset, given):
    """``ckpt.get("loader")`` of a checkpoint saved without the loader's state is None: refused
    with ResumeError (not an AttributeError), and the loader goes on as it was."""
    root = counting_dataset(SIZES)
    loader = make_loader(ShardedDataset(root, **OPTIONS))
    with pytest.raises(
        ResumeError, match=rf"loader.load_state_dict: got {type(given).__name__} .*loader.state_dict\(\)"
    ):
        loader.load_state_dict(given)
    with pytest.raises(ResumeError, match=rf"dataset.load_state_dict: got {type(given).__name__} .*'epoch'"):
        ShardedDataset(root, **OPTIONS).load_state_dict(given)
    assert sorted(v for b in values(list(loader)) for v in b) == list(range(sum(SIZES)))
