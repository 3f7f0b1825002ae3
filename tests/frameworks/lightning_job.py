"""A Lightning fit over a ShardedDataset, run as its own process: ``python lightning_job.py ARGS``.

``python lightning_job.py ROOT OUT --devices 2 --workers 0 [--loader sdl] [--stop-at K] [--ckpt C] [--resume C]``
fits 2 epochs (or stops after ``K`` steps, having saved a checkpoint there), on the CPU, with
``strategy="ddp"`` (gloo) when ``--devices`` > 1: Lightning starts the other ranks by running
this script again. The loader is ``make_loader``'s, or torchdata's ``StatefulDataLoader``
with ``--loader sdl``. Each rank saves what each training step got to ``OUT/rank{r}.pt`` as
``[(epoch, keys, images, labels), ...]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import warnings
from pathlib import Path

import pytorch_lightning as pl
import torch

from shardify.reader import make_loader

_spec = importlib.util.spec_from_file_location("shardify_framework_jobs", Path(__file__).with_name("jobs.py"))
jobs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jobs)


class Model(pl.LightningModule):
    """A linear classifier on the 12x12 crops; it records every batch it trains on."""

    def __init__(self, root: str, workers: int, loader: str) -> None:
        super().__init__()
        self.root, self.workers, self.kind = root, workers, loader
        self.net = torch.nn.Linear(3 * 12 * 12, 3)
        self.seen: list = []
        self.ds = jobs.dataset(Path(root))
        self.loader = None

    def train_dataloader(self):
        # Called before Lightning restores the loader's state and makes its first iterator.
        self.ds.set_epoch(self.trainer.current_epoch)
        if self.kind == "sdl":
            from torchdata.stateful_dataloader import StatefulDataLoader

            self.loader = StatefulDataLoader(self.ds, batch_size=None, num_workers=self.workers)
        else:
            self.loader = make_loader(self.ds, num_workers=self.workers)
        return self.loader

    def on_train_epoch_start(self) -> None:
        # Epochs after the first: Lightning makes the epoch's iterator after this hook.
        self.ds.set_epoch(self.trainer.current_epoch)

    def training_step(self, batch, batch_idx):
        keys, images, labels = batch
        self.seen.append((self.trainer.current_epoch, list(keys), images.clone(), labels.clone()))
        logits = self.net(images.flatten(1).float() / 255)
        return torch.nn.functional.cross_entropy(logits, labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class SaveAt(pl.Callback):
    """Saves a checkpoint once ``step`` optimizer steps are done (on_train_batch_end, as ModelCheckpoint does)."""

    def __init__(self, step: int, path: str) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("out")
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--loader", choices=("shardify", "sdl"), default="shardify")
    p.add_argument("--stop-at", type=int, default=-1)
    p.add_argument("--ckpt")
    p.add_argument("--resume")
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    callbacks = [SaveAt(a.stop_at, a.ckpt)] if a.ckpt else []
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=a.devices,
        strategy="ddp" if a.devices > 1 else "auto",
        max_epochs=2,
        max_steps=a.stop_at,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    model = Model(a.root, a.workers, a.loader)
    trainer.fit(model, ckpt_path=a.resume)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    torch.save(model.seen, Path(a.out) / f"rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    main()
