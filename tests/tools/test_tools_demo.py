"""examples/demo.py prints a loader state in a few words, not the ~900-character dict."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np

from shardify.convert import ShardWriter
from shardify.reader import ShardedDataset, make_loader

_spec = importlib.util.spec_from_file_location("shardify_demo", Path(__file__).parents[2] / "examples" / "demo.py")
demo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(demo)


def test_the_demo_prints_a_short_state(tmp_path):
    with ShardWriter(tmp_path / "ds", split="train", samples_per_shard=4) as w:
        for i in range(12):
            w.write({"npy": np.full(2, i, np.uint8), "cls": i % 2})
    ds = ShardedDataset(tmp_path / "ds", batch_size=2, fields=("cls",))
    loader = make_loader(ds)
    ds.set_epoch(1)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    text = demo.state_summary(state)
    assert text == f"state: epoch 1, 2 batches done, {len(json.dumps(state))} bytes as JSON"
    assert len(str(state)) > 300 and len(text) < 80
