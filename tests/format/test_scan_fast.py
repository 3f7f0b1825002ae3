"""The fast header scan gives exactly the full parser's layout, and leaves anything else to it."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from shardify import tario, tarlayout
from shardify.tarfmt import END_OF_ARCHIVE, padding, ustar_header


def _shard(members: list[tuple[str, bytes]]) -> bytes:
    out = bytearray()
    for name, data in members:
        out += ustar_header(name, len(data)) + data + padding(len(data))
    return bytes(out + END_OF_ARCHIVE)


def _layouts(raw: bytes) -> tuple[object, object]:
    fast = tarlayout._scan_plain(io.BytesIO(raw), max_member=tario.DEFAULT_MAX_MEMBER)
    f = io.BytesIO(raw)
    full = tario.scan_layout(_Unseekable(f), shard="s.tar")
    return fast, full


class _Unseekable:
    """Forces the full parser."""

    def __init__(self, f: io.BytesIO) -> None:
        self.f = f

    def read(self, n: int = -1) -> bytes:
        return self.f.read(n)

    def seekable(self) -> bool:
        return False


def _eq(a: tario.ShardLayout, b: tario.ShardLayout) -> bool:
    return all(
        getattr(a, k) == getattr(b, k)
        for k in ("offsets", "first", "ext", "data", "size", "exts", "key_text", "key_ends")
    )


@pytest.mark.parametrize(
    "members",
    [
        pytest.param(
            [(f"k{i:05d}.{e}", bytes(i % 700)) for i in range(3000) for e in ("cls", "txt")], id="3000-samples"
        ),
        pytest.param([("a.jpg", b"x" * 5000), ("a.json", b"{}"), ("b.JPG", b"y"), ("c.seg.png", b"")], id="mixed"),
        pytest.param([], id="empty"),
    ],
)
def test_fast_scan_equals_the_full_parser(members) -> None:
    fast, full = _layouts(_shard(members))
    assert fast is not None and _eq(fast, full)


class _Counting(io.BytesIO):
    """Counts the bytes read from it."""

    read_bytes = 0

    def read(self, n: int | None = -1) -> bytes:  # type: ignore[override]
        data = super().read(n)
        self.read_bytes += len(data)
        return data


# photo-like samples: a small label, a large image (big and small members alternate)
_PHOTOS = [
    (f"p{i:04d}.{e}", (b"%d" % i) if e == "cls" else bytes([i % 251]) * (60_000 + 977 * i))
    for i in range(40)
    for e in ("cls", "jpg")
]


def test_fast_scan_of_large_members_equals_the_full_parser() -> None:
    fast, full = _layouts(_shard(_PHOTOS))
    assert fast is not None and _eq(fast, full)


def test_header_scans_pass_over_large_members_unread() -> None:
    """A scan reads the headers, not the images between them: ~16 KiB per large member (the
    next header and the small members after it), not 1 MiB chunks of image bytes."""
    raw = _shard(_PHOTOS)
    f = _Counting(raw)
    layout = tarlayout._scan_plain(f, max_member=tario.DEFAULT_MAX_MEMBER)
    assert layout is not None and len(layout) == 40
    assert f.read_bytes <= 41 * tarlayout._PLAIN_HOP < len(raw) / 4
    # a window of the split index's offsets, the way the reader scans it before a first batch
    g = _Counting(raw)
    window = tario.scan_window(g, start=layout.offsets[8], count=16, next_start=layout.offsets[24])
    assert window is not None and [window.key(i) for i in range(16)] == [f"p{i:04d}" for i in range(8, 24)]
    assert g.read_bytes <= 17 * tarlayout._PLAIN_HOP < (layout.offsets[24] - layout.offsets[8]) / 4


def _corrupt_checksum(raw: bytes, header_at: int) -> bytes:
    b = bytearray(raw)
    b[header_at + 10] ^= 1
    return bytes(b)


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(_corrupt_checksum(_shard([("a.cls", b"1"), ("b.cls", b"2")]), 1024), id="bad-checksum"),
        pytest.param(_shard([("a.cls", b"1"), ("a.cls", b"2")]), id="field-twice"),
        pytest.param(_shard([("a.cls", b"1"), ("b.cls", b"2"), ("a.txt", b"3")]), id="key-again"),
        pytest.param(_shard([("nodot", b"1")]), id="no-dot"),
        pytest.param(_shard([("d/a.cls", b"1")]), id="folder-name"),
        pytest.param(_shard([("a.cls", b"x" * 3000)])[:1536], id="truncated-data"),
    ],
)
def test_anything_unusual_goes_to_the_full_parser(raw: bytes) -> None:
    assert tarlayout._scan_plain(io.BytesIO(raw), max_member=tario.DEFAULT_MAX_MEMBER) is None


def test_pax_and_gnu_tars_scan_the_same_through_the_fallback(tmp_path: Path) -> None:
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
            for name in ("x" * 120 + ".cls", "short.txt"):
                info = tarfile.TarInfo(name)
                info.size = 3
                tf.addfile(info, io.BytesIO(b"abc"))
        raw = buf.getvalue()
        assert tarlayout._scan_plain(io.BytesIO(raw), max_member=tario.DEFAULT_MAX_MEMBER) is None
        layout = tario.scan_layout(io.BytesIO(raw), shard="t.tar")
        assert [layout.key(i) for i in range(len(layout))] == ["x" * 120, "short"]
