"""``DecodeOptions(decoder="nvimgcodec")`` and the hybrid split, on the CPU with stand-in decoders.

The stand-ins take the place of nvImageCodec's backends (``ImageDecoder``: a batch's bytes and
regions in, per image the region's pixels or None out), so the fallback chain, the counts by
kind, the region decode and the pixels are checked here; nvImageCodec itself runs in
``tests/gpu/``. The wrapper of nvImageCodec is checked against a fake module with its API.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from shardify.convert.synth import jpeg_bytes, natural_image
from shardify.errors import DeviceDecodeError, SampleError
from shardify.reader import DecodeOptions, ShardedDataset, make_loader
from shardify.reader import transforms as T
from shardify.reader.sample import image_decoders
from shardify.reader.sample.codec_decode import CodecDecoder
from shardify.reader.sample.decode import decode_image, pil_to_tensor
from shardify.reader.sample.decoders import NvImageCodecDecoding
from shardify.reader.sample.device_augment import augment_batch
from shardify.reader.sample.device_decode import DeviceDecoder, pil_decoder
from shardify.reader.sample.image_decoders import NvImageCodecDecoder, PillowDecoder, Region, cut
from shardify.reader.sample.prepared import EncodedBatch

SIZES = ((160, 120), (120, 160), (97, 131), (200, 150))


class StandIn:
    """A decoder of kind ``kind`` that refuses the images ``refuse(bytes)`` says (None), raises on a
    call holding one ``fail(bytes)`` says, and records the regions it was asked for."""

    def __init__(
        self,
        kind: str,
        refuse: Callable[[bytes], bool] = lambda b: False,
        fail: Callable[[bytes], bool] = lambda b: False,
    ) -> None:
        self.kind, self.refuse, self.fail = kind, refuse, fail
        self.regions: list[Region | None] = []
        self.calls = 0

    def decode(
        self, encoded: Sequence[torch.Tensor], regions: Sequence[Region | None], device: torch.device
    ) -> list[torch.Tensor | None]:
        self.calls += 1
        data = [t.numpy().tobytes() for t in encoded]
        if any(self.fail(b) for b in data):
            raise RuntimeError(f"{self.kind}: this batch cannot run here")
        out: list[torch.Tensor | None] = []
        for b, region in zip(data, regions):
            self.regions.append(region)
            out.append(None if self.refuse(b) else cut(pil_to_tensor(decode_image(b)), region).to(device))
        return out


def _encoded(img: Image.Image, **save: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, **save)
    return buf.getvalue()


def _samples() -> list[list[tuple[str, dict[str, bytes]]]]:
    """Two shards of JPEGs, plus a PNG, a CMYK and a gray JPEG the workers decode themselves."""
    shards, g = [], 0
    for n in (13, 11):
        shards.append(
            [
                (
                    f"img{g + i:04d}",
                    {
                        "cls": str((g + i) % 5).encode(),
                        "jpg": jpeg_bytes(natural_image(*SIZES[(g + i) % 4], seed=g + i)),
                    },
                )
                for i in range(n)
            ]
        )
        g += n
    img = natural_image(150, 110, seed=99)
    odd = {"png": {"png": _encoded(img, format="PNG")}, "cmyk": {"jpg": _encoded(img.convert("CMYK"), format="JPEG")}}
    odd["gray"] = {"jpg": _encoded(img.convert("L"), format="JPEG")}
    shards[1] += [(f"odd{k}", {"cls": b"1", **v}) for k, v in odd.items()]
    return shards


def _make(root: Path, *, decoder: str | None, share: float | str | None = None, **kw: object) -> ShardedDataset:
    device = None if decoder is None else "cpu"
    return ShardedDataset(
        root,
        batch_size=6,
        shuffle=True,
        seed=5,
        fields=("image", "cls", "__key__"),
        transform=kw.pop("transform", None)
        or T.imagenet_train(96),  # crops under 2x the output: no reduced-scale decode on the CPU path
        decoding=DecodeOptions(
            device=device,
            decoder=decoder or "torchvision",  # type: ignore[arg-type]
            worker_share=share,  # type: ignore[arg-type]
            on_error=kw.pop("on_error", "raise"),  # type: ignore[arg-type]
        ),
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
def root(tmp_path: Path, shards: SimpleNamespace) -> Path:
    return shards.write_dataset(tmp_path / "ds", _samples(), classes=("a", "b", "c", "d", "e"))


def _epoch(loader: object, ds: ShardedDataset, epoch: int) -> list:
    ds.set_epoch(epoch)
    return [(x.clone(), y.clone(), list(k)) for x, y, k in loader]  # type: ignore[attr-defined]


def _first_batch(ds: ShardedDataset) -> EncodedBatch:
    images, _, _ = next(iter(DataLoader(ds, batch_size=None)))
    assert isinstance(images, EncodedBatch)
    return images


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: T.imagenet_train(48), id="train"),
        pytest.param(lambda: T.imagenet_eval(48, resize=56), id="eval"),
    ],
)
def test_decoding_only_the_region_gives_the_whole_images_output(root: Path, make: Callable[[], object]) -> None:
    """The stage asks for each crop's region (smaller than the image for a RandomResizedCrop) and its
    output equals, bit for bit, the torchvision path's on whole images."""
    ds = _make(root, decoder="nvimgcodec", transform=make())
    for batch in list(DataLoader(ds, batch_size=None))[:3]:
        images = batch[0]
        whole, _ = DeviceDecoder("cpu", jpeg_decoder=pil_decoder)(images)
        standin = StandIn("hardware")
        got, order = CodecDecoder("cpu", decoders=[standin])(images)
        assert order is None and torch.equal(got, whole)
        offsets = images.offsets.tolist()
        sizes = [
            Image.open(io.BytesIO(images.data[a:b].numpy().tobytes())).size
            for a, b in zip(offsets, offsets[1:])
            if b > a
        ]
        assert all(r is not None for r in standin.regions) and len(standin.regions) == len(sizes)
        areas = [(r[2] - r[0]) * (r[3] - r[1]) for r in standin.regions if r is not None]
        if isinstance(ds.options.transform, T.Compose):  # RandomResizedCrop: the region is about the crop
            assert sum(areas) < sum(w * h for w, h in sizes)


def test_float16_products_keep_every_pixel_within_one() -> None:
    imgs = [pil_to_tensor(decode_image(jpeg_bytes(natural_image(*SIZES[i % 4], seed=i)))) for i in range(12)]
    boxes = torch.tensor([[3.0, 5.0, 90.0, 80.0]] * 12)
    flips = torch.tensor([i % 2 == 0 for i in range(12)])
    full = augment_batch(imgs, boxes, boxes, flips, (40, 40))
    half = augment_batch(imgs, boxes, boxes, flips, (40, 40), dtype=torch.float16)
    assert int((full.int() - half.int()).abs().max()) <= 1


def test_each_image_falls_back_alone_and_is_counted_by_kind(root: Path) -> None:
    """The hardware stand-in refuses some images, the CUDA one fails whole calls holding some others:
    every image still decodes (the last ones with Pillow), nothing else of the batch is lost, the
    pixels are those of an all-Pillow run, and each image is counted once under its kind."""
    hardware = StandIn("hardware", refuse=lambda b: len(b) % 3 == 0)
    cuda = StandIn("cuda", fail=lambda b: len(b) % 2 == 0)
    ds, twin = _make(root, decoder="nvimgcodec"), _make(root, decoder="nvimgcodec")
    with (
        make_loader(ds, num_workers=0, device="cpu", jpeg_decoder=[hardware, cuda, PillowDecoder()]) as a,
        make_loader(twin, num_workers=0, device="cpu", jpeg_decoder=PillowDecoder()) as b,
    ):
        got, want = _epoch(a, ds, 0), _epoch(b, twin, 0)
    for (x, y, k), (xw, yw, kw) in zip(got, want, strict=True):
        assert k == kw and torch.equal(y, yw) and torch.equal(x, xw)
    counts = ds.decode_strategy.tally.read()  # type: ignore[union-attr]
    assert counts["hardware"] > 0 and counts["cpu"] > 0 and cuda.calls > 0
    assert counts["hardware"] + counts.get("cuda", 0) + counts["cpu"] == 24  # the baseline JPEGs
    assert counts["workers"] == 3  # the PNG, the CMYK and the gray JPEG
    assert ds.last_epoch_report.cpu_decoded == counts["cpu"] + 3
    assert twin.decode_strategy.tally.read() == {"cpu": 24, "workers": 3}  # type: ignore[union-attr]
    assert twin.last_epoch_report.decoded_by == (("cpu", 24), ("workers", 3))
    assert "decoded by cpu 24, workers 3" in str(twin.last_epoch_report)


@pytest.mark.parametrize("workers", [0, 2])
def test_the_pipeline_gives_the_cpu_paths_batches_and_resumes(root: Path, workers: int) -> None:
    cpu_ds, dev_ds = _make(root, decoder=None), _make(root, decoder="nvimgcodec")
    chain = [StandIn("hardware", refuse=lambda b: len(b) % 2 == 0), PillowDecoder()]
    with (
        make_loader(cpu_ds, num_workers=workers, device="cpu", normalize=False) as cpu,
        make_loader(dev_ds, num_workers=workers, device="cpu", normalize=False, jpeg_decoder=chain) as dev,
    ):
        got, want = _epoch(dev, dev_ds, 1), _epoch(cpu, cpu_ds, 1)
        assert len(got) == len(want) == len(dev_ds)
        assert sorted(k for _, _, ks in got for k in ks) == sorted(k for _, _, ks in want for k in ks)
        for (xd, yd, kd), (xc, yc, kc) in zip(got, want):
            assert kd == kc and torch.equal(yd, yc)
            assert float(((xd - xc).abs() * 255).max()) <= 2.01
        dev_ds.set_epoch(1)
        it = iter(dev)
        next(it), next(it)
        state = dev.state_dict()
        del it
    again = _make(root, decoder="nvimgcodec")
    with make_loader(again, num_workers=workers, device="cpu", normalize=False, jpeg_decoder=chain) as loader:
        loader.load_state_dict(state)
        rest = [(x.clone(), y.clone(), list(k)) for x, y, k in loader]
    assert [k for _, _, k in rest] == [k for _, _, k in got[2:]]
    assert all(torch.equal(x, xf) for (x, _, _), (xf, _, _) in zip(rest, got[2:]))


def _with_broken(shards: SimpleNamespace, root: Path) -> Path:
    samples = _samples()
    good = samples[0][4][1]["jpg"]
    i = good.index(b"\xff\xc4")
    samples[0][4] = ("broken", {"cls": b"2", "jpg": good[: i + 5] + b"\xff" * 17 + good[i + 22 :]})
    return shards.write_dataset(root, samples, classes=("a", "b", "c", "d", "e"))


def test_an_image_no_decoder_reads_follows_on_error(tmp_path: Path, shards: SimpleNamespace) -> None:
    root = _with_broken(shards, tmp_path / "ds")
    ds = _make(root, decoder="nvimgcodec")
    with make_loader(ds, num_workers=0, device="cpu", jpeg_decoder=[StandIn("hardware"), PillowDecoder()]) as loader:
        with pytest.raises(
            SampleError, match=r"broken.*no decoder \(hardware, cpu\)|no decoder \(hardware, cpu\).*broken"
        ):
            _epoch(loader, ds, 0)
    skip = _make(root, decoder="nvimgcodec", on_error="skip")
    with make_loader(skip, num_workers=0, device="cpu", jpeg_decoder=PillowDecoder()) as loader:
        batches = _epoch(loader, skip, 0)
    assert sum(len(k) for _, _, k in batches) == 27
    assert skip.last_epoch_report.bad == 1 and skip.decode_strategy.tally.read()["bad"] == 1  # type: ignore[union-attr]


@pytest.mark.parametrize("share", [0.5, 1.0, "auto"])
@pytest.mark.parametrize("decoder", ["nvimgcodec", "torchvision"])
def test_the_hybrid_split_keeps_every_sample_once_with_the_cpu_paths_crops(
    root: Path, share: float | str, decoder: str
) -> None:
    """With a share decoded by the workers, the batches hold the CPU path's keys, labels and crops
    (pixels within 2; the rows the workers decoded are the CPU path's exactly), and the share is counted."""
    cpu_ds, hyb = _make(root, decoder=None), _make(root, decoder=decoder, share=share)
    jpeg = StandIn("hardware") if decoder == "nvimgcodec" else pil_decoder
    with (
        make_loader(cpu_ds, num_workers=2, device="cpu", normalize=False) as cpu,
        make_loader(hyb, num_workers=2, device="cpu", normalize=False, jpeg_decoder=jpeg) as dev,
    ):
        got, want = _epoch(dev, hyb, 0), _epoch(cpu, cpu_ds, 0)
        if share == "auto":  # a second epoch: each worker has timed more than FLUSH images
            assert len(_epoch(dev, hyb, 1)) == len(hyb)
    exact = 0
    for (xd, yd, kd), (xc, yc, kc) in zip(got, want, strict=True):
        assert kd == kc and torch.equal(yd, yc)
        diff = ((xd - xc).abs() * 255).flatten(1).amax(1)
        assert float(diff.max()) <= 2.01
        exact += int((diff < 1e-4).sum())
    shared = hyb.decode_strategy.tally.read().get("worker_share", 0) if share != "auto" else 0  # type: ignore[union-attr]
    assert exact >= shared + 3  # the shared rows and the three the device cannot take
    if share == 1.0:
        assert shared == 24
    elif share == 0.5:
        assert abs(shared - 12) <= 2  # each worker to within one
    assert hyb.last_epoch_report.cpu_decoded == 3  # the share is not a fallback
    if share == "auto":  # the workers timed both kinds of work where the controller reads them
        sums, workers = hyb.decode_strategy.split.totals()  # type: ignore[union-attr]
        assert workers == 2 and sums[1] > 0 and sums[3] > 0 and sums[0] > 0 and sums[2] > 0


def test_spawned_workers_read_the_share_the_main_process_sets(root: Path) -> None:
    """The split is made with the dataset, before the workers: spawned persistent workers see a share
    set later in the main process (as the controller sets it) from their next image on. (Without
    the next epoch's first batches made ahead, which the workers make before the share changes.)"""
    ds = _make(root, decoder="nvimgcodec", share=0.0)
    with make_loader(
        ds,
        num_workers=2,
        device="cpu",
        multiprocessing_context="spawn",
        jpeg_decoder=StandIn("hardware"),
        epoch_ahead=False,
    ) as loader:
        assert len(_epoch(loader, ds, 0)) == len(ds)
        assert ds.decode_strategy.tally.read().get("worker_share", 0) == 0  # type: ignore[union-attr]
        ds.decode_strategy.split.set_share(1.0)  # type: ignore[union-attr]
        assert len(_epoch(loader, ds, 1)) == len(ds)
        assert ds.decode_strategy.tally.read()["worker_share"] == 24  # type: ignore[union-attr]


def test_a_missing_nvimgcodec_is_a_clear_error(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nvidia", None)
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)
    ds = _make(root, decoder="nvimgcodec")
    assert isinstance(ds.decode_strategy, NvImageCodecDecoding)
    with pytest.raises(DeviceDecodeError, match=r"nvimgcodec.*pip install shardify\[gpu\]"):
        make_loader(ds, device="cpu")
    make_loader(ds, device="cpu", jpeg_decoder=PillowDecoder()).close()  # a given decoder needs no nvImageCodec


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(worker_share=0.5), "needs device"),
        (dict(device="cpu", worker_share=1.5), r"in \[0, 1\]"),
        (dict(device="cpu", worker_share="half"), r"in \[0, 1\]"),
        (dict(device="cpu", worker_share=True), r"in \[0, 1\]"),
        (dict(decoder="nvimgcodec"), "needs device"),
        (dict(device="cpu", decoder="nvjpeg"), "'torchvision' or 'nvimgcodec'"),
    ],
)
def test_options_are_checked(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DecodeOptions(**kw)


class _FakeNv:
    """nvImageCodec's Python API as the wrapper uses it, decoding with Pillow into HWC arrays;
    ``regions`` False: a backend that returns nothing for a source with a region."""

    regions = True
    refuse_all = False
    no_hardware = False
    ignore_regions = False
    calls = 0
    BackendKind = SimpleNamespace(HW_GPU_ONLY="hw", GPU_ONLY="gpu")
    ColorSpec = SimpleNamespace(RGB="rgb")

    class DecodeParams:
        def __init__(self, **kw: object) -> None:
            assert kw == {"apply_exif_orientation": False, "color_spec": "rgb"}

    class Region:
        def __init__(self, *yx: int) -> None:
            self.yx = yx

    class DecodeSource:
        def __init__(self, data: np.ndarray, region: object = None) -> None:
            self.data, self.region = data, region

    class Decoder:
        def __init__(self, *, device_id: int, backend_kinds: list, options: str) -> None:
            if backend_kinds == ["hw"] and _FakeNv.no_hardware:
                raise RuntimeError("nvImageCodec: no decoder for the backend")
            self.kinds = backend_kinds

        def decode(self, sources: list, *, params: object, cuda_stream: int) -> list:
            _FakeNv.calls += 1
            if _FakeNv.refuse_all:
                return [None] * len(sources)
            out = []
            for s in sources:
                if s.region is not None and not _FakeNv.regions:
                    out.append(None)
                    continue
                hwc = np.array(decode_image(s.data.tobytes()))
                if s.region is not None and not _FakeNv.ignore_regions:
                    y0, x0, y1, x1 = s.region.yx
                    hwc = hwc[y0:y1, x0:x1]
                out.append(hwc)
            return out


@pytest.mark.parametrize(("regions", "ignored"), [(True, False), (False, False), (True, True)])
def test_the_nvimgcodec_wrapper_asks_for_regions_and_copes_without(
    root: Path, monkeypatch: pytest.MonkeyPatch, regions: bool, ignored: bool
) -> None:
    """A backend that takes regions, one that refuses them, one that decodes the whole image anyway:
    the same pixels from each."""
    monkeypatch.setattr(_FakeNv, "regions", regions)
    monkeypatch.setattr(_FakeNv, "ignore_regions", ignored)
    monkeypatch.setattr(image_decoders, "_nvimgcodec", lambda: _FakeNv)
    images = _first_batch(_make(root, decoder="nvimgcodec"))
    hardware = NvImageCodecDecoder("hardware", torch.device("cpu"))
    got, _ = CodecDecoder("cpu", decoders=[hardware])(images)
    want, _ = DeviceDecoder("cpu", jpeg_decoder=pil_decoder)(images)
    assert torch.equal(got, want)
    assert hardware.regions is regions  # told apart once: then whole images, cut on the device


def test_a_backend_that_decodes_nothing_is_not_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU without hardware JPEG engines: after a few full batches of which its hardware backend
    decoded nothing, it is no longer called (each call with regions costs two)."""
    monkeypatch.setattr(_FakeNv, "refuse_all", True)
    monkeypatch.setattr(_FakeNv, "calls", 0)
    monkeypatch.setattr(image_decoders, "_nvimgcodec", lambda: _FakeNv)
    hardware = NvImageCodecDecoder("hardware", torch.device("cpu"))
    encoded = [
        torch.frombuffer(bytearray(jpeg_bytes(natural_image(40, 30, seed=i))), dtype=torch.uint8) for i in range(8)
    ]
    regions: list[Region | None] = [(0, 0, 20, 20)] * 8
    for _ in range(6):
        assert hardware.decode(encoded, regions, torch.device("cpu")) == [None] * 8
    assert _FakeNv.calls == 2 * image_decoders.IDLE_LIMIT  # with regions, then without, then no more
    small = NvImageCodecDecoder("hardware", torch.device("cpu"))
    for _ in range(6):  # batches under IDLE_BATCH images prove nothing
        small.decode(encoded[:2], regions[:2], torch.device("cpu"))
    assert small.idle == 0


def test_a_gpu_without_hardware_engines_decodes_with_the_rest_of_the_chain(
    root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_FakeNv, "no_hardware", True)
    monkeypatch.setattr(image_decoders, "_nvimgcodec", lambda: _FakeNv)
    chain = image_decoders.nvimgcodec_decoders(torch.device("cpu"))
    assert [d.kind for d in chain] == ["cuda", "cpu"]
    assert "hardware backend cannot run" in caplog.text
    ds = _make(root, decoder="nvimgcodec")
    with make_loader(ds, num_workers=0, device="cpu") as loader:  # the default chain, made by the strategy
        assert sum(len(k) for _, _, k in loader) == 27
    assert ds.decode_strategy.tally.read() == {"cuda": 24, "workers": 3}  # type: ignore[union-attr]


def test_forked_workers_claim_their_own_rows_after_the_main_process_read(root: Path) -> None:
    """An epoch read in-process first (the split's state is the main process's), then fork workers:
    each times its images in its own row, so the controller sees two workers."""
    ds = _make(root, decoder="nvimgcodec", share="auto")
    with make_loader(ds, num_workers=0, device="cpu", jpeg_decoder=StandIn("hardware")) as loader:
        assert len(_epoch(loader, ds, 0)) == len(ds)
    with make_loader(ds, num_workers=2, device="cpu", jpeg_decoder=StandIn("hardware")) as loader:
        for epoch in (1, 2):
            assert len(_epoch(loader, ds, epoch)) == len(ds)
    _, workers = ds.decode_strategy.split.totals()  # type: ignore[union-attr]
    assert workers == 2
