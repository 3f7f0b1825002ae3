"""PyTorch Lightning's Trainer over a ShardedDataset (CPU): fit, DDP on gloo, and an exact mid-epoch resume.

Lightning saves ``state_dict()`` of every train loader that has one in the checkpoint
(``loops.fit_loop.state_dict.combined_loader``) and gives it back with ``load_state_dict``
before it makes the first iterator of the resumed fit. Each fit runs as its own process
(``lightning_job.py``; under DDP Lightning starts rank 1 by running the script again). The
samples a resumed fit trains on must be exactly those the uninterrupted run has left, on
every rank: that run is computed here with the same loader under ``RANK``/``WORLD_SIZE``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("pytorch_lightning")

from shardify.reader import make_loader  # noqa: E402

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("shardify_framework_jobs", HERE / "jobs.py")
jobs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jobs)

TIME_LIMIT_S = 300
EPOCHS = 2


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return jobs.write_images(tmp_path_factory.mktemp("lightning") / "ds")


def uninterrupted(root: Path, *, rank: int, world: int, workers: int, monkeypatch) -> list:
    """``[(epoch, keys, images, labels), ...]`` that rank ``rank`` of ``world`` trains on over the epochs."""
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    ds = jobs.dataset(root)
    loader = make_loader(ds, num_workers=workers)
    out = []
    for epoch in range(EPOCHS):
        ds.set_epoch(epoch)
        out += [(epoch, *batch) for batch in jobs.take(loader)]
    loader.close()
    return out


def fit(root: Path, out: Path, *args: str) -> list[list]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    subprocess.run(
        [sys.executable, str(HERE / "lightning_job.py"), str(root), str(out), *args],
        check=True,
        timeout=240,
        env=env,
        cwd=out.parent,
    )
    return [torch.load(p, weights_only=False) for p in sorted(out.glob("rank*.pt"))]


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        ea == eb and ka == kb and torch.equal(xa, xb) and torch.equal(ya, yb)
        for (ea, ka, xa, ya), (eb, kb, xb, yb) in zip(a, b)
    )


@pytest.mark.parametrize(
    ("devices", "workers", "loader", "stop_at"),
    [
        pytest.param(1, 0, "shardify", 8, id="1-device-make_loader-saved-after-the-epochs-last-batch"),
        pytest.param(2, 2, "shardify", 5, id="ddp-2-ranks-2-workers-make_loader"),
        pytest.param(2, 2, "sdl", 3, id="ddp-2-ranks-2-workers-StatefulDataLoader"),
    ],
)
def test_a_resumed_fit_trains_on_exactly_what_the_uninterrupted_one_had_left(
    images, tmp_path, monkeypatch, devices, workers, loader, stop_at
):
    common = ("--devices", str(devices), "--workers", str(workers), "--loader", loader)
    ckpt = tmp_path / "mid.ckpt"
    before = fit(images, tmp_path / "before", *common, "--stop-at", str(stop_at), "--ckpt", str(ckpt))
    state = torch.load(ckpt, weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert len(state) == 1  # Lightning found the loader's state_dict and saved it
    after = fit(images, tmp_path / "after", *common, "--resume", str(ckpt))
    assert len(before) == len(after) == devices

    steps = {len(b) + len(a) for b, a in zip(before, after)}
    per_epoch = len(jobs.dataset(images)) if devices == 1 else -(-11 // 3)  # 22 samples: 11 per rank, batches of 3
    assert steps == {EPOCHS * per_epoch}  # the same number of steps on every rank
    for rank, (b, a) in enumerate(zip(before, after)):
        assert len(b) == stop_at
        expected = uninterrupted(images, rank=rank, world=devices, workers=workers, monkeypatch=monkeypatch)
        assert same(b + a, expected), f"rank {rank}"
    for epoch in range(EPOCHS):  # each epoch: every sample once over the ranks
        keys = sorted(k for b, a in zip(before, after) for e, ks, _, _ in b + a if e == epoch for k in ks)
        assert keys == [f"img{i:03d}" for i in range(22)]


def test_a_statefuldataloader_checkpoint_after_an_epochs_last_batch_fails_the_resumed_fit_loudly(images, tmp_path):
    """Lightning checkpoints after the epoch's last batch, then iterates the restored loader as the
    next epoch's without calling on_train_epoch_start: a StatefulDataLoader's workers cannot tell
    that from a loop asking for the epoch's empty rest, so the resumed fit fails naming the way on,
    instead of training the next epoch on 0 batches."""
    common = ("--devices", "1", "--workers", "2", "--loader", "sdl")
    ckpt = tmp_path / "end.ckpt"
    fit(images, tmp_path / "before", *common, "--stop-at", str(len(jobs.dataset(images))), "--ckpt", str(ckpt))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    done = subprocess.run(
        [
            sys.executable,
            str(HERE / "lightning_job.py"),
            str(images),
            str(tmp_path / "after"),
            *common,
            "--resume",
            str(ckpt),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode != 0 and not (tmp_path / "after").exists(), "the resumed fit went on silently"
    assert "ResumeError" in done.stderr and "after the last batch of epoch 0" in done.stderr
    assert "set_epoch(1)" in done.stderr and "make_loader" in done.stderr
