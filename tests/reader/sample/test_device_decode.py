"""Device decode (``ShardedDataset(decoding=DecodeOptions(device=...))``) on the CPU.

The worker side draws the CPU path's crops and flips from the JPEG header; the device side
(plain torch) crops, resizes and flips like the CPU transforms; the whole pipeline runs with
a Pillow batch decoder in place of nvJPEG (``jpeg_decoder=pil_decoder``): same batches,
labels, keys, exactly-once and resume as the CPU path, fallbacks counted, bad samples
following ``on_error``. The nvJPEG path itself is checked in ``tests/gpu/``.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from shardify.convert.synth import jpeg_bytes, natural_image
from shardify.errors import DeviceDecodeError, DeviceDecodeOptionsError, SampleError
from shardify.reader import BatchOptions, DecodeOptions, ShardedDataset, make_loader
from shardify.reader import transforms as T
from shardify.reader.plan.shuffle import sample_rng
from shardify.reader.sample.collate import default_collate, pad_collate
from shardify.reader.sample.decode import DecodeError, decode_image, pil_to_tensor
from shardify.reader.sample.device_augment import augment_batch
from shardify.reader.sample.device_decode import pil_decoder
from shardify.reader.sample.device_prep import DevicePrep, device_decodable, jpeg_frame
from shardify.reader.sample.prepared import EncodedBatch

SIZES = ((160, 120), (120, 160), (97, 131), (200, 150), (64, 333), (333, 64))


class SpyCrop:
    """Records the boxes a crop transform's ``draw_crop`` draws (wraps the method of one instance)."""

    def __init__(self, crop: object) -> None:
        self.boxes: list[tuple] = []
        draw = crop.draw_crop  # type: ignore[attr-defined]

        def spy(width: int, height: int, rng: object) -> tuple:
            box, size = draw(width, height, rng)
            self.boxes.append((tuple(float(v) for v in box), size))
            return box, size

        crop.draw_crop = spy  # type: ignore[attr-defined]


def _encoded(img: Image.Image, **save: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, **save)
    return buf.getvalue()


def _transforms() -> list[pytest.param]:
    return [
        pytest.param(lambda: T.imagenet_train(48), id="rrc+flip"),
        pytest.param(lambda: T.imagenet_eval(48, resize=56), id="resize+centre"),
        pytest.param(
            lambda: T.Compose(
                [
                    T.ScaleJitter(min_size=60, max_size=90, crop=48),
                    T.RandomHorizontalFlip(0.5),
                    T.RandomHorizontalFlip(0.3),
                ]
            ),
            id="jitter+2flips",
        ),
    ]


@pytest.mark.parametrize("make", _transforms())
def test_same_crop_boxes_and_flips_as_the_cpu_path(make) -> None:
    """Over keys, epochs, seeds and sizes: the device prep draws the CPU path's box, and consumes the
    sample's RNG exactly as the CPU path does (so the flips, the next draws, agree)."""
    t = make()
    crop = t.transforms[0] if isinstance(t, T.Compose) else t
    prep = DevicePrep(t)
    spy = SpyCrop(crop)
    images = {s: jpeg_bytes(natural_image(*s, seed=i)) for i, s in enumerate(SIZES)}
    checked = 0
    for seed in (0, 7):
        for epoch in range(3):
            for k in range(12):
                size = SIZES[k % len(SIZES)]
                data, key = images[size], f"key{k:03d}"
                rng_cpu, rng_dev = sample_rng(seed, epoch, key), sample_rng(seed, epoch, key)
                cpu = t.apply_encoded(data, rng_cpu)
                prepared = prep.prepare(data, rng_dev)
                cpu_box, cpu_size = spy.boxes[-2]  # the CPU path's draw, then the device prep's
                assert prepared.pixels is None and prepared.data is data
                assert (prepared.box, prepared.size) == (cpu_box, cpu_size) == spy.boxes[-1]
                assert rng_cpu.getstate() == rng_dev.getstate()
                # the flip: the device output of the decoded image matches the CPU output, not its mirror
                img = pil_to_tensor(decode_image(data))
                out = augment_batch(
                    [img],
                    torch.tensor([prepared.box]),
                    torch.tensor([prepared.bounds]),
                    torch.tensor([prepared.flip]),
                    (cpu.shape[1], cpu.shape[2]),
                )[0]
                assert (out.float() - cpu.float()).abs().mean() < (out.flip(-1).float() - cpu.float()).abs().mean()
                checked += 1
    assert checked == 72


@pytest.mark.parametrize("make", _transforms())
def test_pixels_within_one_of_the_cpu_transform_on_the_same_decoded_image(make) -> None:
    """The batched device augment vs the CPU transform's plain path (Pillow), same image, same
    draws: every pixel within 1 (rounding), the mean difference under 0.25."""
    t = make()
    prep = DevicePrep(t)
    imgs, boxes, bounds, flips, expected = [], [], [], [], []
    for i in range(24):
        size = SIZES[i % len(SIZES)]
        data = jpeg_bytes(natural_image(*size, seed=100 + i))
        prepared = prep.prepare(data, sample_rng(3, i, f"k{i}"))
        pil = decode_image(data)
        ref = t(pil, sample_rng(3, i, f"k{i}"))
        expected.append(ref if isinstance(ref, torch.Tensor) else pil_to_tensor(ref))
        imgs.append(pil_to_tensor(pil))
        boxes.append(prepared.box)
        bounds.append(prepared.bounds)
        flips.append(prepared.flip)
    out = augment_batch(
        imgs,
        torch.tensor(boxes),
        torch.tensor(bounds),
        torch.tensor(flips),
        (48, 48),
        max_chunk_bytes=3 * 200 * 200 * 4 * 5,
    )  # several chunks
    diff = (out.int() - torch.stack(expected).int()).abs()
    assert out.shape == (24, 3, 48, 48) and out.dtype == torch.uint8
    assert int(diff.max()) <= 1
    assert float(diff.float().mean()) < 0.25
    if isinstance(t, T.Compose):
        assert any(flips) and not all(flips)


def test_jpeg_header_decides_what_goes_to_the_device() -> None:
    img = natural_image(64, 48, seed=1)
    baseline = _encoded(img, format="JPEG", quality=90)
    frame = jpeg_frame(baseline)
    assert frame is not None and (frame.sof, frame.width, frame.height, frame.components) == (0, 64, 48, 3)
    assert device_decodable(baseline, frame)
    assert device_decodable(baseline + b"\0\0", jpeg_frame(baseline + b"\0\0"))  # padding after EOI
    for other in (
        _encoded(img, format="JPEG", progressive=True),
        _encoded(img.convert("CMYK"), format="JPEG"),
        _encoded(img.convert("L"), format="JPEG"),
        _encoded(img, format="PNG"),
        baseline[:-200],
        b"junk",
    ):
        assert not device_decodable(other, jpeg_frame(other))


def _dataset_samples() -> list[list[tuple[str, dict[str, bytes]]]]:
    """Two shards of JPEGs plus one of each image the workers decode themselves."""
    shards = []
    g = 0
    for n in (13, 11):
        samples = []
        for _ in range(n):
            size = SIZES[g % 4]
            samples.append(
                (f"img{g:04d}", {"cls": str(g % 5).encode(), "jpg": jpeg_bytes(natural_image(*size, seed=g))})
            )
            g += 1
        shards.append(samples)
    img = natural_image(150, 110, seed=99)
    odd = {
        "png": {"png": _encoded(img, format="PNG")},
        "progressive": {"jpg": _encoded(img, format="JPEG", progressive=True, quality=90)},
        "cmyk": {"jpg": _encoded(img.convert("CMYK"), format="JPEG")},
        "gray": {"jpg": _encoded(img.convert("L"), format="JPEG")},
    }
    shards[1] += [(f"odd{k}", {"cls": b"1", **v}) for k, v in odd.items()]
    return shards


def _write(shards: SimpleNamespace, root: Path, samples: list) -> Path:
    return shards.write_dataset(root, samples, classes=("a", "b", "c", "d", "e"))


def _make(
    root: Path, *, device: bool, transform: object = None, on_error: str = "raise", **kw: object
) -> ShardedDataset:
    return ShardedDataset(
        root,
        batch_size=6,
        shuffle=True,
        seed=5,
        fields=("image", "cls", "__key__"),
        transform=transform or T.imagenet_train(96),
        decoding=DecodeOptions(device="cpu" if device else None, on_error=on_error),  # type: ignore[arg-type]
        **kw,
    )


def _epoch(loader: object, ds: ShardedDataset, epoch: int) -> list:
    ds.set_epoch(epoch)
    return [(x.clone(), y.clone(), list(k)) for x, y, k in loader]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: T.imagenet_train(96), id="train"),
        pytest.param(lambda: T.imagenet_eval(96, resize=110), id="eval"),
    ],
)
def test_the_pipeline_gives_the_cpu_paths_batches(tmp_path: Path, shards: SimpleNamespace, workers: int, make) -> None:
    """Same keys, labels and order as the CPU path, every sample once per epoch; pixels within 2
    of the CPU path's (the CPU decodes at reduced DCT scale only for crops >= 2x the output,
    which these are not); the images the workers decode (PNG, progressive, CMYK, gray) equal
    exactly; and they are counted."""
    root = _write(shards, tmp_path / "ds", _dataset_samples())
    cpu_ds, dev_ds = _make(root, device=False, transform=make()), _make(root, device=True, transform=make())
    with (
        make_loader(cpu_ds, num_workers=workers, device="cpu", normalize=False) as cpu,
        make_loader(dev_ds, num_workers=workers, device="cpu", normalize=False, jpeg_decoder=pil_decoder) as dev,
    ):
        for epoch in range(2):
            got, want = _epoch(dev, dev_ds, epoch), _epoch(cpu, cpu_ds, epoch)
            assert len(got) == len(want) == len(dev_ds)
            keys = [k for _, _, ks in got for k in ks]
            assert sorted(keys) == sorted({k for _, _, ks in want for k in ks}) and len(keys) == 28
            for (xd, yd, kd), (xc, yc, kc) in zip(got, want):
                assert kd == kc and torch.equal(yd, yc)
                assert xd.shape == xc.shape and xd.dtype == xc.dtype == torch.float32
                diff = (xd - xc).abs() * 255
                assert float(diff.max()) <= 2.01
                for i, k in enumerate(kd):
                    if k.startswith("odd"):
                        assert float(diff[i].max()) < 1e-4
            assert dev_ds.last_epoch_report.cpu_decoded == 4
            assert not dev_ds.last_epoch_report  # nothing skipped


def test_resume_mid_epoch_gives_the_rest_exactly(tmp_path: Path, shards: SimpleNamespace) -> None:
    root = _write(shards, tmp_path / "ds", _dataset_samples())
    ds = _make(root, device=True)
    with make_loader(ds, num_workers=2, device="cpu", jpeg_decoder=pil_decoder) as loader:
        full = _epoch(loader, ds, 1)
        ds.set_epoch(1)
        it = iter(loader)
        head = [next(it) for _ in range(2)]
        state = loader.state_dict()
        del it, head
    ds2 = _make(root, device=True)
    with make_loader(ds2, num_workers=2, device="cpu", jpeg_decoder=pil_decoder) as loader2:
        loader2.load_state_dict(state)
        rest = [(x.clone(), y.clone(), list(k)) for x, y, k in loader2]
    assert len(rest) == len(full) - 2
    for (x, y, k), (xf, yf, kf) in zip(rest, full[2:]):
        assert k == kf and torch.equal(y, yf) and torch.equal(x, xf)


def _corrupt_huffman(data: bytes) -> bytes:
    """A JPEG whose header up to the frame and EOI are intact, but whose Huffman tables are junk."""
    i = data.index(b"\xff\xc4")
    return data[: i + 5] + b"\xff" * 17 + data[i + 22 :]


def _with_bad_sample(shards: SimpleNamespace, root: Path) -> Path:
    samples = _dataset_samples()
    good = samples[0][4][1]["jpg"]
    bad = _corrupt_huffman(good)
    assert device_decodable(bad, jpeg_frame(bad))  # the workers send it to the device
    with pytest.raises(DecodeError):
        decode_image(bad)
    samples[0][4] = ("broken", {"cls": b"2", "jpg": bad})
    return _write(shards, root, samples)


def test_an_image_no_decoder_reads_raises_naming_shard_and_key(tmp_path: Path, shards: SimpleNamespace) -> None:
    root = _with_bad_sample(shards, tmp_path / "ds")
    ds = _make(root, device=True)
    with make_loader(ds, num_workers=0, device="cpu", jpeg_decoder=pil_decoder) as loader:
        with pytest.raises(SampleError, match="broken") as info:
            _epoch(loader, ds, 0)
    assert "train-000000" in str(info.value)


def test_skip_replaces_a_bad_image_and_its_label_and_counts_it(tmp_path: Path, shards: SimpleNamespace) -> None:
    root = _with_bad_sample(shards, tmp_path / "ds")
    cpu_ds, dev_ds = _make(root, device=False, on_error="skip"), _make(root, device=True, on_error="skip")
    with (
        make_loader(dev_ds, num_workers=2, device="cpu", jpeg_decoder=pil_decoder) as dev,
        make_loader(cpu_ds, num_workers=2, device="cpu") as cpu,
    ):
        got, want = _epoch(dev, dev_ds, 0), _epoch(cpu, cpu_ds, 0)
    report = dev_ds.last_epoch_report
    assert report.bad == 1 and report.entries[0][1] == "broken" and report.cpu_decoded == 4
    assert cpu_ds.last_epoch_report.bad == 1
    assert [len(k) for _, _, k in got] == [len(k) for _, _, k in want]
    for x, y, keys in got:
        if "broken" in keys:
            i = keys.index("broken")
            j = i - 1 if i > 0 else i + 1
            assert torch.equal(x[i], x[j]) and y[i] == y[j]  # the row of a neighbour, label included


def test_a_failing_batch_call_is_retried_image_by_image(tmp_path: Path, shards: SimpleNamespace) -> None:
    """A batch decoder that refuses one image fails the whole call (as nvJPEG's does); the
    others still decode on the device and that one on the CPU, counted."""
    root = _write(shards, tmp_path / "ds", _dataset_samples())
    refused = {"n": 0}

    def picky(encoded: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        if any(int(t.numel()) % 7 == 0 for t in encoded):
            refused["n"] += 1
            raise RuntimeError("nvjpeg: unsupported")
        return pil_decoder(encoded, device)

    ds, twin = _make(root, device=True), _make(root, device=True)
    with (
        make_loader(ds, num_workers=0, device="cpu", jpeg_decoder=picky) as a,
        make_loader(twin, num_workers=0, device="cpu", jpeg_decoder=pil_decoder) as b,
    ):
        got, want = _epoch(a, ds, 0), _epoch(b, twin, 0)
    jpegs = [d["jpg"] for s in _dataset_samples() for _, d in s if "jpg" in d]
    refusable = sum(1 for j in jpegs if len(j) % 7 == 0 and device_decodable(j, jpeg_frame(j)))
    assert refused["n"] > 0 and refusable > 0
    assert ds.last_epoch_report.cpu_decoded == 4 + refusable
    for (x, y, k), (xw, yw, kw) in zip(got, want):
        assert k == kw and torch.equal(y, yw) and torch.equal(x, xw)


def test_no_cuda_is_a_clear_error(tmp_path: Path, shards: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _write(shards, tmp_path / "ds", _dataset_samples()[:1])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceDecodeError, match=r"DecodeOptions\(device='cuda'\) but CUDA is not available"):
        ShardedDataset(root, batch_size=4, transform=T.imagenet_train(32), decoding=DecodeOptions(device="cuda"))


def test_no_torchvision_is_a_clear_error(
    tmp_path: Path, shards: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _write(shards, tmp_path / "ds", _dataset_samples()[:1])
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import torchvision raises ImportError
    monkeypatch.setitem(sys.modules, "torchvision.io", None)
    ds = ShardedDataset(root, batch_size=4, transform=T.imagenet_train(32), decoding=DecodeOptions(device="cpu"))
    with pytest.raises(DeviceDecodeError, match=r"torchvision.*pip install shardify\[gpu\]"):
        make_loader(ds, device="cpu")
    make_loader(ds, device="cpu", jpeg_decoder=pil_decoder).close()  # another decoder needs no torchvision


def test_transforms_the_device_cannot_run_are_refused(tmp_path: Path, shards: SimpleNamespace) -> None:
    root = _write(shards, tmp_path / "ds", _dataset_samples()[:1])
    for transform, match in (
        (T.Compose([T.RandomResizedCrop(32), T.ColorJitter(brightness=0.4)]), "ColorJitter"),
        (T.RandomHorizontalFlip(), "starts with a crop"),
        (None, "needs transform"),
    ):
        with pytest.raises(ValueError, match=match):
            ShardedDataset(root, batch_size=4, transform=transform, decoding=DecodeOptions(device="cpu"))
    ds = ShardedDataset(root, batch_size=4, transform=T.imagenet_train(32), decoding=DecodeOptions(device="cpu"))
    with pytest.raises(ValueError, match="decodes on device='cpu'"):
        make_loader(ds, device="meta", jpeg_decoder=pil_decoder)


def test_output_contract_dtype_channels_last_and_normalisation(tmp_path: Path, shards: SimpleNamespace) -> None:
    """bf16, channels_last and ImageNet normalisation as make_loader(device=...) gives the CPU path."""
    root = _write(shards, tmp_path / "ds", _dataset_samples())
    cpu_ds, dev_ds = _make(root, device=False), _make(root, device=True)
    options = {"device": "cpu", "dtype": torch.bfloat16, "channels_last": True}
    with (
        make_loader(cpu_ds, num_workers=0, **options) as cpu,
        make_loader(dev_ds, num_workers=0, jpeg_decoder=pil_decoder, **options) as dev,
    ):
        for (xd, yd, kd), (xc, yc, kc) in zip(dev, cpu, strict=True):
            assert xd.dtype == xc.dtype == torch.bfloat16 and xd.shape == xc.shape
            assert xd.is_contiguous(memory_format=torch.channels_last)
            assert kd == kc and torch.equal(yd, yc)
            assert float((xd.float() - xc.float()).abs().max()) <= 2.01 / 255 / 0.224 + 0.05  # 2 levels, bf16


def test_a_streams_own_transform_is_prepared_for_the_device(tmp_path: Path, shards: SimpleNamespace) -> None:
    from shardify.reader import Stream

    root = _write(shards, tmp_path / "ds", _dataset_samples())
    ds = ShardedDataset(
        [Stream(root, transform=T.imagenet_eval(40, resize=48))],
        batch_size=6,
        transform=T.imagenet_train(96),
        fields=("image", "cls"),
        decoding=DecodeOptions(device="cpu"),
    )
    decoded = []

    def counting(encoded: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        decoded.extend(encoded)
        return pil_decoder(encoded, device)

    with make_loader(ds, num_workers=0, jpeg_decoder=counting, normalize=False) as loader:
        shapes = {tuple(x.shape[1:]) for x, _ in loader}
    assert shapes == {(3, 40, 40)}
    assert len(decoded) == 24  # the baseline JPEGs went to the batch decoder


def test_the_header_walk_never_raises_on_a_cut_or_damaged_jpeg() -> None:
    img = natural_image(40, 30, seed=2)
    for data in (_encoded(img, format="JPEG"), _encoded(img.convert("CMYK"), format="JPEG")):  # CMYK: APP14
        sof = data.index(b"\xff\xc0")
        for cut in range(sof + 12):
            cut_data = data[:cut]
            assert not device_decodable(cut_data, jpeg_frame(cut_data))
            assert jpeg_frame(memoryview(cut_data)) == jpeg_frame(cut_data)
        for i in range(2, sof + 12):
            damaged = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :]
            jpeg_frame(damaged)  # any answer, no exception


# map=, collate_fn= and bucketing with device decode: each would see undecoded images, so each is refused.


def _tokens(s: dict) -> tuple:
    """map=: the image, a variable-length token field made from the key, the label, the key."""
    image = s["jpg"] if "jpg" in s else s["png"]
    return image, torch.arange(sum(map(ord, s["__key__"])) % 5 + 1), s["cls"], s["__key__"]


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        pytest.param({"map": _tokens}, r"map= cannot run under DecodeOptions\(device=", id="map"),
        pytest.param(
            {"batching": BatchOptions(collate_fn=pad_collate)},
            r"collate_fn=.*pad_collate.* cannot run",
            id="collate_fn",
        ),
        pytest.param(
            {"batching": BatchOptions(bucket_length=lambda out: 1, bucket_buffer=12)},
            r"bucket_length=.*cannot run",
            id="bucketing",
        ),
    ],
)
def test_what_would_see_undecoded_images_is_refused_when_the_dataset_is_made(
    tmp_path: Path, shards: SimpleNamespace, kw: dict, match: str
) -> None:
    from shardify.reader import Stream

    root = _write(shards, tmp_path / "ds", _dataset_samples()[:1])
    with pytest.raises(DeviceDecodeOptionsError, match=match):
        ShardedDataset(root, batch_size=6, transform=T.imagenet_train(96), decoding=DecodeOptions(device="cpu"), **kw)
    ShardedDataset(root, batch_size=6, transform=T.imagenet_train(96), **kw)  # the CPU path takes them
    with pytest.raises(DeviceDecodeOptionsError, match="map= cannot run"):
        ShardedDataset(
            [Stream(root, map=_tokens)],
            batch_size=6,
            transform=T.imagenet_train(96),
            decoding=DecodeOptions(device="cpu"),
        )


def test_default_collate_named_explicitly_is_the_device_paths_own(tmp_path: Path, shards: SimpleNamespace) -> None:
    root = _write(shards, tmp_path / "ds", _dataset_samples())
    ds = _make(root, device=True, batching=BatchOptions(collate_fn=default_collate))
    twin = _make(root, device=True)
    with (
        make_loader(ds, num_workers=0, device="cpu", jpeg_decoder=pil_decoder) as a,
        make_loader(twin, num_workers=0, device="cpu", jpeg_decoder=pil_decoder) as b,
    ):
        got, want = _epoch(a, ds, 0), _epoch(b, twin, 0)
    assert len(got) == len(want) == len(ds)
    for (x, y, k), (xw, yw, kw) in zip(got, want):
        assert k == kw and torch.equal(y, yw) and torch.equal(x, xw)


def test_the_worker_side_is_the_cpu_paths_batch_structure_with_encoded_images(
    tmp_path: Path, shards: SimpleNamespace
) -> None:
    """Outside make_loader, a batch is what default_collate makes on the CPU path, the image column
    an EncodedBatch naming each row's shard and key; one field gives the column itself."""
    from torch.utils.data import DataLoader

    root = _write(shards, tmp_path / "ds", _dataset_samples())
    images, labels, keys = next(iter(DataLoader(_make(root, device=True), batch_size=None)))
    assert isinstance(images, EncodedBatch) and images.keys == keys and labels.dtype == torch.int64
    assert all(s.endswith(".tar") for s in images.shards) and len(keys) == 6
    one = ShardedDataset(
        root, batch_size=6, fields="image", transform=T.imagenet_train(32), decoding=DecodeOptions(device="cpu")
    )
    assert isinstance(next(iter(DataLoader(one, batch_size=None))), EncodedBatch)


def test_leaving_an_epoch_early_ends_the_decode_thread_with_the_loader(tmp_path: Path, shards: SimpleNamespace) -> None:
    import threading

    root = _write(shards, tmp_path / "ds", _dataset_samples())
    ds = _make(root, device=True)
    with make_loader(ds, num_workers=2, device="cpu", jpeg_decoder=pil_decoder) as loader:
        for _ in loader:
            assert [t for t in threading.enumerate() if t.name.startswith("shardify-decode")]
            break
        assert not [t for t in threading.enumerate() if t.name.startswith("shardify-decode")]
        assert len(list(loader)) == len(ds)  # and the next epoch runs whole


def test_an_undecoded_batch_given_to_a_model_says_what_it_is(tmp_path: Path, shards: SimpleNamespace) -> None:
    """Iterated outside make_loader (a plain DataLoader, a framework's own loader), the batches
    hold JPEG bytes: a model or torch op given one raises naming the cause, not a shape error."""
    from torch.utils.data import DataLoader

    root = _write(shards, tmp_path / "ds", _dataset_samples())
    images, labels, keys = next(iter(DataLoader(_make(root, device=True), batch_size=None)))
    assert len(keys) == 6
    with pytest.raises(TypeError, match=r"conv2d\(\) got a batch of JPEG bytes prepared for device.*make_loader"):
        torch.nn.Conv2d(3, 4, 3)(images)
    with pytest.raises(TypeError, match=r"prepared for device decode"):
        torch.flatten(images)
