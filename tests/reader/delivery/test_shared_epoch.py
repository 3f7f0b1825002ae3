"""The epoch and resume point cells: what an iteration starts from, and who sees a change."""

from __future__ import annotations

import multiprocessing

import pytest

from shardify.reader import ShardedDataset
from shardify.reader.delivery.shared_epoch import MAX_SEGMENTS, SharedEpoch
from shardify.reader.plan.resume import Segment


def test_an_iteration_starts_from_the_resume_point_of_its_own_epoch_only():
    cells = SharedEpoch()
    assert cells.start() == (0, 0, ()) and cells.resume_point is None
    history = (Segment(2, 1, 3), Segment(4, 2, 1))
    cells.resume_at(2, 5, history=history)
    assert cells.start() == (2, 5, history)
    assert cells.resume_point == (2, 5) and cells.resume_history == history
    cells.set_epoch(2)  # the same epoch keeps it
    assert cells.start() == (2, 5, history)
    cells.set_epoch(3)  # another drops it, for good
    assert cells.start() == (3, 0, ()) and cells.resume_point is None
    cells.set_epoch(2)
    assert cells.start() == (2, 0, ())


def test_stepping_past_a_finished_epoch_keeps_its_resume_point():
    cells = SharedEpoch()
    cells.resume_at(1, 8, history=(Segment(2, 1, 3),))
    cells.step_past(1)
    assert cells.epoch == 2 and cells.start() == (2, 0, ())
    assert cells.resume_point == (1, 8)
    cells.set_epoch(1)  # asks for the rest of epoch 1 again
    assert cells.start() == (1, 8, (Segment(2, 1, 3),))


@pytest.mark.parametrize(
    "call, message",
    [
        pytest.param(lambda c: c.set_epoch(-1), "epoch=-1 should be >= 0", id="epoch"),
        pytest.param(lambda c: c.resume_at(0, -2), "batches=-2 should be >= 0", id="batches"),
        pytest.param(
            lambda c: c.resume_at(0, 1, history=[Segment(1, 1, 1)] * (MAX_SEGMENTS + 1)),
            f"a state holds at most {MAX_SEGMENTS}",
            id="history",
        ),
        pytest.param(lambda c: c.step_past(-1), "epoch=-1 should be >= 0", id="step-past"),
    ],
)
def test_a_bad_value_is_refused_and_changes_nothing(call, message):
    cells = SharedEpoch()
    cells.resume_at(3, 2)
    with pytest.raises(ValueError, match=message):
        call(cells)
    assert cells.start() == (3, 2, ())


def _report_epoch(cells: SharedEpoch, ready, answer) -> None:
    ready.wait(10)
    answer.put(cells.start())


def test_a_process_started_before_a_change_sees_it():
    """The cells are shared memory: a persistent worker, forked before ``set_epoch`` or
    ``resume_at``, reads what the main process wrote since."""
    ctx = multiprocessing.get_context("fork")
    cells = SharedEpoch()
    ready, answer = ctx.Event(), ctx.Queue()
    child = ctx.Process(target=_report_epoch, args=(cells, ready, answer))
    child.start()
    try:
        cells.resume_at(4, 7, history=(Segment(3, 2, 1),))
        ready.set()
        assert answer.get(timeout=20) == (4, 7, (Segment(3, 2, 1),))
    finally:
        child.join(20)


def test_the_dataset_resumes_after_the_end_of_a_finished_epoch(counting_dataset):
    """``resume_after_end``: a state saved after the last batch of epoch 1 makes the next
    iteration epoch 2's, and ``set_epoch(1)`` still finds epoch 1's (empty) rest."""
    root = counting_dataset([7, 2, 13])
    ds = ShardedDataset(root, batch_size=3, fields=("cls",), shuffle=True, seed=2)
    ds.set_epoch(2)
    epoch2 = [b.tolist() for b in ds]
    ds.resume_at(1, len(ds))
    ds.resume_after_end(1)
    assert ds.epoch == 2 and ds.resume_point == (1, len(ds))
    assert [b.tolist() for b in ds] == epoch2
    ds.resume_at(1, len(ds))
    ds.resume_after_end(1)
    ds.set_epoch(1)
    assert list(ds) == []
