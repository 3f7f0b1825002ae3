"""Hostile or broken shards read end to end through ShardedDataset.

Each gives a ShardifyError naming the shard, or under ``on_error="skip"`` a counted skip with
the usual batch count; never a hang, another exception, or memory growing with a declared size.
Reading is in-process (fast); one case runs with 2 DataLoader workers.
"""

from __future__ import annotations

import io
import os
import tarfile
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardify.errors import ShardFormatError, ShardifyError
from shardify.reader import DecodeOptions, ShardedDataset, make_loader
from shardify.tarfmt import BLOCK, END_OF_ARCHIVE, MAX_MEMBER_SIZE, padding, ustar_header

SIZES = (5, 6, 4)
TARGET = "train-000001.tar"  # the shard every test damages: it holds global indices 5..10
FIRST, COUNT = 5, 6
FUZZ = settings(
    max_examples=150, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)


TIME_LIMIT_S = 90
"""A hang fails the test instead of stalling the run (see tests/conftest.py)."""


class Dataset(tuple):
    """``(root, original bytes of shard 1)``, shown briefly in hypothesis' reports."""

    def __repr__(self) -> str:
        return f"Dataset({self[0]})"


@pytest.fixture
def dataset(tmp_path: Path, shards) -> Dataset:
    """A counting dataset of shards of 5, 6 and 4 samples, and the bytes of its shard 1."""
    root = shards.write_dataset(tmp_path / "ds", shards.counting(SIZES))
    return Dataset((root, (root / TARGET).read_bytes()))


def member(name: str, data: bytes) -> bytes:
    return ustar_header(name, len(data)) + data + padding(len(data))


def _tar_member(ti: tarfile.TarInfo, data: bytes = b"", fmt: int = tarfile.USTAR_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt, encoding="utf-8", errors="surrogateescape") as t:
        ti.size = len(data)
        t.addfile(ti, io.BytesIO(data) if data else None)
    raw = buf.getvalue()
    end = len(raw)
    while end >= BLOCK and raw[end - BLOCK : end] == bytes(BLOCK):
        end -= BLOCK
    return raw[:end]


def _info(name: str, kind: bytes = tarfile.REGTYPE, **kw: object) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    for k, v in kw.items():
        setattr(ti, k, v)
    return ti


def _header(name: bytes, size: int) -> bytes:
    """A ustar header whose size field says ``size`` (any value up to 8 GiB), checksum right."""
    h = bytearray(ustar_header("x.bin", 0))
    h[0:100] = name.ljust(100, b"\0")
    h[124:136] = b"%011o\0" % size
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


HOSTILE: dict[str, tuple[bytes, str]] = {
    "dotdot": (_tar_member(_info("../../etc/evil.txt"), b"x"), "member name contains '..'"),
    "absolute": (_tar_member(_info("/etc/evil.cls"), b"1"), "absolute member name"),
    "symlink": (_tar_member(_info("evil.cls", tarfile.SYMTYPE, linkname="/etc/passwd")), "symbolic link"),
    "hardlink": (_tar_member(_info("evil.cls", tarfile.LNKTYPE, linkname="s001_00000.cls")), "hard link"),
    "device": (_tar_member(_info("evil.cls", tarfile.CHRTYPE, devmajor=1, devminor=5)), "character device"),
    "fifo": (_tar_member(_info("evil.cls", tarfile.FIFOTYPE)), "FIFO"),
    "non_utf8": (_tar_member(_info("evil\udcff.cls"), b"1"), "not UTF-8"),
    "pax_huge_size": (
        _tar_member(_info("evil.cls", pax_headers={"size": str(1 << 40)}), b"", tarfile.PAX_FORMAT),
        "over the limit",
    ),
    "pax_huge_path": (
        _tar_member(_info("evil.cls", pax_headers={"path": "p" * 2_000_000}), b"1", tarfile.PAX_FORMAT),
        "declares",
    ),
    "size_8gib": (_header(b"evil.cls", MAX_MEMBER_SIZE), "over the limit"),
    "size_past_end": (_header(b"evil.cls", 1 << 30), "truncated"),
    "duplicate_key": (member("s001_00000.cls", b"99"), "appears"),  # "key appears again" or "field appears twice"
    "bad_checksum": (_header(b"evil.cls", 0)[:148] + b"0000000\0" + _header(b"evil.cls", 0)[156:], "checksum mismatch"),
}


def _insert(shard: bytes, at_sample: int, data: bytes) -> bytes:
    """``shard`` with ``data`` put before sample ``at_sample`` (counting samples are 2 KiB)."""
    pos = at_sample * 4 * BLOCK
    return shard[:pos] + data + shard[pos:]


def read(root: Path, **kw: object) -> tuple[list[list[int]], ShardedDataset]:
    ds = ShardedDataset(root, batch_size=3, fields=("cls",), **kw)
    return [[int(x) for x in b] for b in ds], ds


def values(batches: list[list[int]]) -> set[int]:
    return {x for b in batches for x in b}


ALL = set(range(sum(SIZES)))
DAMAGED = set(range(FIRST, FIRST + COUNT))


# -- random damage ---------------------------------------------------------------------------------

_damage = st.one_of(
    st.tuples(st.just("flip"), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6)),
    st.tuples(st.just("cut"), st.integers(0, 10**6)),
    st.tuples(st.just("random"), st.binary(max_size=3 * BLOCK)),
)


def _apply(shard: bytes, damage: tuple[str, object]) -> bytes:
    kind, arg = damage
    if kind == "flip":
        out = bytearray(shard)
        for pos, value in arg:  # type: ignore[union-attr]
            out[pos % len(out)] = value
        return bytes(out)
    if kind == "cut":
        return shard[: arg % (len(shard) + 1)]  # type: ignore[operator]
    return arg  # type: ignore[return-value]


@FUZZ
@given(
    damage=_damage,
    policy=st.sampled_from(["raise", "skip"]),
    verify=st.booleans(),
    shuffle=st.booleans(),
    world=st.integers(1, 2),
)
def test_random_damage_errors_name_the_shard_or_skips_are_counted(
    dataset, monkeypatch, damage, policy: str, verify: bool, shuffle: bool, world: int
) -> None:
    root, original = dataset
    damaged = _apply(original, damage)
    (root / TARGET).write_bytes(damaged)
    changed = damaged != original
    monkeypatch.setenv("WORLD_SIZE", str(world))
    seen: set[int] = set()
    lost = 0
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        try:
            batches, ds = read(root, decoding=DecodeOptions(on_error=policy, verify=verify), shuffle=shuffle)
        except ShardifyError as e:
            assert policy == "raise", f"skip policy raised {e!r}"
            assert isinstance(e, ShardFormatError) or "s001_" in str(e), e
            assert TARGET in str(e), e
            if verify:
                assert changed and "sha256" in str(e), e
            continue
        assert len(batches) == len(ds) and all(len(b) == 3 for b in batches[:-1])
        seen |= values(batches)
        lost += ds.last_epoch_report.lost
        if policy == "raise":
            assert not ds.last_epoch_report
    if verify and changed and policy == "skip":
        # the whole shard skipped, nothing of it read (a padding repeat of one of its samples counts again)
        assert COUNT <= lost < COUNT + world and seen <= ALL - DAMAGED
    if not changed:
        assert seen == ALL and lost == 0


# -- hostile members, each kind ---------------------------------------------------------------------


@FUZZ
@given(kind=st.sampled_from(sorted(HOSTILE)), at=st.integers(0, COUNT), shuffle=st.booleans())
def test_hostile_member_anywhere_in_a_shard(dataset, kind: str, at: int, shuffle: bool) -> None:
    root, original = dataset
    data, message = HOSTILE[kind]
    (root / TARGET).write_bytes(_insert(original, at, data))
    with pytest.raises(ShardFormatError) as caught:
        read(root, shuffle=shuffle)
    assert TARGET in str(caught.value) and message in str(caught.value), caught.value
    batches, ds = read(root, shuffle=shuffle, decoding=DecodeOptions(on_error="skip"))
    assert len(batches) == len(ds) and all(len(b) == 3 for b in batches[:-1])
    report = ds.last_epoch_report
    # The samples before the damage are kept (all their members were read before it), except
    # when the damaged member is one of the sample's own: a duplicate of sample 0's field at 1.
    kept = at if kind != "duplicate_key" or at >= 2 else 0
    assert (report.bad, report.lost) == (0, COUNT - kept), (kind, at, report)
    assert values(batches) <= ALL and values(batches) >= ALL - DAMAGED
    assert all(TARGET in shard and message in reason for shard, _, reason in report.entries), report


def test_a_shard_list_with_a_hostile_member_fails_when_counted(dataset) -> None:
    root, original = dataset
    (root / TARGET).write_bytes(_insert(original, 2, HOSTILE["symlink"][0]))
    with pytest.raises(ShardFormatError, match=f"{TARGET}.*symbolic link"):
        ShardedDataset([str(root / TARGET)], batch_size=2, fields=("cls",))


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_hostile_shard_with_two_workers(dataset, policy: str) -> None:
    root, original = dataset
    (root / TARGET).write_bytes(_insert(original, 3, HOSTILE["dotdot"][0]))
    ds = ShardedDataset(root, batch_size=3, fields=("cls",), shuffle=True, decoding=DecodeOptions(on_error=policy))
    loader = make_loader(ds, num_workers=2)
    try:
        if policy == "raise":
            with pytest.raises(ShardFormatError, match=f"{TARGET}.*member name contains '..'"):
                list(loader)
        else:
            batches = list(loader)
            assert len(batches) == len(ds) and all(len(b) == 3 for b in batches[:-1])
            assert ds.last_epoch_report.lost == COUNT - 3  # samples 0..2 precede the damage
    finally:
        loader.close()


# -- memory never follows a declared size -----------------------------------------------------------


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_member_declaring_far_more_than_the_file_holds_stays_small(dataset, policy: str) -> None:
    root, original = dataset
    declared = (2 << 30) - BLOCK  # just under the 2 GiB default limit, so it is read, not refused
    shard = original[: -len(END_OF_ARCHIVE)] + _header(b"big.bin", declared) + b"z" * (256 << 10)
    (root / TARGET).write_bytes(shard)
    tracemalloc.start()
    try:
        if policy == "raise":
            with pytest.raises(ShardFormatError, match=f"{TARGET}.*truncated"):
                read(root)
        else:
            batches, ds = read(root, decoding=DecodeOptions(on_error="skip"))
            assert len(batches) == len(ds) and not ds.last_epoch_report  # every sample precedes the damage
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"a member declaring {declared} bytes made reading peak at {peak} bytes"


def test_member_declaring_8_gib_is_refused_before_reading(dataset) -> None:
    root, original = dataset
    (root / TARGET).write_bytes(original[: -len(END_OF_ARCHIVE)] + _header(b"big.bin", MAX_MEMBER_SIZE) + b"z" * BLOCK)
    tracemalloc.start()
    try:
        with pytest.raises(ShardFormatError, match=f"{TARGET}.*declares {MAX_MEMBER_SIZE} bytes, over the limit"):
            read(root)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20
    assert os.path.getsize(root / TARGET) < 1 << 20
