"""Persistent workers make the next epoch's first batch before it is asked for (delivery/ahead.py).

The map= below logs every sample it makes to a file and, while a gate file exists, makes none:
a batch that arrives while the gate stands was made before. Nothing is timed: the test waits
(with a generous bound) for the log to show the work made ahead, then closes the gate.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from shardify.reader import ShardedDataset, make_loader
from shardify.reader.delivery.batchpool import BatchChannel, SlotPool, unsend

BOUND_S = 60  # for work that takes milliseconds: "does not hang", never a timing


@dataclass(frozen=True)
class Logged:
    """A map= that logs each sample and waits while ``gate`` exists; a tensor large enough for a slot."""

    log: str
    gate: str

    def __call__(self, sample: dict) -> torch.Tensor:
        while os.path.exists(self.gate):
            time.sleep(0.005)
        with open(self.log, "a") as f:
            f.write(f"{int(sample['cls'])}\n")
        return torch.full((20_000,), int(sample["cls"]), dtype=torch.int64)


def _made(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def _wait_made(log: Path, n: int) -> None:
    deadline = time.monotonic() + BOUND_S
    while _made(log) < n:
        assert time.monotonic() < deadline, f"{_made(log)} samples made, expected {n}"
        time.sleep(0.01)


def _ids(batches: list) -> list[list[int]]:
    return [b[:, 0].tolist() for b in batches]


def _next_epoch_made_ahead(loader, gate: Path) -> list[list[int]]:
    """The next iteration's batches, its first two taken while ``gate`` stands (so that they were
    made before it closed: one from each worker), the rest after."""
    gate.touch()  # from now on the workers can make no sample
    it = iter(loader)
    first = [next(it), next(it)]
    gate.unlink()
    return _ids(first + list(it))


@pytest.fixture
def setup(counting_dataset, tmp_path):
    root = counting_dataset([12, 12])
    log, gate = tmp_path / "log", tmp_path / "gate"

    def make() -> ShardedDataset:
        return ShardedDataset(root, batch_size=3, shuffle=True, seed=1, map=Logged(str(log), str(gate)))

    ref = make()
    expected = {}
    with make_loader(ref, num_workers=2, epoch_ahead=False) as loader:  # (the batches depend on the workers)
        for epoch in (0, 1, 3):
            ref.set_epoch(epoch)
            expected[epoch] = _ids(list(loader))
        ref.set_epoch(1)
        it = iter(loader)
        for _ in range(3):
            next(it)
        expected["state"] = loader.state_dict()  # 3 batches into epoch 1
        it.close()
    log.unlink()
    return make(), log, gate, expected


def test_the_first_batches_of_the_next_epoch_are_made_before_it_starts(setup):
    ds, log, gate, expected = setup
    with make_loader(ds, num_workers=2, timeout=BOUND_S) as loader:
        assert _ids(list(loader)) == expected[0]
        _wait_made(log, 24 + 2 * 3)  # the epoch, then one batch per worker made ahead
        ds.set_epoch(1)
        assert _next_epoch_made_ahead(loader, gate) == expected[1]


def test_a_loop_that_never_sets_the_epoch_gets_the_same_epoch_made_ahead(setup):
    ds, log, gate, expected = setup
    with make_loader(ds, num_workers=2, timeout=BOUND_S) as loader:
        assert _ids(list(loader)) == expected[0]
        assert _ids(list(loader)) == expected[0]  # epoch 0 again: epoch 1's batches made ahead are dropped
        _wait_made(log, 2 * (24 + 2 * 3))  # then epoch 0's first batches, as the loop does
        assert _next_epoch_made_ahead(loader, gate) == expected[0]


def test_another_epoch_drops_the_work_made_ahead(setup):
    ds, log, gate, expected = setup
    with make_loader(ds, num_workers=2) as loader:
        assert _ids(list(loader)) == expected[0]
        _wait_made(log, 24 + 2 * 3)
        ds.set_epoch(3)
        assert _ids(list(loader)) == expected[3]
        assert _made(log) >= 24 + 6 + 24  # epoch 3 made from its start


def test_a_state_saved_at_the_end_of_an_epoch_goes_on_with_the_batches_made_ahead(setup):
    ds, log, gate, expected = setup
    with make_loader(ds, num_workers=2, timeout=BOUND_S) as loader:
        assert _ids(list(loader)) == expected[0]
        state = loader.state_dict()
        _wait_made(log, 24 + 2 * 3)
        loader.load_state_dict(state)  # the next iteration is epoch 1's
        assert _next_epoch_made_ahead(loader, gate) == expected[1]


def test_a_state_in_the_middle_of_the_next_epoch_drops_the_work_made_ahead(setup):
    ds, log, gate, expected = setup
    with make_loader(ds, num_workers=2) as loader:
        assert _ids(list(loader)) == expected[0]
        _wait_made(log, 24 + 2 * 3)
        loader.load_state_dict(expected["state"])
        assert _ids(list(loader)) == expected[1][3:]


def test_without_persistent_workers_or_with_it_off_nothing_is_made_ahead(setup):
    ds, log, gate, expected = setup
    for options in ({"persistent_workers": False}, {"epoch_ahead": False}):
        with make_loader(ds, num_workers=2, **options) as loader:
            assert _ids(list(loader)) == expected[0]
            made = _made(log)
            time.sleep(0.3)  # (no timing asserted: a made-ahead batch would only add lines)
            assert _made(log) == made == 24
        log.unlink()


def test_a_batch_made_ahead_and_dropped_gives_its_slot_back():
    channel = BatchChannel(1, max_slots=2)
    pool = SlotPool(channel, 0)
    packed = pool.send([pool.empty((100_000,), torch.uint8)])
    assert channel.tokens[0, 0] != 0 and packed.refs[0][3] is not None
    unsend(pool, packed)
    assert int(channel.tokens[0].count_nonzero()) == 0
    again = pool.send([pool.empty((100_000,), torch.uint8)])
    assert again.refs[0][0] == 0 and again.refs[0][3] is not None  # the main process never mapped it
