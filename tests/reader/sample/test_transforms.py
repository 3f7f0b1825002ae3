"""Transforms: torchvision's crop algorithm, seeding, fast path ~= plain path, presets, pickling."""

from __future__ import annotations

import functools
import io
import math
import pickle
import random
import time

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance
from PIL.JpegImagePlugin import JpegImageFile

from shardify.convert.synth import jpeg_bytes, natural_image
from shardify.reader import transforms as T
from shardify.reader.sample.decode import DecodeError, decode_image, draft_scale


@functools.cache
def jpeg(width: int, height: int, seed: int = 0, quality: int = 90) -> bytes:
    return jpeg_bytes(natural_image(width, height, seed=seed), quality=quality)


def encode(img: Image.Image, fmt: str, **options: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **options)
    return buf.getvalue()


def plain(t: T.Transform, data: bytes, seed: int) -> torch.Tensor:
    """The reference: decode everything, transform the PIL image, copy to a tensor."""
    return T.pil_to_tensor(t(decode_image(data), random.Random(seed)))


def fast(t: T.Transform, data: bytes, seed: int) -> torch.Tensor:
    out = T.run_image_transform(t, data, rng=random.Random(seed))
    assert isinstance(out, torch.Tensor)
    return out


def mean_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape and a.dtype == b.dtype == torch.uint8
    return (a.int() - b.int()).abs().float().mean().item()


def reference_rrc_params(
    width: int, height: int, scale: tuple[float, float], ratio: tuple[float, float], rng: random.Random
) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params, as documented, on a Python rng."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = rng.randint(0, height - h)
            j = rng.randint(0, width - w)
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w = width
        h = height
    return (height - h) // 2, (width - w) // 2, h, w


# RandomResizedCrop: torchvision's algorithm


@pytest.mark.parametrize("scale", [(0.08, 1.0), (0.5, 0.9), (0.9, 1.0), (1.5, 2.0)])
@pytest.mark.parametrize("ratio", [(3 / 4, 4 / 3), (0.2, 0.3), (1.0, 1.0)])
@pytest.mark.parametrize("size", [(500, 375), (375, 500), (64, 64), (1000, 50), (3, 400), (1, 1)])
def test_rrc_params_match_the_reference(size: tuple[int, int], scale: tuple, ratio: tuple) -> None:
    t = T.RandomResizedCrop(224, scale=scale, ratio=ratio)
    for seed in range(40):
        ours, ref = random.Random(seed), random.Random(seed)
        assert t.crop_params(*size, ours) == reference_rrc_params(*size, scale, ratio, ref)
        assert ours.getstate() == ref.getstate()  # same number of draws


@pytest.mark.parametrize(
    ("size", "expected"),
    [((100, 100), (0, 0, 100, 100)), ((400, 100), (0, 133, 100, 133)), ((100, 400), (133, 0, 133, 100))],
    ids=["square-whole", "wide-clamped", "tall-clamped"],
)
def test_rrc_fallback_is_a_centre_crop_of_the_clamped_ratio(size: tuple[int, int], expected: tuple) -> None:
    t = T.RandomResizedCrop(224, scale=(2.0, 3.0))  # every attempt fails: area > image
    rng = random.Random(0)
    assert t.crop_params(*size, rng) == expected
    assert rng.getstate() == _after_draws(20)  # 10 attempts of 2 draws, then nothing


def _after_draws(n: int) -> object:
    rng = random.Random(0)
    for _ in range(n):
        rng.random()
    return rng.getstate()


def test_rrc_statistics() -> None:
    t = T.RandomResizedCrop(224)
    rng = random.Random(1)
    areas, log_ratios = [], []
    for _ in range(4000):
        top, left, h, w = t.crop_params(400, 400, rng)
        assert 0 <= top and top + h <= 400 and 0 <= left and left + w <= 400
        areas.append(h * w / (400 * 400))
        log_ratios.append(math.log(w / h))
    areas_a, ratios_a = np.array(areas), np.array(log_ratios)
    assert areas_a.min() >= 0.075 and areas_a.max() <= 1.0
    assert np.all(np.abs(ratios_a) <= math.log(4 / 3) + 0.05)
    assert abs(ratios_a.mean()) < 0.02  # log-uniform, symmetric
    # Against the reference run on an independent stream: same distribution of areas.
    ref_rng = random.Random(12345)
    ref = np.array(
        [
            h * w / 160000
            for _, _, h, w in (
                reference_rrc_params(400, 400, (0.08, 1.0), (3 / 4, 4 / 3), ref_rng) for _ in range(4000)
            )
        ]
    )
    assert abs(areas_a.mean() - ref.mean()) < 0.02 and 0.45 < areas_a.mean() < 0.54  # uniform, thinned at the top
    for q in (0.1, 0.3, 0.5, 0.8):
        assert abs(np.mean(areas_a < q) - np.mean(ref < q)) < 0.03


def test_rrc_plain_path_is_crop_then_resize() -> None:
    img = natural_image(300, 200, seed=4)
    t = T.RandomResizedCrop((100, 120))
    top, left, h, w = t.crop_params(300, 200, random.Random(5))
    expected = img.crop((left, top, left + w, top + h)).resize((120, 100), Image.Resampling.BILINEAR)
    out = t(img, random.Random(5))
    assert out.size == (120, 100) and np.array_equal(np.asarray(out), np.asarray(expected))


# Seeding and fast path ~= plain path

ALL_GEOMETRIC = {
    "imagenet_train": T.imagenet_train(224),
    "imagenet_eval": T.imagenet_eval(),
    "scale_jitter": T.ScaleJitter(),
    "rrc_jitter_flip": T.Compose(
        [
            T.RandomResizedCrop(160),
            T.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4),
            T.RandomHorizontalFlip(),
        ]
    ),
}


@pytest.mark.parametrize("name", sorted(ALL_GEOMETRIC))
@pytest.mark.parametrize("size", [(500, 375), (375, 500), (1280, 960)])
def test_fast_path_matches_plain_path(name: str, size: tuple[int, int]) -> None:
    t = ALL_GEOMETRIC[name]
    diffs = [mean_abs_diff(fast(t, jpeg(*size, seed=s), s), plain(t, jpeg(*size, seed=s), s)) for s in range(4)]
    assert max(diffs) < 3.0 and float(np.mean(diffs)) < 2.0, diffs


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(encode(natural_image(700, 500, seed=1).convert("L"), "JPEG", quality=90), id="gray-jpeg"),
        pytest.param(encode(natural_image(700, 500, seed=2).convert("CMYK"), "JPEG", quality=90), id="cmyk-jpeg"),
        pytest.param(encode(natural_image(700, 500, seed=3), "JPEG", quality=90, progressive=True), id="progressive"),
        pytest.param(encode(natural_image(700, 500, seed=4), "JPEG", quality=90, subsampling=0), id="444-jpeg"),
    ],
)
def test_fast_path_handles_jpeg_variants(data: bytes) -> None:
    for seed in range(3):
        a, b = fast(T.imagenet_eval(), data, seed), plain(T.imagenet_eval(), data, seed)
        assert a.shape == (3, 224, 224) and mean_abs_diff(a, b) < 3.0


@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "BMP"])
def test_non_jpeg_takes_the_plain_path_exactly(fmt: str) -> None:
    data = encode(natural_image(400, 300, seed=7), fmt)
    for t in ALL_GEOMETRIC.values():
        assert torch.equal(fast(t, data, 3), plain(t, data, 3))


def test_draft_scale_keeps_the_crop_at_least_the_output_size() -> None:
    assert draft_scale((0, 0, 500, 375), (224, 224)) == 1
    assert draft_scale((0, 0, 448, 448), (224, 224)) == 2
    assert draft_scale((0, 0, 1000, 900), (224, 224)) == 4
    assert draft_scale((10, 10, 9000, 9000), (224, 224)) == 8
    assert draft_scale((0, 0, 1800, 447), (224, 224)) == 1


def test_fast_path_asks_pillow_for_the_draft(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple] = []
    original = JpegImageFile.draft

    def spy(self: JpegImageFile, mode: str, size: tuple[int, int]) -> object:
        result = original(self, mode, size)
        calls.append((size, self.size, result))
        return result

    monkeypatch.setattr(JpegImageFile, "draft", spy)
    out = fast(T.imagenet_eval(), jpeg(1280, 960), 0)  # centre box 840 px: 420 at 1/2, 210 at 1/4
    assert out.shape == (3, 224, 224)
    assert calls == [((640, 480), (640, 480), ("RGB", (0, 0, 640.0, 480.0)))]
    calls.clear()
    fast(T.imagenet_eval(), jpeg(500, 375), 0)  # box ~328 px: no draft
    assert calls == []


def test_same_seed_same_output_different_seed_different_output() -> None:
    data = jpeg(500, 375)
    for t in ALL_GEOMETRIC.values():
        if isinstance(t, T.ResizeCenterCrop):
            continue
        assert torch.equal(fast(t, data, 11), fast(t, data, 11))
        assert torch.equal(plain(t, data, 11), plain(t, data, 11))
        assert any(not torch.equal(fast(t, data, 11), fast(t, data, s)) for s in range(12, 15))


# Flip, colour jitter, scale jitter, eval


def test_flip() -> None:
    img = natural_image(40, 30, seed=1)
    mirrored = np.asarray(img)[:, ::-1]
    assert np.array_equal(np.asarray(T.RandomHorizontalFlip(p=1.0)(img, random.Random(0))), mirrored)
    assert T.RandomHorizontalFlip(p=0.0)(img, random.Random(0)) is img
    x = T.pil_to_tensor(img)
    assert torch.equal(T.RandomHorizontalFlip(p=1.0).apply_tensor(x, random.Random(0)), x.flip(-1))
    flips = sum(T.RandomHorizontalFlip()(img, random.Random(s)) is not img for s in range(2000))
    assert 900 < flips < 1100


def test_color_jitter_factors_stay_in_bounds() -> None:
    t = T.ColorJitter(brightness=0.4, contrast=1.5, saturation=0.2)
    bounds = {"brightness": (0.6, 1.4), "contrast": (0.0, 2.5), "saturation": (0.8, 1.2)}
    seen = {op: [] for op in bounds}
    orders = set()
    for seed in range(3000):
        params = t.get_params(random.Random(seed))
        orders.add(tuple(op for op, _ in params))
        for op, factor in params:
            seen[op].append(factor)
    for op, (lo, hi) in bounds.items():
        values = np.array(seen[op])
        assert len(values) == 3000 and values.min() >= lo and values.max() <= hi
        assert values.min() < lo + 0.05 and values.max() > hi - 0.05
    assert len(orders) == 6  # random order of the three


def test_color_jitter_matches_imageenhance_on_pil_and_on_tensors() -> None:
    img = natural_image(64, 48, seed=2)
    x = T.pil_to_tensor(img)
    for name, enhancer in [("brightness", ImageEnhance.Brightness), ("contrast", ImageEnhance.Contrast),
                           ("saturation", ImageEnhance.Color)]:  # fmt: skip
        t = T.ColorJitter(**{name: 0.9})
        for seed in range(5):
            ((op, factor),) = t.get_params(random.Random(seed))
            expected = T.pil_to_tensor(enhancer(img).enhance(factor))
            assert op == name
            assert torch.equal(T.pil_to_tensor(t(img, random.Random(seed))), expected)
            assert torch.equal(t.apply_tensor(x, random.Random(seed)), expected)


def test_color_jitter_zero_is_identity_and_draws_nothing() -> None:
    img, rng = natural_image(20, 10, seed=3), random.Random(0)
    assert T.ColorJitter()(img, rng) is img
    assert rng.getstate() == random.Random(0).getstate()


def test_saturation_zero_gives_gray() -> None:
    t = T.ColorJitter(saturation=1.0)
    rng = next(random.Random(s) for s in range(1000) if t.get_params(random.Random(s))[0][1] < 0.01)
    out = np.asarray(t(natural_image(30, 20, seed=5), rng)).astype(int)
    assert np.abs(out[..., 0] - out[..., 1]).max() <= 2 and np.abs(out[..., 1] - out[..., 2]).max() <= 2


def test_scale_jitter_equals_resize_then_crop() -> None:
    img = natural_image(500, 375, seed=6)
    t = T.ScaleJitter(min_size=256, max_size=480, crop=224)
    for seed in range(10):
        rng = random.Random(seed)
        short = rng.randint(256, 480)
        nw, nh = int(short * 500 / 375), short
        top, left = rng.randint(0, nh - 224), rng.randint(0, nw - 224)
        expected = img.resize((nw, nh), Image.Resampling.BILINEAR).crop((left, top, left + 224, top + 224))
        got = t(img, random.Random(seed))
        assert got.size == (224, 224)
        diff = np.abs(np.asarray(got).astype(int) - np.asarray(expected))
        assert diff.max() <= 2 and diff.mean() < 0.05  # the filter's rounding only


@pytest.mark.parametrize("size", [(500, 375), (375, 500), (256, 256), (100, 80), (2000, 90)])
def test_eval_preset_is_resize_then_centre_crop(size: tuple[int, int]) -> None:
    img = natural_image(*size, seed=8)
    w, h = size
    nw, nh = (256, int(256 * h / w)) if w <= h else (int(256 * w / h), 256)
    top, left = int(round((nh - 224) / 2.0)), int(round((nw - 224) / 2.0))
    expected = img.resize((nw, nh), Image.Resampling.BILINEAR).crop((left, top, left + 224, top + 224))
    got = T.imagenet_eval()(img, random.Random(0))
    assert got.size == (224, 224)
    assert np.abs(np.asarray(got).astype(int) - np.asarray(expected)).max() <= 1


@pytest.mark.parametrize("preset", [T.imagenet_train(), T.imagenet_eval()], ids=["train", "eval"])
@pytest.mark.parametrize(
    "data",
    [jpeg(500, 375), jpeg(120, 90), encode(natural_image(300, 200, seed=9).convert("L"), "PNG")],
    ids=["jpeg", "small-jpeg", "gray-png"],
)
def test_presets_give_uint8_3x224x224(preset: T.Transform, data: bytes) -> None:
    out = fast(preset, data, 0)
    assert out.dtype == torch.uint8 and out.shape == (3, 224, 224) and out.is_contiguous()


# Picklable, user callables, errors


@pytest.mark.parametrize(
    "t",
    [
        T.imagenet_train(),
        T.imagenet_eval(),
        T.ScaleJitter(min_size=240, max_size=300, crop=200),
        T.RandomHorizontalFlip(0.3),
        T.ColorJitter(brightness=0.2, contrast=0.3, saturation=0.4),
        T.RandomResizedCrop((100, 50), scale=(0.3, 0.6), ratio=(0.5, 2.0)),
        T.Compose([T.imagenet_train(160), T.ColorJitter(contrast=0.5)]),
    ],
    ids=repr,
)
def test_transforms_survive_pickling(t: T.Transform) -> None:
    copy = pickle.loads(pickle.dumps(t))
    assert type(copy) is type(t) and repr(copy) == repr(t)
    data = jpeg(500, 375)
    assert torch.equal(fast(copy, data, 5), fast(t, data, 5))


def test_compose_flattens_and_checks() -> None:
    inner = T.imagenet_train()
    outer = T.Compose([inner, T.ColorJitter(brightness=0.1)])
    assert len(outer.transforms) == 3 and isinstance(outer.transforms[0], T.RandomResizedCrop)
    with pytest.raises(ValueError, match=r"transforms\[1\]"):
        T.Compose([T.RandomHorizontalFlip(), 3])


def draw_all(img: Image.Image) -> tuple[float, float, float]:
    """A torchvision-style transform that uses the three global RNGs."""
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_user_callable_gets_seeded_global_rngs() -> None:
    data = jpeg(64, 48)
    a = T.run_image_transform(draw_all, data, rng=random.Random(1))
    assert a == T.run_image_transform(draw_all, data, rng=random.Random(1))
    assert a != T.run_image_transform(draw_all, data, rng=random.Random(2))
    # In a Compose after a crop, the callable sees the PIL image on both paths.
    seen: list[type] = []
    t = T.Compose([T.RandomResizedCrop(32), lambda img: seen.append(type(img)) or img.rotate(90)])
    out = T.run_image_transform(t, data, rng=random.Random(3))
    assert seen == [Image.Image] and isinstance(out, torch.Tensor) and out.shape == (3, 32, 32)


def test_user_callable_returning_pil_becomes_a_tensor_and_none_gives_the_whole_image() -> None:
    data = jpeg(64, 48)
    out = T.run_image_transform(lambda img: img.resize((10, 20)), data, rng=random.Random(0))
    assert isinstance(out, torch.Tensor) and out.shape == (3, 20, 10)
    whole = T.run_image_transform(None, data, rng=random.Random(0))
    assert whole.shape == (3, 48, 64) and torch.equal(whole, T.pil_to_tensor(decode_image(data)))


def test_seeding_the_global_rngs_is_cheap() -> None:
    rng = random.Random(0)
    T._seed_globals(rng)
    start = time.perf_counter()
    for _ in range(2000):
        T._seed_globals(rng)
    assert (time.perf_counter() - start) / 2000 < 50e-6  # ~6 us here; generous for slow CI


def test_corrupt_jpeg_raises_decode_error() -> None:
    with pytest.raises(DecodeError, match="cannot decode image"):
        fast(T.imagenet_train(), jpeg(500, 375)[:2000], 0)
    with pytest.raises(DecodeError, match="cannot decode image"):
        fast(T.imagenet_train(), b"garbage", 0)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: T.RandomResizedCrop(0), "size_h=0"),
        (lambda: T.RandomResizedCrop(224, scale=(0.9, 0.1)), "scale="),
        (lambda: T.RandomResizedCrop(224, ratio=(0.0, 1.0)), "ratio="),
        (lambda: T.ScaleJitter(min_size=200, crop=224), "crop=224"),
        (lambda: T.ScaleJitter(min_size=300, max_size=256), "max_size=256"),
        (lambda: T.ResizeCenterCrop(resize=200, crop=224), "crop=224"),
        (lambda: T.RandomHorizontalFlip(p=1.5), "p=1.5"),
        (lambda: T.ColorJitter(brightness=-0.1), "brightness=-0.1"),
        (lambda: T.ColorJitter(contrast=float("nan")), "contrast=nan"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(make: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()  # type: ignore[operator]


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_libjpeg_turbo_path_gives_pillows_pixels(monkeypatch, mode: str) -> None:
    """The simplejpeg decode and the Pillow decode of the same crop agree (same libjpeg-turbo)."""
    import random

    from shardify.reader.sample import decode

    if decode._simplejpeg is None:
        pytest.skip("simplejpeg not installed")
    data = jpeg_bytes(
        natural_image(500, 375, seed=5).convert(mode).convert("RGB")
        if mode == "RGB"
        else natural_image(500, 375, seed=5).convert("L")
    )
    t = T.imagenet_train(224)
    fast = [t.apply_encoded(data, random.Random(i)) for i in range(6)]
    monkeypatch.setattr(decode, "_simplejpeg", None)
    pillow = [t.apply_encoded(data, random.Random(i)) for i in range(6)]
    for a, b in zip(fast, pillow):
        assert a.shape == b.shape == (3, 224, 224) and a.dtype == torch.uint8
        assert (a.int() - b.int()).abs().max() <= 1


def test_usual_jpeg_crops_never_open_pillow(monkeypatch) -> None:
    """Header and pixels both from libjpeg-turbo; Pillow only for fractional crops and other formats."""
    import random

    from shardify.reader.sample import decode
    from shardify.reader.sample import transforms as transforms_module

    if decode._simplejpeg is None:
        pytest.skip("simplejpeg not installed")
    data = jpeg(500, 375)
    want = [T.imagenet_train(224).apply_encoded(data, random.Random(i)) for i in range(4)]

    def refuse(_: bytes) -> None:
        raise AssertionError("Pillow opened a JPEG the fast path decodes")

    monkeypatch.setattr(transforms_module, "open_image", refuse)
    got = [T.imagenet_train(224).apply_encoded(data, random.Random(i)) for i in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(got, want))
