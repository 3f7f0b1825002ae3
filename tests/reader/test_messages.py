"""Messages of the reader that say what to do: a misspelt keyword, an image field's name, images
of different sizes without a resize, and the repeat counts of the skip report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shardify.convert import ShardWriter
from shardify.errors import FieldError
from shardify.reader import EpochReport, ShardedDataset


def _images(root: Path, sizes: list[tuple[int, int]]) -> Path:
    rng = np.random.default_rng(0)
    with ShardWriter(root, split="train") as w:
        for i, (h, wd) in enumerate(sizes):
            w.write({"__key__": f"k{i}", "jpg": rng.integers(0, 255, (h, wd, 3), dtype=np.uint8), "cls": i % 2})
    return root


def test_a_misspelt_keyword_is_named_with_the_close_one(tmp_path):
    root = _images(tmp_path / "ds", [(8, 8)] * 2)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'batchsize'; did you mean batch_size=\?"):
        ShardedDataset(root, batchsize=4)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'shufle'; did you mean shuffle=\?"):
        ShardedDataset(root, batch_size=4, shufle=True)
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'batch_size'"):
        ShardedDataset(root)


def test_an_image_field_asked_by_another_name_says_to_use_image(tmp_path):
    root = _images(tmp_path / "ds", [(8, 8)] * 2)
    with pytest.raises(FieldError, match=r"no field 'img'.*hold cls, jpg.*for the images use 'image'.*'jpg'"):
        ShardedDataset(root, batch_size=2, fields=("img", "cls"))
    assert len(ShardedDataset(root, batch_size=2, fields=("image", "cls"))) == 1


def test_images_of_different_sizes_without_a_transform_say_to_add_a_resize(tmp_path):
    root = _images(tmp_path / "ds", [(8, 8), (10, 12)])
    ds = ShardedDataset(root, batch_size=2)
    with pytest.raises(
        ValueError,
        match=r"cannot stack shapes.*need a transform that gives them one size: "
        r"transform=transforms.imagenet_eval\(224\)",
    ):
        next(iter(ds))


def test_the_skip_reports_repeat_counts_say_what_they_count():
    report = EpochReport(
        epoch=3,
        bad=2,
        lost=40,
        entries=(("s.tar", None, "shard s.tar: truncated"),) * 32 + (("s.tar", "k1", "bad jpeg"),) * 2,
    )
    text = str(report)
    assert "(x" not in text
    assert "(32 samples of this shard lost for this reason, of those counted above: each worker lists its first" in text
    assert "key 'k1': bad jpeg (2 times: the epoch reads this sample 2 times" in text
