"""The stored form of pre-decoded images (shardify.pixels) and its split-index record."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from shardify.errors import ManifestError
from shardify.pixels import RAW_FORMAT_VERSION, RawPixels, encode_ppm, ppm_layout, rgb_view, stored_size
from shardify.splitindex import ShardEntry, SplitIndex


@pytest.mark.parametrize(
    ("wh", "size", "side", "want"),
    [
        pytest.param((500, 375), 256, "shorter", (341, 256), id="landscape-shorter"),
        pytest.param((375, 500), 256, "shorter", (256, 341), id="portrait-shorter"),
        pytest.param((500, 375), 256, "longer", (256, 192), id="landscape-longer"),
        pytest.param((375, 500), 256, "longer", (192, 256), id="portrait-longer"),
        pytest.param((300, 200), 256, "shorter", (300, 200), id="small-kept"),
        pytest.param((300, 200), 256, "longer", (256, 170), id="longer-over"),
        pytest.param((256, 256), 256, "shorter", (256, 256), id="exact"),
        pytest.param((5000, 3), 8, "longer", (8, 1), id="at-least-one"),
    ],
)
def test_stored_size_is_torchvisions_resize_rule(wh, size, side, want) -> None:
    assert stored_size(*wh, size=size, side=side) == want


def test_stored_size_refuses_bad_options() -> None:
    with pytest.raises(ValueError, match="side="):
        stored_size(10, 10, size=8, side="both")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="size="):
        stored_size(10, 10, size=0)


def _rgb(w: int, h: int, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")


def test_a_raw_image_is_a_ppm_pillow_reads_and_a_view_of_its_bytes() -> None:
    img = _rgb(7, 5)
    data = encode_ppm(img)
    assert data.startswith(b"P6\n7 5\n255\n") and len(data) == 11 + 7 * 5 * 3
    with Image.open(io.BytesIO(data)) as back:
        assert back.format == "PPM" and back.mode == "RGB" and np.array_equal(np.asarray(back), np.asarray(img))
    view = rgb_view(data)
    assert view is not None and view.shape == (5, 7, 3) and np.array_equal(view, np.asarray(img))
    assert not view.flags.writeable  # a view of the member's bytes, not a copy


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"P6\n# a comment\n2 1\n255\n" + bytes(6), id="comment"),
        pytest.param(b"P6\n2 1\n65535\n" + bytes(12), id="16-bit"),
        pytest.param(b"P5\n2 1\n255\n" + bytes(2), id="gray"),
        pytest.param(b"P3\n2 1\n255\n0 0 0 0 0 0\n", id="ascii"),
        pytest.param(b"P6\n2 1\n255\n" + bytes(5), id="short"),
        pytest.param(b"P6\n0 1\n255\n", id="empty"),
        pytest.param(b"\xff\xd8\xff\xe0" + bytes(40), id="jpeg"),
    ],
)
def test_only_whole_canonical_8bit_ppms_are_viewed(data: bytes) -> None:
    assert ppm_layout(data) is None and rgb_view(data) is None


def test_encode_refuses_other_modes() -> None:
    with pytest.raises(ValueError, match="RGB"):
        encode_ppm(Image.new("L", (2, 2)))


def _index(raw: RawPixels | None) -> SplitIndex:
    return SplitIndex(
        split="train",
        shards=(ShardEntry(url="a.tar", nsamples=1, filesize=3072, sha256="0" * 64),),
        fields=("cls", "ppm"),
        raw_pixels=raw,
    )


def test_the_split_index_records_raw_pixels_and_reads_them_back() -> None:
    raw = RawPixels(size=256, side="longer")
    obj = _index(raw).to_json()
    assert obj["shardify"]["raw_pixels"] == {
        "format": "ppm-rgb8",
        "version": RAW_FORMAT_VERSION,
        "field": "ppm",
        "size": 256,
        "side": "longer",
    }
    assert SplitIndex.from_json(obj, source="x.json").raw_pixels == raw
    plain = _index(None).to_json()
    assert "raw_pixels" not in plain["shardify"]  # other indexes keep their bytes
    assert SplitIndex.from_json(plain, source="x.json").raw_pixels is None


@pytest.mark.parametrize(
    ("change", "match"),
    [
        pytest.param({"version": RAW_FORMAT_VERSION + 1}, "'version' is 2, this shardify reads 1..1", id="newer"),
        pytest.param({"format": "npy"}, "'format' should be 'ppm-rgb8'", id="format"),
        pytest.param({"side": "both"}, "side='both'", id="side"),
        pytest.param({"size": 0}, "size=0", id="size"),
        pytest.param({"size": "256"}, "'size' should be int", id="size-type"),
    ],
)
def test_a_bad_or_newer_raw_pixels_record_is_refused_naming_the_file(change, match) -> None:
    obj = _index(RawPixels(size=256)).to_json()
    obj["shardify"]["raw_pixels"].update(change)
    with pytest.raises(ManifestError, match=match) as e:
        SplitIndex.from_json(obj, source="ds/train.json")
    assert "ds/train.json" in str(e.value) and "raw_pixels" in str(e.value)
