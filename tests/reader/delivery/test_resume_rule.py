"""A loaded resume point is never dropped silently: ``set_epoch`` to an epoch that would drop it raises.

The loop of docs/keys-and-resume.md (start at ``state["epoch"]``) resumes exactly; a loop
restarted from epoch 0 by mistake raises :class:`ResumeError` naming the saved epoch and
batches and the call that resumes there.
"""

from __future__ import annotations

import pytest

from shardify.errors import ResumeError
from shardify.reader import ShardedDataset, make_loader
from shardify.reader.delivery.shared_epoch import SharedEpoch


def dataset(root) -> ShardedDataset:
    return ShardedDataset(root, batch_size=2, shuffle=True, seed=3, fields=("cls",))


def run(loader, ds, start: int, epochs: int) -> list[tuple[int, list[int]]]:
    out = []
    for epoch in range(start, epochs):
        ds.set_epoch(epoch)
        out += [(epoch, batch[0].tolist()) for batch in loader]
    return out


def saved_mid_epoch(root, *, epoch: int = 1, batches: int = 4) -> dict:
    ds = dataset(root)
    loader = make_loader(ds)
    ds.set_epoch(epoch)
    for i, _ in enumerate(loader):
        if i + 1 == batches:
            break
    return loader.state_dict()


def test_a_loop_restarted_from_another_epoch_raises_naming_the_saved_point(counting_dataset):
    root = counting_dataset([7, 6, 5])
    state = saved_mid_epoch(root)
    ds = dataset(root)
    loader = make_loader(ds)
    loader.load_state_dict(state)
    with pytest.raises(ResumeError, match=r"resumes epoch 1 after 4 batches.*set_epoch\(0\).*Call set_epoch\(1\)"):
        ds.set_epoch(0)
    assert isinstance(ResumeError("x"), ValueError)
    ds.set_epoch(1)  # the point is still there: the rest of epoch 1
    assert [b[0].tolist() for b in loader] == [b for _, b in run_uninterrupted(root, 1)][4:]


def run_uninterrupted(root, epoch: int) -> list[tuple[int, list[int]]]:
    ds = dataset(root)
    return run(make_loader(ds), ds, epoch, epoch + 1)


def test_the_documented_loop_resumes_exactly_and_goes_on(counting_dataset):
    """docs/keys-and-resume.md: load the state, then loop from ``state["epoch"]``."""
    root = counting_dataset([7, 6, 5])
    ds = dataset(root)
    full = run(make_loader(ds), ds, 0, 3)
    state = saved_mid_epoch(root)
    ds = dataset(root)
    loader = make_loader(ds)
    loader.load_state_dict(state)
    resumed = run(loader, ds, state["epoch"], 3)
    first = [i for i, (e, _) in enumerate(full) if e == 1][0]
    assert resumed == full[first + 4 :]


def test_a_state_saved_after_an_epochs_last_batch_allows_the_next_epoch_only(counting_dataset):
    root = counting_dataset([7, 6, 5])
    ds = dataset(root)
    loader = make_loader(ds)
    ds.set_epoch(1)
    n = sum(1 for _ in loader)
    ds.set_epoch(1)
    for i, _ in enumerate(loader):
        if i + 1 == n:
            break
    state = loader.state_dict()
    assert state["batches"] == n
    for allowed in (1, 2):
        ds = dataset(root)
        loader = make_loader(ds)
        loader.load_state_dict(state)
        ds.set_epoch(allowed)  # the empty rest of epoch 1, or epoch 2
    ds = dataset(root)
    make_loader(ds).load_state_dict(state)
    with pytest.raises(ResumeError, match=r"end of epoch 1 .*Call set_epoch\(2\)"):
        ds.set_epoch(0)


def test_clear_resume_drops_the_point_on_purpose_and_an_iteration_started_from_it_ends_the_rule(counting_dataset):
    root = counting_dataset([7, 6, 5])
    state = saved_mid_epoch(root)
    ds = dataset(root)
    loader = make_loader(ds)
    loader.load_state_dict(state)
    ds.clear_resume()
    ds.set_epoch(0)
    assert ds.resume_point is None
    ds = dataset(root)
    loader = make_loader(ds)
    loader.load_state_dict(state)
    ds.set_epoch(1)
    next(iter(loader))  # an iteration began from the point: another epoch may follow
    ds.set_epoch(2)


def test_the_cells_refuse_to_drop_a_pending_point_only():
    cells = SharedEpoch()
    cells.resume_at(3, 2)
    with pytest.raises(ResumeError, match="epoch 3 after 2 batches"):
        cells.set_epoch(4)
    assert cells.resume_point == (3, 2) and cells.epoch == 3
    cells.start()
    cells.set_epoch(4)
    assert cells.resume_point is None
