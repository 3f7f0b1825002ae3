"""``fast_decode=True``: the same crops, decoded with libjpeg-turbo's fast IDCT and upsampling;
pixels close to the exact path's but not the same."""

from __future__ import annotations

import pickle

import pytest
import torch

from shardify.convert.synth import jpeg_bytes, natural_image
from shardify.reader.plan.shuffle import sample_rng
from shardify.reader.sample import transforms as T


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda fast: T.imagenet_train(64, fast_decode=fast), id="imagenet_train"),
        pytest.param(lambda fast: T.RandomResizedCrop((48, 64), scale=(0.5, 1.0), fast_decode=fast), id="rrc"),
    ],
)
def test_fast_decode_is_close_to_the_exact_path_and_not_equal(make) -> None:
    images = [jpeg_bytes(natural_image(200, 150, seed=s), quality=85) for s in range(6)]
    exact, fast = make(False), make(True)
    differ = 0
    for i, data in enumerate(images):
        a = T.run_image_transform(exact, data, rng=sample_rng(0, 1, f"k{i}"))
        b = T.run_image_transform(fast, data, rng=sample_rng(0, 1, f"k{i}"))
        assert isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype == torch.uint8
        d = (a.to(torch.int16) - b.to(torch.int16)).abs()
        assert d.float().mean() < 2.0 and d.max() <= 40  # the same crop, nearly the same pixels
        differ += int((d > 0).sum())
    assert differ > 0  # the option reaches the decoder
    first = fast.transforms[0] if isinstance(fast, T.Compose) else fast
    assert pickle.loads(pickle.dumps(first)).fast_decode is True  # reaches the workers


def test_bench_reports_the_fast_decode_ratio_and_pixel_difference() -> None:
    from shardify.cli.bench.fastdecode import fast_decode_figures

    encoded = [(f"k{s}", jpeg_bytes(natural_image(160, 120, seed=s))) for s in range(4)]
    r = fast_decode_figures(encoded, 96, passes=1)  # crops decoded at full scale (scaled IDCTs have no fast variant)
    assert r["exact_ips"] > 0 and r["fast_ips"] > 0 and r["ratio"] == pytest.approx(r["fast_ips"] / r["exact_ips"])
    assert 0 < r["mean_abs_diff"] < 2 and 0 < r["share_differing"] < 1 and r["max_abs_diff"] >= 1
