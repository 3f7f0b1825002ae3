"""Fuzzing the hardened tar reader: hostile or broken shards give a clear ShardFormatError
naming the shard (or a reported skip), never another exception, a hang, or memory that grows
with a size a header declares.

Every example is read three ways: ``iter_samples(iter_members(...))`` on a seekable file, the
same on a forward-only stream (gzip, HTTP), and ``scan_sample_offsets``.
"""

from __future__ import annotations

import gzip
import io
import tarfile
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardify.errors import ShardFormatError
from shardify.tarfmt import BLOCK, END_OF_ARCHIVE, MAX_MEMBER_SIZE, padding, ustar_header
from shardify.tario import iter_members, iter_samples, scan_layout, scan_sample_offsets

SHARD = "fuzz-000007.tar"
FUZZ = settings(
    max_examples=500, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)


TIME_LIMIT_S = 60
"""A hang fails the test instead of stalling the run (see tests/conftest.py)."""


class ForwardOnly(io.RawIOBase):
    """A stream that cannot seek, like a gzip or HTTP body."""

    def __init__(self, data: bytes) -> None:
        self._b = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buf: bytearray) -> int:  # type: ignore[override]
        return self._b.readinto(buf)


# -- building shards -----------------------------------------------------------------------------


def member(name: str, data: bytes) -> bytes:
    return ustar_header(name, len(data)) + data + padding(len(data))


def good_shard(n: int = 4) -> bytes:
    """``n`` samples of two members each (``k{i}.cls``, ``k{i}.txt``)."""
    return (
        b"".join(member(f"k{i}.cls", str(i).encode()) + member(f"k{i}.txt", b"x" * (100 * i)) for i in range(n))
        + END_OF_ARCHIVE
    )


def raw_header(
    name: bytes = b"a.txt",
    size: bytes | None = None,
    typeflag: bytes = b"0",
    *,
    prefix: bytes = b"",
    magic: bytes = b"ustar\x0000",
    checksum: bool = True,
) -> bytes:
    """A header with any field values; ``checksum=False`` leaves the checksum field wrong."""
    h = bytearray(BLOCK)
    h[0:100] = name[:100].ljust(100, b"\0")
    h[100:108] = b"0000644\0"
    h[124:136] = (size if size is not None else b"%011o\0" % 0)[:12].ljust(12, b"\0")
    h[156:157] = typeflag[:1]
    h[257:265] = magic[:8].ljust(8, b"\0")
    h[345:500] = prefix[:155].ljust(155, b"\0")
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % ((sum(h) + (0 if checksum else 1)) % 0o777777)
    return bytes(h)


def pax_records(records: dict[bytes, bytes]) -> bytes:
    out = b""
    for key, value in records.items():
        body = b" " + key + b"=" + value + b"\n"
        n = len(body) + 1
        while len(str(n)) + len(body) != n:
            n = len(str(n)) + len(body)
        out += str(n).encode() + body
    return out


def pax_member(records: dict[bytes, bytes], name: bytes = b"k9.txt", data: bytes = b"hi") -> bytes:
    """A PAX extended header with ``records``, then a regular member ``name``."""
    p = pax_records(records)
    return (
        raw_header(b"PaxHeader/x", b"%011o\0" % len(p), b"x")
        + p
        + padding(len(p))
        + raw_header(name, b"%011o\0" % len(data))
        + data
        + padding(len(data))
    )


def tarfile_member(info: tarfile.TarInfo, data: bytes = b"", fmt: int = tarfile.USTAR_FORMAT) -> bytes:
    """One member as Python's tarfile writes it (links, devices, PAX, GNU long names)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt, encoding="utf-8", errors="surrogateescape") as t:
        info.size = len(data)
        t.addfile(info, io.BytesIO(data) if data else None)
    return _strip_end(buf.getvalue())


def _strip_end(archive: bytes) -> bytes:
    """``archive`` without its end-of-archive zero blocks (and tarfile's record padding)."""
    end = len(archive)
    while end >= BLOCK and archive[end - BLOCK : end] == bytes(BLOCK):
        end -= BLOCK
    return archive[:end]


def info(name: str, kind: bytes = tarfile.REGTYPE, **kw: object) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    for k, v in kw.items():
        setattr(ti, k, v)
    return ti


# -- reading -------------------------------------------------------------------------------------


def from_layout(data: bytes, **kw: object) -> list[dict[str, object]]:
    """The samples of ``data`` rebuilt from its scanned layout: one slice per field."""
    layout = scan_layout(io.BytesIO(data), shard=SHARD, **kw)
    out = []
    for i in range(len(layout)):
        sample: dict[str, object] = {"__key__": layout.key(i), "__shard__": SHARD, "__offset__": layout.offsets[i]}
        for field, at, size in layout.fields(i):
            sample[field] = data[at : at + size]
        out.append(sample)
    return out


def read_all(data: bytes, **kw: object) -> list[dict[str, object]] | ShardFormatError:
    """Read ``data`` every way; returns the samples, or the (one, same) error all ways gave."""
    results: list[object] = []
    for make in (io.BytesIO, ForwardOnly):
        try:
            results.append(list(iter_samples(iter_members(make(data), shard=SHARD, **kw), shard=SHARD)))
        except ShardFormatError as e:
            assert SHARD in str(e), e
            results.append(e)
    try:
        offsets = scan_sample_offsets(io.BytesIO(data), shard=SHARD, **kw)
    except ShardFormatError as e:
        assert SHARD in str(e), e
        assert isinstance(results[0], ShardFormatError), f"scan raised {e}, reading did not"
    else:
        if isinstance(results[0], list):
            assert [k for k, _ in offsets] == [s["__key__"] for s in results[0]]
            assert from_layout(data, **kw) == results[0]  # what ShardReader reads by the layout
    seekable, forward = results
    assert type(seekable) is type(forward), (seekable, forward)
    if isinstance(seekable, list):
        assert seekable == forward
    return seekable  # type: ignore[return-value]


def assert_error(data: bytes, pattern: str, **kw: object) -> None:
    got = read_all(data, **kw)
    assert isinstance(got, ShardFormatError), f"expected an error matching {pattern!r}, read {got}"
    assert SHARD in str(got)
    assert pattern in str(got), str(got)


# -- fuzzing -------------------------------------------------------------------------------------


@FUZZ
@given(st.binary(max_size=4 * BLOCK))
def test_random_bytes(data: bytes) -> None:
    read_all(data)


@FUZZ
@given(st.binary(min_size=1, max_size=2 * BLOCK))
def test_random_bytes_after_good_members(tail: bytes) -> None:
    read_all(good_shard(2)[: -len(END_OF_ARCHIVE)] + tail)


def test_truncation_at_every_block_and_member_boundary() -> None:
    shard = good_shard(4)
    cuts = set(range(0, len(shard) + 1, BLOCK)) | {c + d for c in range(0, len(shard), BLOCK) for d in (1, 100, 511)}
    whole = read_all(shard)
    assert isinstance(whole, list) and len(whole) == 4
    for cut in sorted(c for c in cuts if c <= len(shard)):
        got = read_all(shard[:cut])
        if isinstance(got, list):
            # Cut on a block boundary between members: read as a shorter archive, as GNU tar and
            # Python's tarfile do (the manifest's counts and verify=True catch it in the reader).
            assert cut % BLOCK == 0 or cut >= len(shard) - len(END_OF_ARCHIVE) + BLOCK  # or in the end blocks
            if got:
                assert got[:-1] == whole[: len(got) - 1]
                assert got[-1].items() <= whole[len(got) - 1].items()
        else:
            assert "truncated" in str(got) or (cut == 0 and "empty file" in str(got)), (cut, got)


@FUZZ
@given(st.integers(0, 10**9), st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 255)), max_size=8))
def test_truncation_and_byte_flips(cut: int, flips: list[tuple[int, int]]) -> None:
    shard = bytearray(good_shard(3))
    for pos, value in flips:
        shard[pos % len(shard)] = value
    read_all(bytes(shard[: cut % (len(shard) + 1)]))


_names = st.one_of(
    st.binary(max_size=110),
    st.sampled_from(
        [
            b"k.txt",
            b"k.cls",
            b"../k.txt",
            b"/etc/k.txt",
            b"a/../../k.txt",
            b"a\\..\\k.txt",
            b"\xff\xfe.txt",
            b"noext",
            b".txt",
            b"dir/",
            b"a/b.c.d",
        ]
    ),
)
_sizes = st.one_of(
    st.integers(0, MAX_MEMBER_SIZE).map(lambda n: b"%011o\0" % n),
    st.binary(min_size=12, max_size=12),
    st.integers(0, 2**88 - 1).map(lambda n: b"\x80" + n.to_bytes(11, "big")),  # GNU base-256
    st.integers(0, 2**88 - 1).map(lambda n: b"\xc0" + n.to_bytes(11, "big")),  # negative base-256
)
_types = st.sampled_from([b"0", b"\0", b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"g", b"K", b"S", b"V", b"Z"])
_pax = st.dictionaries(
    st.sampled_from([b"path", b"size", b"linkpath", b"mtime", b"uname"]),
    st.one_of(
        st.binary(max_size=40),
        st.integers(0, 10**40).map(lambda n: str(n).encode()),
        st.sampled_from([b"9" * 5000, b"-5", b"../../k.txt", b"/abs.txt", b"\xff.txt", b""]),
    ),
    max_size=3,
)


@st.composite
def _hostile_member(draw: st.DrawFn) -> bytes:
    data = draw(st.binary(max_size=3 * BLOCK))
    out = b""
    if draw(st.booleans()):
        out += pax_member(draw(_pax))
    header = raw_header(
        draw(_names),
        draw(_sizes),
        draw(_types),
        prefix=draw(st.binary(max_size=20)),
        checksum=draw(st.integers(0, 9)) > 0,
    )
    return out + header + data + padding(len(data))


@FUZZ
@given(
    st.lists(
        st.one_of(_hostile_member(), st.sampled_from([member("k1.cls", b"1"), member("k2.cls", b"2")])), max_size=5
    ),
    st.booleans(),
)
def test_corrupted_headers_with_valid_and_invalid_checksums(members: list[bytes], ended: bool) -> None:
    read_all(b"".join(members) + (END_OF_ARCHIVE if ended else b""))


# -- each hostile kind, with the message it gives ---------------------------------------------------


def _hostile_cases() -> list[object]:
    before = member("k0.cls", b"0")
    big = 8 << 30  # 8 GiB declared
    cases = {
        "dotdot": (tarfile_member(info("../evil.txt"), b"x"), "member name contains '..'"),
        "dotdot_inside": (tarfile_member(info("a/../../evil.txt"), b"x"), "member name contains '..'"),
        "absolute": (tarfile_member(info("/etc/evil.txt"), b"x"), "absolute member name"),
        "symlink": (
            tarfile_member(info("k1.txt", tarfile.SYMTYPE, linkname="/etc/passwd")),
            "symbolic link, not a regular file",
        ),
        "hardlink": (
            tarfile_member(info("k1.txt", tarfile.LNKTYPE, linkname="k0.cls")),
            "hard link, not a regular file",
        ),
        "chardev": (
            tarfile_member(info("k1.txt", tarfile.CHRTYPE, devmajor=1, devminor=3)),
            "character device, not a regular file",
        ),
        "blockdev": (
            tarfile_member(info("k1.txt", tarfile.BLKTYPE, devmajor=8, devminor=0)),
            "block device, not a regular file",
        ),
        "fifo": (tarfile_member(info("k1.txt", tarfile.FIFOTYPE)), "FIFO, not a regular file"),
        "non_utf8": (tarfile_member(info("k\udcff\udcfe.txt"), b"x"), "member name is not UTF-8"),
        "pax_non_utf8_path": (pax_member({b"path": b"k\xff.txt"}), "member name is not UTF-8"),
        "pax_dotdot_path": (pax_member({b"path": b"../../k.txt"}), "member name contains '..'"),
        "pax_huge_size": (pax_member({b"size": str(big).encode()}), f"member declares {big} bytes"),
        "pax_size_1e40": (pax_member({b"size": b"1" + b"0" * 40}), "over the limit"),
        "pax_size_5000_digits": (pax_member({b"size": b"9" * 5000}), "size is not a number"),
        "pax_negative_size": (pax_member({b"size": b"-5"}), "negative size"),
        "pax_huge_path": (pax_member({b"path": b"a" * 600_000 + b".txt"}), ""),  # allowed: < 1 MiB header
        "pax_header_over_1mib": (
            raw_header(b"PaxHeader", b"%011o\0" % (2 << 20), b"x") + bytes(BLOCK),
            "extension header at byte 1024 declares 2097152 bytes",
        ),
        "pax_bad_record": (
            raw_header(b"PaxHeader", b"%011o\0" % 10, b"x") + b"zz path=x\n".ljust(BLOCK, b"\0"),
            "corrupt PAX header",
        ),
        "size_8gib_ustar": (raw_header(b"k1.bin", b"%011o\0" % MAX_MEMBER_SIZE) + b"x" * BLOCK, "over the limit"),
        "size_base256_huge": (
            raw_header(b"k1.bin", b"\x80" + (10**25).to_bytes(11, "big")) + b"x" * BLOCK,
            "over the limit",
        ),
        "size_past_end": (raw_header(b"k1.bin", b"%011o\0" % (1 << 30)) + b"x" * BLOCK, "truncated"),
        "size_not_octal": (raw_header(b"k1.bin", b"12345678z01\0"), "not octal"),
        "bad_checksum": (raw_header(b"k1.bin", checksum=False), "checksum mismatch"),
        "checksum_not_octal": (raw_header(b"k1.bin")[:148] + b"zzzzzz\0 " + raw_header(b"k1.bin")[156:], "not octal"),
        "duplicate_field": (member("k0.cls", b"again"), "field 'cls' appears twice"),
        "duplicate_key": (member("k1.cls", b"1") + member("k0.txt", b"again"), "key appears again"),
        "no_extension": (member("k1", b"x"), "has no key and extension"),
        "gnu_sparse": (raw_header(b"k1.txt", b"%011o\0" % 0, b"S"), "not a regular file"),
    }
    out = []
    for name, (data, pattern) in cases.items():
        out.append(pytest.param(before + data + END_OF_ARCHIVE, pattern, id=name))
    return out


@pytest.mark.parametrize(("shard", "pattern"), _hostile_cases())
def test_each_hostile_member_gives_a_clear_error(shard: bytes, pattern: str) -> None:
    got = read_all(shard)
    if not pattern:
        assert isinstance(got, list)
        return
    assert isinstance(got, ShardFormatError), got
    assert pattern in str(got) and SHARD in str(got)


@pytest.mark.parametrize(
    ("shard", "pattern"),
    [
        p
        for p in _hostile_cases()
        if p.id in {"dotdot", "absolute", "symlink", "hardlink", "chardev", "fifo", "non_utf8"}
    ],
)
def test_well_framed_bad_members_can_be_reported_and_skipped(shard: bytes, pattern: str) -> None:
    skipped: list[tuple[str, str]] = []
    samples = list(
        iter_samples(
            iter_members(io.BytesIO(shard), shard=SHARD, on_bad_member=lambda n, r: skipped.append((n, r))), shard=SHARD
        )
    )
    assert [s["__key__"] for s in samples] == ["k0"]
    assert len(skipped) == 1 and pattern in skipped[0][1]


def test_directories_and_global_pax_headers_are_passed_over() -> None:
    shard = (
        tarfile_member(info("somedir", tarfile.DIRTYPE))
        + member("k0.cls", b"0")
        + tarfile_member(info("glob", tarfile.XGLTYPE, pax_headers={"comment": "x"}))
        + member("k0.txt", b"t")
        + END_OF_ARCHIVE
    )
    got = read_all(shard)
    assert isinstance(got, list) and got[0]["cls"] == b"0" and got[0]["txt"] == b"t"


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT], ids=["pax", "gnu"])
def test_long_names_from_other_tools_are_read(fmt: int) -> None:
    name = "d" * 150 + "/key.txt"
    got = read_all(tarfile_member(info(name), b"long", fmt) + END_OF_ARCHIVE)
    assert isinstance(got, list) and got[0]["__key__"] == "d" * 150 + "/key" and got[0]["txt"] == b"long"


# -- memory never follows a declared size ---------------------------------------------------------


@pytest.mark.parametrize("forward", [False, True], ids=["seekable", "forward_only"])
@pytest.mark.parametrize("declared", [MAX_MEMBER_SIZE, 1 << 40], ids=["8GiB", "1TiB_pax"])
def test_a_huge_declared_size_allocates_only_what_is_there(declared: int, forward: bool) -> None:
    if declared > MAX_MEMBER_SIZE:
        head = pax_member({b"size": str(declared).encode()}, name=b"k1.bin", data=b"")
    else:
        head = raw_header(b"k1.bin", b"%011o\0" % declared)
    shard = member("k0.cls", b"0") + head + b"y" * (64 << 10)
    stream = ForwardOnly(shard) if forward else io.BytesIO(shard)
    tracemalloc.start()
    try:
        with pytest.raises(ShardFormatError, match="truncated"):
            list(iter_members(stream, shard=SHARD, max_member=1 << 50))  # lift the size limit
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 48 << 20, f"reading a member declaring {declared} bytes peaked at {peak} bytes"
    with pytest.raises(ShardFormatError, match="over the limit"):  # the default limit refuses it at once
        list(iter_members(io.BytesIO(shard), shard=SHARD))


def test_scan_catches_a_duplicate_key_a_reader_starting_mid_shard_would_miss() -> None:
    shard = member("a.cls", b"1") + member("b.cls", b"2") + member("a.cls", b"3") + END_OF_ARCHIVE
    with pytest.raises(ShardFormatError, match=f"{SHARD}, key 'a': key appears again"):
        scan_sample_offsets(io.BytesIO(shard), shard=SHARD)


# -- empty files and compressed streams -----------------------------------------------------------


def test_an_empty_file_is_not_an_archive() -> None:
    """0 bytes is no tar archive (GNU tar and tarfile refuse it); 1024 zero bytes is an empty one."""
    assert_error(b"", "empty file (0 bytes): not a tar archive")
    with pytest.raises(ShardFormatError, match="empty file"):
        list(iter_members(gzip.GzipFile(fileobj=io.BytesIO(gzip.compress(b""))), shard=SHARD))
    assert read_all(END_OF_ARCHIVE) == []


def test_unwanted_members_are_passed_over_unread() -> None:
    shard = good_shard(3)
    for make in (io.BytesIO, ForwardOnly):
        members = list(iter_members(make(shard), shard=SHARD, keep=lambda name: name.endswith(".cls")))
        assert [(m.name, m.data, m.skipped) for m in members if m.name.endswith(".txt")] == [
            (f"k{i}.txt", b"", True) for i in range(3)
        ]
        samples = list(iter_samples(iter(members), shard=SHARD))
        assert [sorted(s) for s in samples] == [["__key__", "__offset__", "__shard__", "cls"]] * 3
