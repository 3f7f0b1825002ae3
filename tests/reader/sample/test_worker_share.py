"""The hybrid split's rule, its shared value and its controller, as pure values (no loader)."""

from __future__ import annotations

import itertools
import multiprocessing as mp
import pickle

import numpy as np
import pytest

from shardify.reader.sample.worker_share import FLUSH, ShareController, SharedSplit, worker_share


def _rate(f: float, *, workers: int, device_s: float, decode_s: float, prep_s: float, other_s: float) -> float:
    """Images per second of the pipeline with share ``f``: the slower of the two sides."""
    cost = other_s + prep_s + f * (decode_s - prep_s)
    worker = float("inf") if cost == 0 else workers / cost
    device = float("inf") if f >= 1.0 or device_s == 0 else 1.0 / ((1.0 - f) * device_s)
    return min(worker, device)


GRID = list(
    itertools.product(
        (1, 2, 5, 15, 64),  # workers
        (0.0, 1e-5, 1e-4, 5e-4, 2e-3),  # device s per image
        (2e-4, 1e-3, 4e-3, 2e-2),  # decode s
        (0.0, 2e-5, 1e-4, 3e-4),  # prep s
        (0.0, 5e-5, 1e-3),  # other s
    )
)


def test_the_share_is_the_best_split_over_a_grid_of_rates() -> None:
    """Over 1,200 combinations: the share is in [0, 1] and no share on a fine grid feeds more images
    per second (the best by brute force, to within the grid's step)."""
    shares = np.linspace(0.0, 1.0, 2001)
    for workers, device_s, decode_s, prep_s, other_s in GRID:
        kw = dict(workers=workers, device_s=device_s, decode_s=decode_s, prep_s=prep_s, other_s=other_s)
        f = worker_share(**kw)
        assert 0.0 <= f <= 1.0, kw
        best = max(_rate(float(s), **kw) for s in shares)
        assert _rate(f, **kw) >= best * (1 - 1e-3), (kw, f)


def test_where_the_sides_meet_neither_waits() -> None:
    """Strictly inside (0, 1), the two sides' rates are equal."""
    inside = 0
    for workers, device_s, decode_s, prep_s, other_s in GRID:
        f = worker_share(workers=workers, device_s=device_s, decode_s=decode_s, prep_s=prep_s, other_s=other_s)
        if 0.0 < f < 1.0:
            worker = workers / (other_s + prep_s + f * (decode_s - prep_s))
            device = 1.0 / ((1.0 - f) * device_s)
            assert worker == pytest.approx(device, rel=1e-9)
            inside += 1
    assert inside > 100


@pytest.mark.parametrize(
    ("kw", "share"),
    [
        pytest.param(dict(workers=8, device_s=0.0, decode_s=1e-3, prep_s=1e-4), 0.0, id="free-device"),
        pytest.param(dict(workers=1, device_s=1e-5, decode_s=1e-3, prep_s=1e-4), 0.0, id="workers-limit"),
        pytest.param(dict(workers=4, device_s=1e-3, decode_s=1e-4, prep_s=1e-4), 1.0, id="decode-costs-nothing"),
        pytest.param(dict(workers=10, device_s=1e-4, decode_s=1e-3, prep_s=0.0), 0.5, id="half"),
    ],
)
def test_edges(kw: dict, share: float) -> None:
    assert worker_share(**kw) == pytest.approx(share)


def test_more_device_time_or_workers_gives_the_workers_more() -> None:
    base = dict(decode_s=2e-3, prep_s=1e-4, other_s=5e-5)
    by_device = [worker_share(workers=8, device_s=d, **base) for d in (1e-5, 1e-4, 3e-4, 1e-3, 1e-2)]
    by_workers = [worker_share(workers=w, device_s=2e-4, **base) for w in (1, 2, 4, 8, 16, 32)]
    assert by_device == sorted(by_device) and by_workers == sorted(by_workers)
    assert by_device[0] < by_device[-1] and by_workers[0] < by_workers[-1]


@pytest.mark.parametrize("bad", [dict(workers=0), dict(device_s=-1.0), dict(decode_s=float("nan"))])
def test_nonsense_is_refused(bad: dict) -> None:
    kw = dict(workers=4, device_s=1e-4, decode_s=1e-3, prep_s=1e-4) | bad
    with pytest.raises(ValueError, match="worker_share"):
        worker_share(**kw)


@pytest.mark.parametrize("share", [0.0, 0.1, 0.25, 1 / 3, 0.5, 0.9, 1.0])
def test_a_worker_decodes_the_share_to_within_one_image_over_any_run(share: float) -> None:
    split = SharedSplit(share, timed=False)
    taken = np.cumsum([split.take() for _ in range(1000)])
    n = np.arange(1, 1001)
    assert np.all(np.abs(taken - share * n) <= 1.0)


def _child_takes(split: SharedSplit, out: mp.Queue) -> None:  # type: ignore[type-arg]
    out.put(sum(split.take() for _ in range(100)))


def test_the_share_reaches_spawned_processes_and_changes_seen_there() -> None:
    """Made before the workers, the split travels by handle (spawn) and a share set later in the parent
    is what a worker reads; pickling does not carry a process's own credit or view."""
    split = SharedSplit(0.0, timed=False)
    split.take()
    copy = pickle.loads(pickle.dumps(split))
    assert copy._view is None and copy._credit == 0.0
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    split.set_share(0.3)
    p = ctx.Process(target=_child_takes, args=(split, out))
    p.start()
    try:
        assert out.get(timeout=120) == 30
    finally:
        p.join(timeout=60)


class _Simulated:
    """Workers and a device with fixed costs, run for ``batches`` batches under a controller."""

    def __init__(self, *, workers: int, device_s: float, decode_s: float, prep_s: float, start: float) -> None:
        self.split = SharedSplit(start, timed=True)
        self.controller = ShareController(self.split, every=2)
        self.workers, self.device_s, self.decode_s, self.prep_s = workers, device_s, decode_s, prep_s

    def run(self, batches: int, batch: int = 64) -> float:
        for _ in range(batches):
            on_device = 0
            for _ in range(batch):
                if self.split.take():
                    self.split.record(self.decode_s, decoded=True)
                else:
                    self.split.record(self.prep_s, decoded=False)
                    on_device += 1
            self.split._view[self.split._row, 5] = self.workers  # type: ignore[index]  # as W workers would
            self.controller.observe(self.device_s * on_device, on_device)
        return self.split.share


@pytest.mark.parametrize(
    ("workers", "device_s", "decode_s", "prep_s"),
    [(8, 2e-4, 2e-3, 1e-4), (15, 1e-4, 1.4e-3, 9e-5), (2, 1e-4, 2e-3, 1e-4), (32, 1e-3, 1e-3, 1e-4)],
)
@pytest.mark.parametrize("start", [0.1, 0.9])
def test_the_controller_settles_on_the_rules_share(
    workers: int, device_s: float, decode_s: float, prep_s: float, start: float
) -> None:
    sim = _Simulated(workers=workers, device_s=device_s, decode_s=decode_s, prep_s=prep_s, start=start)
    settled = sim.run(60)
    assert settled == pytest.approx(
        worker_share(workers=workers, device_s=device_s, decode_s=decode_s, prep_s=prep_s), abs=0.02
    )
    assert sim.controller.history  # it did set shares


def test_the_controller_waits_until_both_sides_are_timed() -> None:
    split = SharedSplit(0.0, timed=True)  # nothing decoded by the workers yet: no decode rate
    controller = ShareController(split, every=1)
    for _ in range(FLUSH):
        split.record(1e-4, decoded=False)
    controller.observe(1e-2, 64)
    assert split.share == 0.0 and not controller.history


def test_a_worker_started_anew_never_makes_the_controller_raise() -> None:
    """A respawned worker's row counts its clock from 0 again: the sums may go back between two
    updates; the controller then keeps its rates rather than raise in the decode thread."""
    split = SharedSplit(0.5, timed=True)
    controller = ShareController(split, every=1)
    for _ in range(4 * FLUSH):
        split.record(2e-3 if split.take() else 1e-4, decoded=split._pending[1] % 2 == 0)
    split._view[split._row, 4] = 100.0  # type: ignore[index]  # other seconds, then a new process: 0
    controller.observe(1e-2, 64)
    split._view[split._row, 4] = 0.0  # type: ignore[index]
    for _ in range(2 * FLUSH):
        split.record(1e-4, decoded=False)
    split._view[split._row, 4] = 0.0  # type: ignore[index]
    controller.observe(1e-2, 64)
    assert 0.0 <= split.share <= 1.0 and len(controller.history) == 2
