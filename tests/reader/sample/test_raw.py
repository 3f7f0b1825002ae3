"""The reader on pre-decoded images (``--raw-pixels``): same draws and boxes as the JPEG path,
the plain (Pillow) path's pixels within a stated tolerance, no decoding, resume unaffected."""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from shardify.convert.synth import jpeg_bytes, natural_image
from shardify.pixels import encode_ppm
from shardify.reader import BatchOptions, SamplingOptions, ShardedDataset, make_loader
from shardify.reader import transforms as T
from shardify.reader.sample import transforms as transforms_module
from shardify.reader.sample.decode import DecodeError, decode_image

SIZES = ((120, 90), (90, 120), (100, 100), (61, 47))

PLAIN_TOLERANCE = {
    # RandomResizedCrop: torch's antialiased bilinear on the crop against Pillow's bilinear,
    # as on the JPEG fast path: off by at most 2 levels, 0.25 on average at worst (measured
    # over 300 crops: mean 0.04).
    "train": (2, 0.25),
    "rrc-rect": (2, 0.25),
    # Resize-then-crop transforms use Pillow's own resize (or a plain copy): exact.
    "eval": (0, 0.0),
    "eval-at-stored-size": (0, 0.0),
    "jitter": (0, 0.0),
    # A crop within 2 levels, then colour jitter (contrast and saturation up to 1.4x, the
    # mean luma rounded) may move a pixel a few levels more.
    "train-colour": (8, 0.5),
}
TRANSFORMS = {
    "train": lambda: T.imagenet_train(64),
    "rrc-rect": lambda: T.RandomResizedCrop((48, 80), scale=(0.3, 1.0)),
    "eval": lambda: T.ResizeCenterCrop(resize=72, crop=64),
    "eval-at-stored-size": lambda: T.ResizeCenterCrop(resize=90, crop=64),
    "jitter": lambda: T.ScaleJitter(min_size=64, max_size=120, crop=48),
    "train-colour": lambda: T.Compose(
        [T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4)]
    ),
}


def ppm(k: int) -> bytes:
    w, h = SIZES[k % len(SIZES)]
    return encode_ppm(natural_image(w, h, seed=k))


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_raw_pixels_give_the_plain_paths_pixels_within_the_tolerance(name: str) -> None:
    t = TRANSFORMS[name]()
    worst, worst_mean = PLAIN_TOLERANCE[name]
    for k in range(40):
        data = ppm(k)
        fast = T.run_image_transform(t, data, rng=random.Random(k))
        plain = T.pil_to_tensor(t(decode_image(data), random.Random(k)))  # Pillow decodes the same PPM
        assert fast.dtype == torch.uint8 and fast.shape == plain.shape and fast.is_contiguous()
        diff = (fast.int() - plain.int()).abs()
        assert diff.max() <= worst and diff.float().mean() <= worst_mean, (k, diff.max(), diff.float().mean())


class _Recorder:
    """Wraps a crop transform's ``draw_crop``: logs (stored width, height, box, size) per call."""

    def __init__(self, t: T.Transform) -> None:
        self.t, self.calls = t, []
        first = t.transforms[0] if isinstance(t, T.Compose) else t
        draw = first.draw_crop

        def logged(width, height, rng):  # noqa: ANN001, ANN202
            box, size = draw(width, height, rng)
            self.calls.append((width, height, box, size))
            return box, size

        first.draw_crop = logged


@pytest.mark.parametrize("name", ["train", "eval", "jitter"])
def test_the_crop_box_is_the_jpeg_paths_drawn_on_the_stored_size(name: str) -> None:
    """The same sample (rng) gets the same draws and box from a PPM as from a JPEG of the same
    size, and the rng is left in the same state (so later draws, e.g. the flip, match too)."""
    raw, jpg = _Recorder(TRANSFORMS[name]()), _Recorder(TRANSFORMS[name]())
    for k in range(30):
        img = natural_image(*SIZES[k % len(SIZES)], seed=k)
        r1, r2 = random.Random(k), random.Random(k)
        T.run_image_transform(raw.t, encode_ppm(img), rng=r1)
        T.run_image_transform(jpg.t, jpeg_bytes(img), rng=r2)
        assert r1.random() == r2.random()
    assert raw.calls == jpg.calls
    assert {(w, h) for w, h, _, _ in raw.calls} == set(SIZES)  # drawn on the stored size


def test_raw_pixels_are_never_decoded(monkeypatch) -> None:
    """No Pillow, no libjpeg: the crop transforms and the whole-image path view the bytes."""
    data = [ppm(k) for k in range(8)]
    train, evaluate = T.imagenet_train(64), T.ResizeCenterCrop(resize=90, crop=64)
    want = [
        (
            T.run_image_transform(train, d, rng=random.Random(k)),
            T.run_image_transform(evaluate, d, rng=random.Random(k)),
            T.run_image_transform(None, d, rng=random.Random(k)),
        )
        for k, d in enumerate(data)
    ]

    def refuse(*_a, **_k) -> None:
        raise AssertionError("a raw image was decoded")

    for name in ("open_image", "decode_image", "turbo_jpeg_size", "decode_jpeg_crop"):
        monkeypatch.setattr(transforms_module, name, refuse)
    monkeypatch.setattr(Image, "open", refuse)
    for k, d in enumerate(data):
        got = (
            T.run_image_transform(train, d, rng=random.Random(k)),
            T.run_image_transform(evaluate, d, rng=random.Random(k)),
            T.run_image_transform(None, d, rng=random.Random(k)),
        )
        assert all(torch.equal(a, b) for a, b in zip(got, want[k]))


def test_the_whole_image_is_the_stored_pixels_exactly() -> None:
    img = natural_image(61, 47, seed=3)
    x = T.run_image_transform(None, encode_ppm(img), rng=random.Random(0))
    assert x.shape == (3, 47, 61) and torch.equal(x.permute(1, 2, 0), torch.from_numpy(np.array(img)))


def test_no_warning_and_the_members_bytes_are_left_alone() -> None:
    """torch warns (once per process) when it wraps a read-only array: a fresh process, in
    which every warning is an error, crops raw pixels of every shape without one."""
    code = (
        "import random\n"
        "from shardify.convert.synth import natural_image\n"
        "from shardify.pixels import encode_ppm\n"
        "from shardify.reader import transforms as T\n"
        "data = encode_ppm(natural_image(120, 90, seed=1)); before = bytes(data)\n"
        "for t in (T.imagenet_train(64), T.ResizeCenterCrop(resize=90, crop=64), "
        "T.RandomResizedCrop(90, scale=(1, 1)), None):\n"
        "    for k in range(20):\n"
        "        T.run_image_transform(t, data, rng=random.Random(k)).fill_(0)\n"
        "assert data == before\n"
    )
    done = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_other_ppms_take_pillows_path_and_the_pixel_limit_still_holds(monkeypatch) -> None:
    img = natural_image(40, 30, seed=2)
    commented = encode_ppm(img).replace(b"P6\n", b"P6\n# made elsewhere\n", 1)
    t = T.imagenet_train(24)
    a = T.run_image_transform(t, commented, rng=random.Random(5))
    b = T.run_image_transform(t, encode_ppm(img), rng=random.Random(5))
    assert (a.int() - b.int()).abs().max() <= 2
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 40 * 30 - 1)
    with pytest.raises(DecodeError, match="decompression bomb"):
        T.run_image_transform(t, encode_ppm(img), rng=random.Random(5))
    with pytest.raises(DecodeError, match="decompression bomb"):
        T.run_image_transform(None, encode_ppm(img), rng=random.Random(5))


@pytest.fixture(scope="module")
def raw_dataset(tmp_path_factory, shards):  # noqa: ANN001, ANN201
    """22 PPM samples in 3 shards, written with the tests' format helpers (the ``shards`` fixture)."""
    samples_of, g = [], 0
    for n in (7, 2, 13):
        samples = []
        for _ in range(n):
            samples.append((f"img{g:05d}", {"cls": str(g).encode(), "ppm": ppm(g)}))
            g += 1
        samples_of.append(samples)
    return shards.write_dataset(tmp_path_factory.mktemp("raw") / "ds", samples_of)


def _dataset(root, **kw) -> ShardedDataset:  # noqa: ANN001
    return ShardedDataset(
        root,
        batch_size=3,
        shuffle=True,
        seed=11,
        transform=T.imagenet_train(32),
        sampling=SamplingOptions(shuffle_buffer=5, shuffle_block=2),
        batching=BatchOptions(drop_last=True),
        **kw,
    )


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_reads_every_raw_sample_once_and_resumes_exactly(raw_dataset, workers: int) -> None:
    ds = _dataset(raw_dataset)
    ds.set_epoch(1)
    full = list(make_loader(ds, num_workers=workers))
    labels = torch.cat([y for _, y in full]).tolist()
    assert len(labels) == 21 and len(set(labels)) == 21 and set(labels) <= set(range(22))  # drop_last: 7 x 3
    assert all(x.shape == (3, 3, 32, 32) and x.dtype == torch.uint8 for x, _ in full)

    ds = _dataset(raw_dataset)
    loader = make_loader(ds, num_workers=workers)
    ds.set_epoch(1)
    for i, _ in enumerate(loader):
        if i + 1 == 3:
            break
    state = loader.state_dict()
    ds = _dataset(raw_dataset)
    loader = make_loader(ds, num_workers=workers)
    loader.load_state_dict(state)
    ds.set_epoch(1)
    rest = list(loader)
    assert len(rest) == len(full) - 3
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(rest, full[3:]))
