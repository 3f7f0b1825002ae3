"""The one tar header parser: what the member walk and the fast layout scan both read a header by."""

from __future__ import annotations

import io
import tarfile

import pytest

from shardify.tarfmt import END_OF_ARCHIVE, padding, ustar_header
from shardify.tarheader import checksum_ok, header_fields
from shardify.tario import iter_members, scan_layout


def _tarfile_header(name: str, size: int, *, fmt: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(format=fmt, encoding="utf-8", errors="surrogateescape")[-512:]


@pytest.mark.parametrize(
    ("header", "name", "size"),
    [
        pytest.param(ustar_header("k1.jpg", 12345), b"k1.jpg", 12345, id="shardify"),
        pytest.param(
            _tarfile_header("a/" * 60 + "k.cls", 7, fmt=tarfile.USTAR_FORMAT), b"a/" * 60 + b"k.cls", 7, id="prefix"
        ),
        pytest.param(_tarfile_header("k.bin", 8**11, fmt=tarfile.GNU_FORMAT), b"k.bin", 8**11, id="gnu-base-256"),
    ],
)
def test_fields_of_headers_from_shardify_and_tarfile(header: bytes, name: bytes, size: int) -> None:
    raw_name, found_size, typeflag, stored = header_fields(header)
    assert (raw_name, found_size, typeflag) == (name, size, b"0")
    assert checksum_ok(header, stored)


@pytest.mark.parametrize(("at", "what"), [(124, "size"), (148, "checksum")])
def test_a_field_that_is_not_octal_is_named(at: int, what: str) -> None:
    header = bytearray(ustar_header("k1.jpg", 10))
    header[at : at + 3] = b"z9z"
    with pytest.raises(ValueError, match=f"{what} field"):
        header_fields(bytes(header))


def test_the_walk_and_the_fast_scan_agree_on_a_headers_fields() -> None:

    data = b"".join(ustar_header(f"k{i}.bin", i + 1) + bytes(i + 1) + padding(i + 1) for i in range(3)) + END_OF_ARCHIVE
    walked = [(m.name, m.size, m.data_offset) for m in iter_members(io.BytesIO(data), shard="s.tar")]
    layout = scan_layout(io.BytesIO(data), shard="s.tar")
    scanned = [(f"{layout.key(i)}.{f}", size, at) for i in range(len(layout)) for f, at, size in layout.fields(i)]
    assert walked == scanned == [("k0.bin", 1, 512), ("k1.bin", 2, 1536), ("k2.bin", 3, 2560)]
