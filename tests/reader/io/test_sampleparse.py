"""The one-pass parse of a ranged sample (:mod:`shardify.reader.io.sampleparse`): the same sample
dict as the member walk for what shardify writes, and None (the walk decides) for anything else."""

from __future__ import annotations

import io
import tarfile

import pytest

from shardify.errors import ShardFormatError
from shardify.reader.io.sampleparse import parse_sample, plain_sample
from shardify.tario import iter_members, iter_samples

MAX = 1 << 20


def _walk(data: bytes, keep=None) -> dict[str, object]:
    found = list(iter_samples(iter_members(io.BytesIO(data), shard="s.tar", keep=keep, max_member=MAX), shard="s.tar"))
    assert len(found) == 1
    return {**found[0], "__offset__": 7}


def _tar(members: list[tuple[str, bytes]], *, fmt: int = tarfile.USTAR_FORMAT, kind: bytes = tarfile.REGTYPE) -> bytes:
    """The members' bytes, without the end-of-archive blocks (as a sample's range holds them)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.type = len(data), kind
            if kind == tarfile.SYMTYPE:
                info.size, info.linkname = 0, "x"
            tar.addfile(info, io.BytesIO(data) if kind != tarfile.SYMTYPE else None)
    raw = out.getvalue()
    return raw.rstrip(b"\0") + b"\0" * (-len(raw.rstrip(b"\0")) % 512)


PLAIN = [
    pytest.param([("000000007.cls", b"3"), ("000000007.jpg", b"\xff" * 700)], id="two-fields"),
    pytest.param([("a/b.c.TXT", b"")], id="dir-key-dotted-upper-ext-empty"),
    pytest.param([("k.npy", b"\x01" * 512)], id="exactly-a-block"),
]


@pytest.mark.parametrize("members", PLAIN)
@pytest.mark.parametrize("keep", [None, lambda name: not name.endswith(".cls")], ids=["all", "keep"])
def test_the_plain_case_parses_as_the_member_walk_does(members, keep) -> None:
    data = _tar(members)
    got = plain_sample(data, url="s.tar", offset=7, keep=keep, max_member=MAX)
    assert got is not None and got == _walk(data, keep) == parse_sample(
        data, url="s.tar", offset=7, keep=keep, max_member=MAX
    )


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :]


GOOD = _tar([("k.cls", b"1"), ("k.txt", b"hello")])

OTHER = [
    pytest.param(_tar([("k.cls", b"1"), ("j.txt", b"x")]), id="two-keys"),
    pytest.param(_tar([("k.cls", b"1"), ("k.CLS", b"x")]), id="a-field-twice"),
    pytest.param(_tar([("k." + "x" * 120, b"1")], fmt=tarfile.PAX_FORMAT), id="pax-long-name"),
    pytest.param(_tar([("k." + "x" * 120, b"1")], fmt=tarfile.GNU_FORMAT), id="gnu-long-name"),
    pytest.param(_tar([("kä.txt", b"1")], fmt=tarfile.PAX_FORMAT), id="non-ascii-name"),
    pytest.param(_tar([("k.lnk", b"")], kind=tarfile.SYMTYPE), id="symlink"),
    pytest.param(_tar([("nodot", b"1")]), id="no-extension"),
    pytest.param(_tar([("../k.txt", b"1")]), id="dot-dot"),
    pytest.param(GOOD + bytes(512), id="trailing-zero-block"),
    pytest.param(GOOD[:-1], id="truncated"),
    pytest.param(_flip(GOOD, 10), id="bad-checksum"),
    pytest.param(b"", id="empty"),
]


@pytest.mark.parametrize("data", OTHER)
def test_anything_else_goes_to_the_member_walk_with_its_errors(data: bytes) -> None:
    assert plain_sample(data, url="s.tar", offset=7, keep=None, max_member=MAX) is None
    try:
        expected: object = _walk(data)
    except (ShardFormatError, AssertionError) as e:
        expected = type(e)
    try:
        got: object = parse_sample(data, url="s.tar", offset=7, keep=None, max_member=MAX)
    except ShardFormatError as e:
        got = type(e)
    assert got == expected or (expected is AssertionError and got is ShardFormatError)


def test_a_member_over_the_size_limit_goes_to_the_member_walk() -> None:
    data = _tar([("k.bin", bytes(2000))])
    assert plain_sample(data, url="s.tar", offset=0, keep=None, max_member=1000) is None
    with pytest.raises(ShardFormatError):
        parse_sample(data, url="s.tar", offset=0, keep=None, max_member=1000)
