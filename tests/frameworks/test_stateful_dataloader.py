"""torchdata's StatefulDataLoader over a ShardedDataset: save mid-epoch, resume in a new process exactly.

StatefulDataLoader asks each worker's copy of the dataset for ``state_dict()`` after every
batch and gives it back to the same worker of the new loader (``load_state_dict`` before
``iter``): the resumed process must yield the same samples, in the same order, with the same
crops, as the uninterrupted run, and the next epoch must be the uninterrupted run's too.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from shardify.reader.delivery.state import seal_state

pytest.importorskip("torchdata.stateful_dataloader")
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("shardify_framework_jobs", HERE / "jobs.py")
jobs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jobs)

TIME_LIMIT_S = 120


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return jobs.write_images(tmp_path_factory.mktemp("sdl") / "ds")


def same(a, b) -> bool:
    return len(a) == len(b) and all(
        ka == kb and torch.equal(xa, xb) and torch.equal(ya, yb) for (ka, xa, ya), (kb, xb, yb) in zip(a, b)
    )


_REFERENCE: dict[tuple[str, int], tuple[list, list]] = {}


def reference(root: Path, workers: int) -> tuple[list, list]:
    """Epochs 1 and 2 of an uninterrupted run (computed once per worker count)."""
    if (str(root), workers) not in _REFERENCE:
        _REFERENCE[str(root), workers] = _uninterrupted(root, workers)
    return _REFERENCE[str(root), workers]


def _uninterrupted(root: Path, workers: int) -> tuple[list, list]:
    ds = jobs.dataset(root)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=workers)
    ds.set_epoch(1)
    one = jobs.take(loader)
    ds.set_epoch(2)
    return one, jobs.take(loader)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop_after", [1, 4, 8])
def test_resume_in_a_new_process_is_the_uninterrupted_run(images, tmp_path, workers, stop_after):
    epoch1, epoch2 = reference(images, workers)
    assert len(epoch1) == len(epoch2) == 8
    assert sorted(k for keys, _, _ in epoch1 for k in keys) == [f"img{i:03d}" for i in range(22)]
    assert not same(epoch1, epoch2)  # another epoch, another order and other crops

    ds = jobs.dataset(images)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=workers)
    ds.set_epoch(1)
    seen = jobs.take(loader, stop_after)
    assert same(seen, epoch1[:stop_after])
    torch.save(loader.state_dict(), tmp_path / "state.pt")
    del loader

    out = tmp_path / "out.pt"
    subprocess.run(
        [sys.executable, str(HERE / "jobs.py"), "sdl", str(images), str(workers), str(tmp_path / "state.pt"), str(out)],
        check=True,
        timeout=100,
    )
    resumed = torch.load(out, weights_only=False)
    if stop_after < len(epoch1):
        assert same(seen + resumed["rest"], epoch1)
    else:  # saved after the epoch's last batch: set_epoch(1) is refused (it cannot mean the next epoch)
        assert "after the last batch of epoch 1" in resumed["rest"] and "set_epoch(2)" in resumed["rest"]
    assert same(resumed["next"], epoch2)


def test_a_second_save_and_resume_in_one_epoch(images, tmp_path):
    """Resumed once, saved again, resumed again: the saved place counts the batches skipped first."""
    epoch1, _ = reference(images, 2)
    ds = jobs.dataset(images)
    first = StatefulDataLoader(ds, batch_size=None, num_workers=2)
    ds.set_epoch(1)
    seen = jobs.take(first, 3)
    state = first.state_dict()
    del first
    ds = jobs.dataset(images)
    second = StatefulDataLoader(ds, batch_size=None, num_workers=2)
    second.load_state_dict(state)
    ds.set_epoch(1)
    seen += jobs.take(second, 2)
    state = second.state_dict()
    del second
    ds = jobs.dataset(images)
    third = StatefulDataLoader(ds, batch_size=None, num_workers=2)
    third.load_state_dict(state)
    ds.set_epoch(1)
    assert same(seen + jobs.take(third), epoch1)


def test_a_mid_epoch_state_under_another_epoch_raises(images):
    ds = jobs.dataset(images)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=0)
    ds.set_epoch(1)
    jobs.take(loader, 2)
    state = loader.state_dict()
    ds = jobs.dataset(images)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=0)
    loader.load_state_dict(state)  # the dataset is left at epoch 0: set_epoch(1) forgotten
    with pytest.raises(ValueError, match=r"2 of 8 batches into epoch 1 .* set_epoch\(1\)"):
        jobs.take(loader)


def test_a_dataset_state_checks_what_it_resumes(images):
    ds = jobs.dataset(images)
    ds.set_epoch(1)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    assert state["kind"] == "shardify.iter" and state["epoch"] == 1 and state["batches"] == 1
    with pytest.raises(ValueError, match="plan.batch_size"):
        jobs.dataset(images, batch_size=4).load_state_dict(state)
    with pytest.raises(ValueError, match="'seed' is 7"):
        jobs.dataset(images, seed=8).load_state_dict(state)
    with pytest.raises(ValueError, match="world=1, workers=2; this one has world=1, workers=1"):
        jobs.dataset(images).load_state_dict(seal_state({**state, "workers": 2}))
    with pytest.raises(ValueError, match="'kind'"):
        jobs.dataset(images).load_state_dict({"epoch": 1})
    beyond = jobs.dataset(images)
    beyond.load_state_dict(seal_state({**state, "batches": 9}))  # a deliberate edit
    beyond.set_epoch(1)
    with pytest.raises(ValueError, match="9 batches of epoch 1 taken by worker 0 of 1, whose share has 8"):
        next(iter(beyond))


def test_a_state_loaded_in_the_main_process_is_refused_by_workers(images):
    ds = jobs.dataset(images)
    ds.set_epoch(1)
    it = iter(ds)
    next(it)
    fresh = jobs.dataset(images)
    fresh.load_state_dict(ds.state_dict())
    fresh.set_epoch(1)
    loader = torch.utils.data.DataLoader(fresh, batch_size=None, num_workers=1)
    with pytest.raises(ValueError, match="resumes the process it is loaded in"):
        next(iter(loader))
