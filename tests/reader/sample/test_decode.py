"""Decoding by extension: every image mode to RGB, the other decoders, pickle refused."""

from __future__ import annotations

import io
import json
import pickle
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from shardify.npy import encode_tensor
from shardify.reader.sample.decode import (
    IMAGE_EXTS,
    PICKLE_EXTS,
    DecodeError,
    PickleRefusedError,
    decode_field,
    decode_image,
    decode_sample,
)


def encode(img: Image.Image, fmt: str, **options: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **options)
    return buf.getvalue()


def png_16bit_rgb(pixels: np.ndarray) -> bytes:
    """A 48-bit RGB PNG written by hand (Pillow cannot write one)."""
    h, w, _ = pixels.shape

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    raw = b"".join(b"\x00" + pixels[y].astype(">u2").tobytes() for y in range(h))
    header = struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def rgb_at(img: Image.Image, xy: tuple[int, int] = (0, 0)) -> tuple[int, int, int]:
    assert img.mode == "RGB"
    return img.getpixel(xy)


def palette_image() -> Image.Image:
    p = Image.new("P", (5, 4), 1)
    p.putpalette([0, 0, 0, 200, 10, 20] + [0, 0, 0] * 254)
    return p


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(encode(Image.new("RGB", (5, 4), (10, 200, 30)), "PNG"), (10, 200, 30), id="rgb-png"),
        pytest.param(encode(Image.new("L", (5, 4), 77), "PNG"), (77, 77, 77), id="L-png"),
        pytest.param(encode(Image.new("LA", (5, 4), (90, 0)), "PNG"), (90, 90, 90), id="LA-png-alpha-dropped"),
        pytest.param(encode(Image.new("RGBA", (5, 4), (1, 2, 3, 0)), "PNG"), (1, 2, 3), id="rgba-png-alpha-dropped"),
        pytest.param(encode(palette_image(), "PNG", transparency=b"\x00\x80"), (200, 10, 20), id="P-trns-bytes"),
        pytest.param(encode(palette_image(), "PNG", transparency=1), (200, 10, 20), id="P-trns-index"),
        pytest.param(encode(palette_image(), "GIF", transparency=1), (200, 10, 20), id="P-gif"),
        pytest.param(encode(Image.new("1", (5, 4), 1), "PNG"), (255, 255, 255), id="1bit-png"),
        pytest.param(encode(Image.new("1", (5, 4), 1), "PPM"), (255, 255, 255), id="pbm"),
        pytest.param(encode(Image.new("L", (5, 4), 33), "PPM"), (33, 33, 33), id="pgm"),
        pytest.param(encode(Image.new("RGB", (5, 4), (7, 8, 9)), "PPM"), (7, 8, 9), id="ppm"),
        pytest.param(encode(Image.new("RGB", (5, 4), (7, 8, 9)), "BMP"), (7, 8, 9), id="bmp"),
        pytest.param(encode(Image.new("RGB", (5, 4), (7, 8, 9)), "TIFF"), (7, 8, 9), id="tiff"),
        pytest.param(encode(Image.new("RGB", (5, 4), (7, 8, 9)), "WEBP", lossless=True), (7, 8, 9), id="webp"),
        pytest.param(encode(Image.new("I;16", (5, 4), 65535), "PNG"), (255, 255, 255), id="16bit-png-max"),
        pytest.param(encode(Image.new("I;16", (5, 4), 32768), "PNG"), (128, 128, 128), id="16bit-png-mid"),
        pytest.param(encode(Image.new("I;16", (5, 4), 257 * 40), "TIFF"), (40, 40, 40), id="16bit-tiff"),
        pytest.param(encode(Image.new("I", (5, 4), 257 * 50), "TIFF"), (50, 50, 50), id="32bit-int-tiff"),
        pytest.param(encode(Image.new("F", (5, 4), 0.5), "TIFF"), (128, 128, 128), id="float-tiff"),
        pytest.param(png_16bit_rgb(np.full((4, 5, 3), (65535, 256 * 100, 0))), (255, 100, 0), id="48bit-rgb-png"),
    ],
)
def test_decode_image_gives_rgb_for_every_mode(data: bytes, expected: tuple[int, int, int]) -> None:
    img = decode_image(data)
    assert img.size == (5, 4)
    assert rgb_at(img) == expected


def test_cmyk_jpeg_becomes_rgb() -> None:
    img = decode_image(encode(Image.new("CMYK", (16, 16), (0, 255, 255, 0)), "JPEG", quality=95))
    r, g, b = rgb_at(img, (8, 8))
    assert r > 240 and g < 15 and b < 15  # pure red


def test_sixteen_bit_is_scaled_not_clipped() -> None:
    values = np.array([[0, 257, 1000, 30000, 65535]], dtype=np.uint16)
    img = decode_image(encode(Image.fromarray(values), "PNG"))
    got = np.asarray(img)[0, :, 0]
    assert got.tolist() == np.round(values[0] / 257).astype(int).tolist()


def test_multi_frame_gives_the_first_frame() -> None:
    frames = [Image.new("RGB", (6, 6), c) for c in [(255, 0, 0), (0, 0, 255)]]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:])
    assert rgb_at(decode_image(buf.getvalue())) == (255, 0, 0)


def test_exif_orientation_is_not_applied() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 on display
    data = encode(Image.new("RGB", (40, 20), (50, 60, 70)), "JPEG", exif=exif)
    assert decode_image(data).size == (40, 20)


@pytest.mark.parametrize(
    "data",
    [b"", b"not an image at all", encode(Image.new("RGB", (64, 64), (1, 2, 3)), "JPEG")[:300]],
    ids=["empty", "garbage", "truncated-jpeg"],
)
def test_bad_image_bytes_raise_value_error(data: bytes) -> None:
    with pytest.raises(ValueError, match="cannot decode image"):
        decode_image(data)


def test_decode_field_dispatch() -> None:
    assert decode_field("cls", b" 7\n") == 7
    assert decode_field("json", json.dumps({"a": [1, 2]}).encode()) == {"a": [1, 2]}
    assert decode_field("txt", "héllo".encode()) == "héllo"
    assert decode_field("text", b"x") == "x"
    assert decode_field("bin", b"\x00\x01") == b"\x00\x01"
    assert decode_field("seg.png", encode(Image.new("L", (2, 2), 9), "PNG")).mode == "RGB"
    assert decode_field("JPG", encode(Image.new("RGB", (2, 2)), "JPEG")).size == (2, 2)
    assert {"jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm", "pgm", "pbm"} == IMAGE_EXTS
    assert {"pyd", "pickle", "pkl"} == PICKLE_EXTS


def test_decode_npy() -> None:
    arr = np.arange(12, dtype=np.int16).reshape(3, 4)
    buf = io.BytesIO()
    np.save(buf, arr)
    out = decode_field("npy", buf.getvalue())
    assert isinstance(out, np.ndarray) and out.dtype == np.int16 and np.array_equal(out, arr)


def test_npy_object_array_is_refused() -> None:
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DecodeError, match="'npy'.*allow_pickle=False"):
        decode_field("npy", buf.getvalue())
    assert decode_field("npy", buf.getvalue(), allow_pickle=True)[0] == {"a": 1}


@pytest.mark.parametrize(
    "tensor",
    [
        pytest.param(torch.randn(3, 32, 32), id="float32"),
        pytest.param(torch.arange(-5, 5, dtype=torch.int64).reshape(2, 5), id="int64"),
        pytest.param(torch.tensor([1.5, -0.25, float("nan")], dtype=torch.bfloat16), id="bfloat16"),
        pytest.param(torch.tensor([0.5, 2.0], dtype=torch.float16), id="float16"),
        pytest.param(torch.tensor(3), id="0-d"),
    ],
)
def test_npy_written_by_shardify_decodes_to_the_same_tensor(tensor: torch.Tensor) -> None:
    """numpy dtypes come back as numpy arrays, torch-only dtypes (raw views) as tensors; bits exact."""
    out = decode_field("npy", encode_tensor(tensor))
    back = out if isinstance(out, torch.Tensor) else torch.from_numpy(out)
    assert isinstance(out, torch.Tensor) == (tensor.dtype == torch.bfloat16)
    assert back.dtype == tensor.dtype and back.shape == tensor.shape
    assert torch.equal(back.reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8))


def test_npy_from_numpy_in_any_byte_order_or_version_decodes_native_and_writable() -> None:
    arr = np.arange(24, dtype=">f8").reshape(2, 3, 4)
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asfortranarray(arr), version=(2, 0))
    out = decode_field("npy", buf.getvalue())
    assert out.dtype == np.float64 and out.dtype.isnative and out.flags.writeable and np.array_equal(out, arr)
    torch.from_numpy(out)  # no copy, no warning: native order, writable


def test_decode_pt_tensors() -> None:
    buf = io.BytesIO()
    torch.save({"x": torch.arange(3), "y": [torch.ones(2)]}, buf)
    out = decode_field("pt", buf.getvalue())
    assert torch.equal(out["x"], torch.arange(3)) and torch.equal(out["y"][0], torch.ones(2))
    assert isinstance(decode_field("pth", buf.getvalue()), dict)


class Malicious:
    """Unpickling this creates a file: proof that code ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (open, (str(self.path), "w"))


@pytest.mark.parametrize("ext", sorted(PICKLE_EXTS))
def test_pickle_is_refused_and_never_runs(tmp_path: Path, ext: str) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps(Malicious(marker))
    with pytest.raises(PickleRefusedError, match="allow_pickle=True") as info:
        decode_field(ext, payload)
    assert isinstance(info.value, ValueError)
    assert not marker.exists()
    with pytest.raises(PickleRefusedError):
        decode_sample({"__key__": "k", ext: payload})
    assert not marker.exists()


def test_pickle_loads_only_when_allowed_by_name() -> None:
    assert decode_field("pkl", pickle.dumps({"a": 1}), allow_pickle=True) == {"a": 1}


def test_pt_with_non_tensor_payload_is_refused_by_weights_only(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    buf = io.BytesIO()
    torch.save(Malicious(marker), buf)
    with pytest.raises(DecodeError, match="weights_only=True") as info:
        decode_field("pt", buf.getvalue())
    assert "'pt'" in str(info.value)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("ext", "data"),
    [
        ("cls", b"seven"),
        ("json", b"{nope"),
        ("txt", b"\xff\xfe\xfa"),
        ("npy", b"garbage"),
        ("pt", b"garbage"),
        ("jpg", b"garbage"),
    ],
)
def test_errors_name_the_field(ext: str, data: bytes) -> None:
    with pytest.raises(ValueError, match=f"field '{ext}'"):
        decode_field(ext, data)


def test_decode_sample_keeps_dunder_and_skip() -> None:
    png = encode(Image.new("L", (3, 2), 5), "PNG")
    sample: dict[str, object] = {"__key__": "a1", "__url__": "s.tar", "cls": b"3", "png": png, "jpg": b"raw", "n": 4}
    out = decode_sample(sample, skip={"jpg"})
    assert out["__key__"] == "a1" and out["__url__"] == "s.tar"
    assert out["cls"] == 3 and isinstance(out["png"], Image.Image) and out["png"].size == (3, 2)
    assert out["jpg"] == b"raw" and out["n"] == 4
    assert sample["cls"] == b"3"  # the input dict is untouched
