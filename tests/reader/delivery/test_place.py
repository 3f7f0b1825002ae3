"""One process's place (torchdata's StatefulDataLoader protocol): what a state holds, and
which iteration a loaded place resumes."""

from __future__ import annotations

import pickle

import pytest

import shardify.reader.delivery.place as place_module
from shardify.reader.delivery.place import ProcessPlace, loaded_place
from shardify.reader.delivery.state import IterPosition


def at(epoch: int, batches: int) -> IterPosition:
    return IterPosition(epoch=epoch, role=1, workers=2, world=1, batches=batches)


def test_a_state_holds_the_iteration_under_way_else_the_place_loaded():
    place = ProcessPlace()
    assert place.saved() is None
    place.load(at(1, 4))
    assert place.saved() == at(1, 4)
    place.position = at(2, 1)
    assert place.saved() == at(2, 1)


def test_a_loaded_place_is_taken_once():
    place = ProcessPlace()
    assert place.take() is None
    place.load(at(1, 4))
    assert place.take() == at(1, 4)
    assert place.take() is None and place.saved() is None


def test_a_copy_for_a_new_process_has_no_iteration_and_refuses_a_place_loaded_here(monkeypatch):
    """Pickled to a spawned worker: no iteration under way there; a place loaded in the main
    process goes along, and is refused there with what to do instead."""
    place = ProcessPlace()
    place.position = at(2, 1)
    place.load(at(1, 4))
    copy = pickle.loads(pickle.dumps(place))
    assert copy.position is None and copy.saved() == at(1, 4)
    real = place_module.os.getpid()
    monkeypatch.setattr(place_module.os, "getpid", lambda: real + 1)
    with pytest.raises(ValueError, match="load_state_dict was called in the main process"):
        copy.take()


@pytest.mark.parametrize(
    "place, epoch, total, expected",
    [
        pytest.param(at(1, 4), 1, 6, at(1, 4), id="same-epoch"),
        pytest.param(at(1, 6), 1, 6, at(1, 6), id="same-epoch-finished"),
        pytest.param(at(1, 6), 2, 6, None, id="other-epoch-finished"),
        pytest.param(at(1, 4), 2, 6, "call set_epoch\\(1\\) before iterating", id="other-epoch-unfinished"),
        pytest.param(at(1, 7), 1, 6, "7 batches of epoch 1 .* whose share has 6", id="more-than-the-share"),
    ],
)
def test_which_iteration_a_loaded_place_resumes(place, epoch, total, expected):
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=expected):
            loaded_place(place, epoch=epoch, total=total)
    else:
        assert loaded_place(place, epoch=epoch, total=total) == expected


def test_a_pickled_dataset_starts_with_no_place(counting_dataset):
    """What a spawned worker gets: the dataset without the iteration under way here."""
    from shardify.reader import ShardedDataset

    ds = ShardedDataset(counting_dataset([7, 2, 13]), batch_size=3, fields=("cls",))
    it = iter(ds)
    next(it), next(it)
    assert ds.state_dict()["batches"] == 2
    assert pickle.loads(pickle.dumps(ds)).state_dict()["batches"] == 0
