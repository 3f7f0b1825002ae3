"""Reader memory caps: a field not selected is never read into memory, a
member over ``max_member_bytes`` is refused before it is read, and an image over the pixel
limit the converter uses is refused before it is decoded. Memory is measured in a child
process (its peak RSS while reading, over its peak before), so Pillow's pixel buffers count.
"""

from __future__ import annotations

import gzip
import json
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest

from shardify.errors import SampleError, ShardFormatError
from shardify.reader import BatchOptions, DecodeOptions, ShardedDataset, make_loader
from shardify.tarfmt import END_OF_ARCHIVE, padding, ustar_header

TIME_LIMIT_S = 120
"""A hang fails the test instead of stalling the run (see tests/conftest.py)."""

ZEROS = 128 << 20
"""Size of the zero member: 128 MiB, about 0.6 MB compressed (level 1)."""


def write_zero_member_tgz(path: Path) -> Path:
    """A ``.tgz`` of 3 samples; sample ``k1`` also holds ``bin``: ``ZEROS`` bytes of zeros."""
    with gzip.GzipFile(path, "wb", compresslevel=1, mtime=0) as out:
        for i in range(3):
            out.write(ustar_header(f"k{i}.cls", 1) + str(i).encode() + padding(1))
            if i == 1:
                out.write(ustar_header("k1.bin", ZEROS))
                chunk = bytes(1 << 20)
                for _ in range(ZEROS >> 20):
                    out.write(chunk)
        out.write(END_OF_ARCHIVE)
    return path


def png_bomb(width: int = 12000, height: int = 12000) -> bytes:
    """A 1-bit grayscale PNG of ``width`` x ``height`` zero pixels: a few kB, 144 M pixels."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    row = bytes(1 + -(-width // 8))
    raw = zlib.compressobj(9)
    idat = b"".join(raw.compress(row) for _ in range(height)) + raw.flush()
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0))
        + chunk(b"IDAT", idat)
        + chunk(b"IEND", b"")
    )


def write_png_bomb_tar(path: Path) -> Path:
    small = png_bomb(8, 8)
    members = [
        ("k0.cls", b"0"),
        ("k0.png", small),
        ("k1.cls", b"1"),
        ("k1.png", png_bomb()),
        ("k2.cls", b"2"),
        ("k2.png", small),
    ]
    path.write_bytes(b"".join(ustar_header(n, len(d)) + d + padding(len(d)) for n, d in members) + END_OF_ARCHIVE)
    return path


_CHILD = textwrap.dedent("""
    import json, resource, sys
    from shardify.reader import DecodeOptions, ShardedDataset, make_loader
    url, fields, policy = sys.argv[1], tuple(sys.argv[2].split(",")), sys.argv[3]
    ds = ShardedDataset([url], batch_size=1, fields=fields, decoding=DecodeOptions(on_error=policy))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        got = [repr(b) for b in make_loader(ds, num_workers=0)]
        error = None
    except Exception as e:
        got, error = [], f"{type(e).__name__}: {e}"
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    report = ds.last_epoch_report
    print(json.dumps({"grew_mib": (after - before) / 1024, "batches": len(got), "error": error,
                      "bad": report.bad, "entries": report.entries}))
""")


def read_in_child(url: Path, fields: str, policy: str = "raise") -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(url), fields, policy], capture_output=True, text=True, timeout=100
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_an_unselected_huge_member_of_a_tgz_is_never_read_into_memory(tmp_path):
    url = write_zero_member_tgz(tmp_path / "zeros.tgz")
    assert url.stat().st_size < 2 << 20
    result = read_in_child(url, "cls")
    assert result["error"] is None and result["batches"] == 3
    assert result["grew_mib"] < 64, result  # reading the 128 MiB member whole: 128 to 256 MiB


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_a_member_over_max_member_bytes_is_refused_before_it_is_read(tmp_path, policy):
    url = str(write_zero_member_tgz(tmp_path / "zeros.tgz"))
    ds = ShardedDataset(
        [url],
        batch_size=1,
        fields=("cls", "bin;cls"),
        decoding=DecodeOptions(max_member_bytes=64 << 20, on_error=policy),
        batching=BatchOptions(collate_fn=list),
    )
    over = f"shard {url}, key 'k1': member declares {ZEROS} bytes, over the limit of {64 << 20}"
    if policy == "raise":
        with pytest.raises(ShardFormatError, match=over):
            list(make_loader(ds))
        return
    batches = list(make_loader(ds))
    assert [int(b[0][0]) for b in batches] == [0, 0, 0]  # k1 and k2 lost (after the damage), padded by k0
    assert ds.last_epoch_report.lost == 2 and "over the limit" in ds.last_epoch_report.entries[0][2]
    with pytest.raises(ValueError, match="max_member_bytes"):
        ShardedDataset([url], batch_size=1, decoding=DecodeOptions(max_member_bytes=-1))


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_an_image_over_the_pixel_limit_is_refused_before_it_is_decoded(tmp_path):
    url = write_png_bomb_tar(tmp_path / "bomb.tar")
    assert url.stat().st_size < 200_000
    result = read_in_child(url, "image,cls", "skip")
    assert result["grew_mib"] < 100, result  # decoded to RGB: 432 MB
    assert result["error"] is None and result["batches"] == 3 and result["bad"] == 1, result
    bomb = "decompression bomb: 12000x12000 = 144000000 pixels, over the limit of 89478485"
    assert result["entries"][0][1] == "k1" and bomb in result["entries"][0][2], result
    with pytest.raises(SampleError, match=f"bomb.tar, key 'k1': .*{bomb}"):  # refused, so safe in-process
        list(make_loader(ShardedDataset([str(url)], batch_size=1, fields=("image", "cls"))))


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_the_pixel_limit_is_pillows_max_image_pixels(tmp_path, monkeypatch):
    from PIL import Image

    url = str(write_png_bomb_tar(tmp_path / "bomb.tar"))
    ds = ShardedDataset([url], batch_size=1, fields=("image", "cls"))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 63)
    with pytest.raises(SampleError, match="8x8 = 64 pixels, over the limit of 63"):
        list(make_loader(ds))
