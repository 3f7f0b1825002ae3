"""``convert --raw-pixels S``: images stored pre-decoded as PPMs, deterministic, resumable,
bad images reported, recorded in the split index, readable by other tools."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from shardify.convert.options import ConvertOptions
from shardify.convert.synth import jpeg_bytes, make_imagefolder, natural_image
from shardify.convert.write.run import convert_imagefolder
from shardify.pixels import stored_size
from shardify.reader import ShardedDataset
from shardify.reader import transforms as T

CMD = [sys.executable, "-m", "shardify.convert"]


def _by_path(read_split, out: Path) -> dict[str, dict[str, bytes]]:  # noqa: ANN001
    return {json.loads(s["json"])["path"]: s for s in read_split(out, "train").values()}


def _reference(data: bytes, size: int, side: str) -> np.ndarray:
    """What the stored pixels should be, computed here with Pillow alone: decode, RGB (alpha
    dropped), torchvision's Resize rule with Pillow's bilinear."""
    img = Image.open(io.BytesIO(data))
    img.load()
    rgb = img.convert("RGBA").convert("RGB") if "A" in img.mode else img.convert("RGB")
    target = stored_size(*rgb.size, size=size, side=side)  # type: ignore[arg-type]
    return np.asarray(rgb if target == rgb.size else rgb.resize(target, Image.Resampling.BILINEAR))


@pytest.mark.parametrize("side", ["shorter", "longer"])
def test_every_image_is_stored_as_its_resized_pixels(
    tmp_path: Path, options, read_split, make_image, side: str
) -> None:
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    files = {
        "wide.jpg": make_image(size=(120, 80), seed=1),
        "tall.png": make_image("PNG", size=(50, 90), seed=2),
        "alpha.png": make_image("PNG", mode="RGBA", size=(70, 70), seed=3),
        "gray.jpg": make_image(mode="L", size=(90, 60), seed=4),
        "cmyk.jpg": make_image(mode="CMYK", size=(64, 100), seed=5),
        "small.webp": make_image("WEBP", size=(30, 20), seed=6),
    }
    for name, data in files.items():
        (src / name).write_bytes(data)
    out = tmp_path / "out"
    convert_imagefolder(src.parent, out, options=options(raw_pixels=48, raw_side=side))
    got = _by_path(read_split, out)
    assert got.keys() == {f"c/{n}" for n in files}
    for name, data in files.items():
        sample = got[f"c/{name}"]
        assert set(sample) == {"cls", "json", "ppm"}
        with Image.open(io.BytesIO(sample["ppm"])) as stored:  # any Pillow reads it
            assert (stored.format, stored.mode) == ("PPM", "RGB")
            assert np.array_equal(np.asarray(stored), _reference(data, 48, side)), name
    with Image.open(io.BytesIO(got["c/wide.jpg"]["ppm"])) as wide:
        assert wide.size == ((72, 48) if side == "shorter" else (48, 32))
    with Image.open(io.BytesIO(got["c/small.webp"]["ppm"])) as small:
        assert small.size == (30, 20)  # never enlarged
    index = json.loads((out / "train.json").read_text())["shardify"]
    assert index["fields"] == ["cls", "json", "ppm"]
    assert index["raw_pixels"] == {"format": "ppm-rgb8", "version": 1, "field": "ppm", "size": 48, "side": side}
    assert index["converter"]["options"]["raw_pixels"] == 48


def test_the_same_bytes_whatever_the_workers_and_a_new_version(
    imagefolder: Path, tmp_path: Path, options, tree_bytes
) -> None:
    convert_imagefolder(imagefolder, tmp_path / "w1", options=options(workers=1, raw_pixels=32))
    convert_imagefolder(imagefolder, tmp_path / "w2", options=options(workers=2, raw_pixels=32))
    one, two = tree_bytes(tmp_path / "w1"), tree_bytes(tmp_path / "w2")
    assert one == two and len([k for k in one if k.endswith(".tar")]) == 4
    convert_imagefolder(imagefolder, tmp_path / "plain", options=options(workers=1))
    plain = json.loads((tmp_path / "plain" / "manifest.json").read_text())["splits"]["train"]["version"]
    raw = json.loads((tmp_path / "w1" / "manifest.json").read_text())["splits"]["train"]["version"]
    assert plain != raw  # another conversion: its own file names


def test_an_interrupted_raw_conversion_resumes_byte_identical(tmp_path: Path, options, tree_bytes) -> None:
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=4, sizes=((64, 48),))
    opts = options(samples_per_shard=2, raw_pixels=40)
    convert_imagefolder(src, tmp_path / "ref", options=opts)
    out = tmp_path / "out"
    with pytest.MonkeyPatch.context() as mp:
        from shardify.convert.write import finish

        def crash(*a, **k):  # noqa: ANN002, ANN003, ANN202
            raise KeyboardInterrupt

        mp.setattr(finish, "write_report", crash)  # after every shard, before the index and manifest
        with pytest.raises(KeyboardInterrupt):
            convert_imagefolder(src, out, options=opts)
    assert not (out / "manifest.json").exists()
    result = convert_imagefolder(src, out, options=opts)
    assert result.splits["train"].reused_shards == 4
    assert tree_bytes(out) == tree_bytes(tmp_path / "ref")


def _broken_png() -> bytes:
    """A PNG whose structure is whole (the header check passes) but whose pixels do not decode."""
    buf = io.BytesIO()
    natural_image(40, 30, seed=1).save(buf, "PNG")
    data = bytearray(buf.getvalue())
    at = data.index(b"IDAT") + 30
    data[at : at + 20] = bytes(b ^ 0xFF for b in data[at : at + 20])
    return bytes(data)


def test_an_image_that_does_not_decode_is_skipped_and_reported(tmp_path: Path) -> None:
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    (src / "good.jpg").write_bytes(jpeg_bytes(natural_image(50, 40, seed=1)))
    (src / "broken.png").write_bytes(_broken_png())
    out = tmp_path / "out"
    done = subprocess.run(
        [*CMD, "convert", "imagefolder", str(src.parent), str(out), "--raw-pixels", "32", "--quiet", "--no-fsync"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 3, done.stderr  # done, some inputs skipped
    assert "c/broken.png" in done.stderr
    report = [json.loads(line) for line in (out / "train.report.jsonl").read_text().splitlines()]
    assert report == [
        {
            "kind": "skipped",
            "path": "c/broken.png",
            "reason": "cannot decode png: OSError: broken data stream when reading image file",
        }
    ]
    index = json.loads((out / "train.json").read_text())["shardify"]
    assert index["num_samples"] == 1 and index["skipped"] == {"cannot decode png": 1}
    strict = subprocess.run(
        [
            *CMD,
            "convert",
            "imagefolder",
            str(src.parent),
            str(tmp_path / "strict"),
            "--raw-pixels",
            "32",
            "--strict",
            "--quiet",
        ],
        capture_output=True,
        text=True,
    )
    assert strict.returncode == 1 and "broken.png" in strict.stderr


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        pytest.param(["--max-side", "64"], "cannot be combined", id="max-side"),
        pytest.param(["--image-format", "jpg"], "cannot be combined", id="image-format"),
        pytest.param(["--raw-pixels", "4"], "raw_pixels=4 should be an int >= 8", id="too-small"),
    ],
)
def test_conflicting_or_bad_options_are_usage_errors(tmp_path: Path, extra: list[str], match: str) -> None:
    src = make_imagefolder(tmp_path / "src", classes=1, per_class=1, sizes=((32, 32),))
    args = ["--raw-pixels", "64", *extra] if extra[0] != "--raw-pixels" else extra
    done = subprocess.run(
        [*CMD, "convert", "imagefolder", str(src), str(tmp_path / "out"), *args, "--quiet"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and match in done.stderr, done.stderr


def test_shards_follow_the_size_bound_by_the_stored_size(tmp_path: Path) -> None:
    """Planning sizes raw images by an estimate of what is stored, not by the JPEG's bytes
    (several times smaller here), so shards stay near --shard-size."""
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=8, sizes=((96, 64),))
    out = tmp_path / "out"
    bound = 60_000
    options = ConvertOptions(
        workers=1, progress=False, fsync=False, samples_per_shard=None, shard_size=bound, min_shards=1, raw_pixels=64
    )
    convert_imagefolder(src, out, options=options)
    shards = json.loads((out / "train.json").read_text())["shardlist"]
    stored = 96 * 64 * 3
    jpeg = max(p.stat().st_size for p in src.rglob("*.JPEG"))
    assert stored > 2 * jpeg  # the estimate matters here
    assert all(s["filesize"] <= 1.1 * bound for s in shards), [s["filesize"] for s in shards]
    assert sum(s["nsamples"] for s in shards) == 16 and len(shards) >= 16 * stored // bound


def test_the_eval_crop_of_a_raw_split_is_torchvisions_resize_then_centre_crop(tmp_path: Path, options) -> None:
    """Stored at S on the shorter side and read with ResizeCenterCrop(resize=S): torchvision's
    Resize(S) + CenterCrop of the original, computed here with Pillow, exactly."""
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=3, sizes=((120, 90), (90, 130)))
    out = tmp_path / "out"
    convert_imagefolder(src, out, options=options(raw_pixels=64, shuffle=False))
    ds = ShardedDataset(out, batch_size=1, transform=T.imagenet_eval(56, resize=64), fields=("image", "json"))
    seen = 0
    for x, meta in ds:
        original = Image.open(src / meta["path"][0]).convert("RGB")
        w, h = original.size
        size = (64, int(64 * h / w)) if w <= h else (int(64 * w / h), 64)
        resized = original.resize(size, Image.Resampling.BILINEAR)
        top, left = int(round((size[1] - 56) / 2.0)), int(round((size[0] - 56) / 2.0))
        want = np.asarray(resized.crop((left, top, left + 56, top + 56)))
        assert torch.equal(x[0].permute(1, 2, 0), torch.from_numpy(want.copy()))
        seen += 1
    assert seen == 6


def test_webdataset_reads_the_raw_images_as_images(imagefolder: Path, tmp_path: Path, options) -> None:
    wds = pytest.importorskip("webdataset")
    out = tmp_path / "out"
    convert_imagefolder(imagefolder, out, options=options(raw_pixels=32))
    urls = [str(out / s["url"]) for s in json.loads((out / "train.json").read_text())["shardlist"]]
    got = {
        s["__key__"]: s
        for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        .decode("rgb8")
        .to_tuple("__key__", "ppm", "cls")
        .map(lambda t: {"__key__": t[0], "ppm": t[1], "cls": t[2]})
    }
    assert len(got) == 10
    ds = ShardedDataset(out, batch_size=1, fields=("image", "__key__"), transform=None)
    for x, key in ds:
        assert np.array_equal(got[key[0]]["ppm"], x[0].permute(1, 2, 0).numpy())


def test_the_python_writer_stores_images_in_a_ppm_field_as_raw_pixels(tmp_path: Path, read_split) -> None:
    from shardify.convert import ShardWriter
    from shardify.reader.sample import transforms as transforms_module

    rgb = np.asarray(natural_image(50, 40, seed=1))
    rgba = np.concatenate([rgb, np.full((40, 50, 1), 7, np.uint8)], axis=2)
    with ShardWriter(tmp_path / "out", split="train") as w:
        w.write({"ppm": rgb, "cls": 0})
        w.write({"ppm": Image.fromarray(rgba), "cls": 1})
        w.write({"ppm": rgb[:, :, 0], "cls": 2})  # gray: stored as RGB
    ds = ShardedDataset(tmp_path / "out", batch_size=3, transform=None)
    ((x, y),) = list(ds)
    assert torch.equal(x[0].permute(1, 2, 0), torch.from_numpy(rgb.copy()))
    assert torch.equal(x[1].permute(1, 2, 0), torch.from_numpy(rgb.copy()))  # alpha dropped
    assert torch.equal(x[2].permute(1, 2, 0), torch.from_numpy(np.repeat(rgb[:, :, :1], 3, axis=2)))
    stored = [s["ppm"] for s in read_split(tmp_path / "out", "train").values()]
    assert len(stored) == 3 and all(b.startswith(b"P6\n50 40\n255\n") for b in stored)  # RGB, viewable
    assert all(transforms_module.raw_pixels(b) is not None for b in stored)
    assert encode_ppm_of(rgb) == stored[0]


def encode_ppm_of(array: np.ndarray) -> bytes:
    from shardify.convert.pyapi.values import ValueOptions, encode_value

    return encode_value("ppm", array, ValueOptions())
