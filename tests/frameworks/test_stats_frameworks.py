"""Loader statistics under torchdata's StatefulDataLoader and Lightning's Trainer (CPU, in this process).

StatefulDataLoader: :class:`~shardify.reader.delivery.diagnosis.Measured` wraps it; its own
``state_dict`` still resumes exactly. Lightning: ``make_loader``'s loader, iterated by the
Trainer, measures the epoch as in a loop of one's own.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from shardify.reader import make_loader
from shardify.reader.delivery.diagnosis import WORKER_STAGES, Measured

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("shardify_framework_jobs", HERE / "jobs.py")
jobs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jobs)

BATCHES = 8  # 22 samples in batches of 3


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return jobs.write_images(tmp_path_factory.mktemp("stats") / "ds")


def test_stateful_dataloader_measured_and_still_resumable(images):
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    ds = jobs.dataset(images)
    loader = Measured(sdl.StatefulDataLoader(ds, batch_size=None, num_workers=2), ds)
    ds.set_epoch(1)
    it = iter(loader)
    first = [jobs.plain(next(it)) for _ in range(3)]
    mid = loader.stats()
    assert mid.batches == 3 and mid.samples == 9 and not mid.finished
    state = loader.state_dict()  # the StatefulDataLoader's own
    rest = [jobs.plain(b) for b in it]
    s = loader.stats()
    assert s.finished and s.batches == BATCHES and s.samples == 22 and s.epoch == 1
    assert s.worker_busy_s > 0 and sum(s.stages[k] for k in WORKER_STAGES) > 0
    assert s.stages["pin"] == s.stages["copy"] == 0  # the StatefulDataLoader's own: not measured

    again = Measured(sdl.StatefulDataLoader(ds, batch_size=None, num_workers=2), ds)
    again.load_state_dict(state)
    resumed = [jobs.plain(b) for b in again]
    assert [k for k, _, _ in resumed] == [k for k, _, _ in rest]
    assert all(torch.equal(a[1], b[1]) for a, b in zip(resumed, rest))
    assert len(first) + len(rest) == BATCHES


def test_lightning_fit_with_make_loader_measures_the_epoch(images):
    pl = pytest.importorskip("pytorch_lightning")

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(3 * 12 * 12, 3)
            self.ds = jobs.dataset(images)
            self.loader = make_loader(self.ds, num_workers=1)

        def train_dataloader(self):
            return self.loader

        def training_step(self, batch, batch_idx):
            _, x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x.flatten(1).float() / 255), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    model = Model()
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    try:
        trainer.fit(model)
        s = model.loader.stats()
    finally:
        model.loader.close()
    assert s.finished and s.batches == BATCHES and s.samples == 22
    assert 0 < s.wait_s <= s.wall_s and s.worker_busy_s > 0
    assert s.bottleneck in ("input", "compute")
