"""The shared format: key rules, tar headers, the hardened tar reader, manifest validation."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardify.errors import KeyRuleError, ManifestError, ShardFormatError
from shardify.keys import MAX_KEY_LENGTH, assign_keys, check_key, key_from_name, member_name, split_member_name
from shardify.manifest import Manifest
from shardify.splitindex import ShardEntry, SplitIndex
from shardify.tarfmt import END_OF_ARCHIVE, padding, shard_name, ustar_header
from shardify.tario import iter_members, iter_samples, scan_sample_offsets


@given(st.lists(st.text(min_size=1, max_size=150), min_size=1, max_size=30, unique=True))
@settings(max_examples=200, deadline=None)
def test_keys_valid_unique_and_order_independent(names: list[str]) -> None:
    keys = assign_keys(names)
    assert len(set(keys)) == len(keys)
    for k in keys:
        check_key(k)
        assert len(member_name(k, "src.json").encode()) <= 100
    assert dict(zip(names, keys)) == dict(zip(reversed(names), assign_keys(list(reversed(names)))))


def test_clean_names_keep_their_key_rewritten_ones_get_a_hash() -> None:
    assert key_from_name("n01440764/n01440764_10026") == ("n01440764__n01440764_10026", False)
    key, rewritten = key_from_name("a b/c.d")
    assert rewritten and key.startswith("a_b__c_d-") and len(key) == len("a_b__c_d-") + 10
    assert len(key_from_name("x" * 300)[0]) == MAX_KEY_LENGTH


@pytest.mark.parametrize("bad", ["", "a.b", "_x", "a b", "é", "x" * 81])
def test_check_key_refuses(bad: str) -> None:
    with pytest.raises(KeyRuleError):
        check_key(bad)


def test_split_member_name_like_webdataset() -> None:
    assert split_member_name("dir.x/key.seg.PNG") == ("dir.x/key", "seg.png")
    with pytest.raises(KeyRuleError):
        split_member_name("noext")


def test_header_is_what_tarfile_writes_with_fixed_fields() -> None:
    info = tarfile.TarInfo("k.jpg")
    info.size, info.mtime, info.mode, info.uname, info.gname = 1234, 0, 0o644, "", ""
    assert ustar_header("k.jpg", 1234) == info.tobuf(tarfile.USTAR_FORMAT)
    assert shard_name("train", 7) == "train-000007.tar"


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    out = io.BytesIO()
    for name, data in members:
        out.write(ustar_header(name, len(data)) + data + padding(len(data)))
    out.write(END_OF_ARCHIVE)
    return out.getvalue()


def test_reader_groups_samples_and_finds_offsets() -> None:
    raw = _tar([("a.cls", b"1"), ("a.jpg", b"x" * 700), ("b.cls", b"2")])
    samples = list(iter_samples(iter_members(io.BytesIO(raw), shard="s"), shard="s"))
    assert [(s["__key__"], s.get("cls"), s.get("jpg", b"")[:1]) for s in samples] == [
        ("a", b"1", b"x"),
        ("b", b"2", b""),
    ]
    assert scan_sample_offsets(io.BytesIO(raw), shard="s") == [("a", 0), ("b", (512 + 512) + (512 + 1024))]


def test_reader_reads_pax_gnu_and_gzip_written_by_tarfile() -> None:
    long = "d/" + "k" * 150 + ".txt"
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
            for name, data in [(long, b"hello"), ("d/x.txt", b"")]:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
        members = list(iter_members(io.BytesIO(buf.getvalue()), shard="p"))
        assert [(m.name, m.data) for m in members] == [(long, b"hello"), ("d/x.txt", b"")]
        gz = gzip.compress(buf.getvalue())
        assert len(list(iter_members(gzip.GzipFile(fileobj=io.BytesIO(gz)), shard="p.tgz"))) == 2


def _with_type(name: str, typeflag: bytes) -> bytes:
    h = bytearray(ustar_header(name, 0))
    h[156:157] = typeflag
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\x00 " % sum(h)
    return bytes(h)


@pytest.mark.parametrize(
    "raw, match",
    [
        (_tar([("a.jpg", b"x" * 2000)])[:1500], "truncated"),
        (_tar([("a.jpg", b"x")])[:300], "partial header"),
        (b"\x01" * 512 + END_OF_ARCHIVE, "checksum"),
        (_with_type("link.jpg", b"2") + END_OF_ARCHIVE, "symbolic link"),
        (_with_type("dev.jpg", b"3") + END_OF_ARCHIVE, "character device"),
        (_tar([("../evil.jpg", b"x")]), r"\.\."),
        (_tar([("/abs.jpg", b"x")]), "absolute"),
    ],
)
def test_reader_errors_name_the_shard(raw: bytes, match: str) -> None:
    with pytest.raises(ShardFormatError, match=rf"shard bad\.tar.*{match}|{match}.*") as info:
        list(iter_members(io.BytesIO(raw), shard="bad.tar"))
    assert "bad.tar" in str(info.value)


def test_reader_skips_bad_members_when_asked() -> None:
    raw = _with_type("link.jpg", b"2") + _tar([("ok.cls", b"1")])
    seen: list[tuple[str, str]] = []
    members = list(iter_members(io.BytesIO(raw), shard="s", on_bad_member=lambda n, why: seen.append((n, why))))
    assert [m.name for m in members] == ["ok.cls"] and seen[0][0] == "link.jpg"


def test_declared_size_larger_than_the_file_does_not_allocate_it() -> None:
    h = bytearray(ustar_header("big.bin", 0))
    h[124:136] = b"%011o\x00" % (8**11 - 1)
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\x00 " % sum(h)
    with pytest.raises(ShardFormatError, match="over the limit|truncated"):
        list(iter_members(io.BytesIO(bytes(h) + b"x" * 100), shard="s", max_member=1 << 40))


def test_duplicate_and_non_adjacent_keys_are_errors() -> None:
    raw = _tar([("a.cls", b"1"), ("b.cls", b"2"), ("a.jpg", b"3")])
    with pytest.raises(ShardFormatError, match="appears again"):
        list(iter_samples(iter_members(io.BytesIO(raw), shard="s"), shard="s"))
    raw = _tar([("a.cls", b"1"), ("a.cls", b"2")])
    with pytest.raises(ShardFormatError, match="twice"):
        list(iter_samples(iter_members(io.BytesIO(raw), shard="s"), shard="s"))


def _index(**over: object) -> dict:
    idx = SplitIndex(
        split="train", shards=(ShardEntry("train-000000.tar", 2, 3072, "ab"),), classes=("a", "b")
    ).to_json()
    idx["shardify"].update(over)
    return idx


def test_manifest_round_trip(tmp_path: Path) -> None:
    index = SplitIndex.from_json(_index(), source="t.json")
    assert SplitIndex.from_json(index.to_json(), source="t.json") == index
    m = Manifest(splits={}).with_split("train", index)
    m.save(tmp_path)
    assert Manifest.load(tmp_path) == m


@pytest.mark.parametrize(
    "over, match",
    [
        ({"format_version": 99}, "format_version"),
        ({"classes": "ab"}, "'classes' should be list"),
        ({"num_samples": 5}, "'num_samples' is 5"),
        ({"split": 3}, "'split' should be str"),
    ],
)
def test_bad_index_names_the_field_and_file(over: dict, match: str) -> None:
    with pytest.raises(ManifestError, match=rf"t\.json.*{match}"):
        SplitIndex.from_json(_index(**over), source="t.json")


def test_bad_manifest_file(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no manifest"):
        Manifest.load(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ManifestError, match="manifest.json.*'format'"):
        Manifest.load(tmp_path)
    (tmp_path / "manifest.json").write_text("[1, 2")
    with pytest.raises(ManifestError, match="not valid JSON"):
        Manifest.load(tmp_path)


def test_offsets_point_at_extension_headers_so_a_seek_keeps_long_names() -> None:
    buf = io.BytesIO()
    names = ["short.txt", "d/" + "k" * 150 + ".txt", "after.txt"]
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = 3
            tf.addfile(info, io.BytesIO(b"abc"))
    raw = buf.getvalue()
    offsets = scan_sample_offsets(io.BytesIO(raw), shard="p")
    assert [k for k, _ in offsets] == ["short", "d/" + "k" * 150, "after"]
    for key, offset in offsets:
        f = io.BytesIO(raw)
        f.seek(offset)
        first = next(iter_members(f, shard="p", start_offset=offset))
        assert first.name.startswith(key + ".") and first.offset == offset


def test_a_shard_with_too_many_field_names_is_damage_not_a_crash():
    from shardify.tario import scan_layout

    samples = [("k", {f"f{i}": b"x" for i in range(0x10001)})]
    raw = b"".join(ustar_header(member_name(k, e), 1) + b"x" + padding(1) for k, f in samples for e in sorted(f))
    with pytest.raises(ShardFormatError, match="different field names"):
        scan_layout(io.BytesIO(raw + END_OF_ARCHIVE), shard="many")


@pytest.mark.parametrize("bad", ["", "a.b", "_x", "-x", "a b", "a/b", "x" * 81, "ab\x7f", "a\x00", "A" * 80 + "_"])
@pytest.mark.parametrize("where", [0, 1, 5])
def test_every_key_is_checked_and_the_first_bad_one_named(bad: str, where: int) -> None:
    from shardify.keys import KeyList, _check_all

    good = ["a", "Z9", "x" * MAX_KEY_LENGTH, "0-_", "k-" * 40]
    keys = KeyList()
    for k in good[:where] + [bad] + good[where:] + ["_second-bad"]:
        keys.append(k)
    for chunk in (1, 2, 3, 1 << 16):  # the bad key at the start, middle or end of a chunk
        with pytest.raises(KeyRuleError, match=repr(bad).replace("\\", "\\\\").replace("(", r"\(")[:40]):
            _check_all(keys, chunk=chunk)
    ok = KeyList()
    for k in good:
        ok.append(k)
    _check_all(ok)


@given(
    st.lists(st.integers(min_value=-3, max_value=3) | st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=40)
)
@settings(max_examples=200, deadline=None)
def test_repeated_finds_exactly_the_values_seen_twice(values: list[int]) -> None:
    from array import array
    from collections import Counter

    from shardify.keys import _repeated

    counts = Counter(values)
    assert _repeated(array("q", values)) == [j for j, v in enumerate(values) if counts[v] > 1]


def _key_rule(name: str, identity: str | None = None) -> tuple[str, bool]:
    """key_from_name's documented rule, step by step (the reference its fast paths must equal)."""
    import hashlib
    import re

    joined = name.replace("\\", "/").strip("/").replace("/", "__")
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", joined)
    rewritten = safe != joined or not safe or not safe[0].isalnum()
    if not safe or not safe[0].isalnum():
        safe = "k" + safe
    rewritten = rewritten or len(safe) > MAX_KEY_LENGTH
    if rewritten:
        digest = hashlib.sha1((name if identity is None else identity).encode("utf-8", "surrogateescape")).hexdigest()
        safe = safe[: MAX_KEY_LENGTH - 11] + "-" + digest[:10]
    return safe, rewritten


_PATHS = st.text(alphabet="ab0_-/\\. é", max_size=90) | st.lists(
    st.text(alphabet="aZ9_-", min_size=1, max_size=30), min_size=1, max_size=4
).map("/".join)


@given(_PATHS)
@settings(max_examples=500, deadline=None)
def test_key_from_name_follows_its_rule(name: str) -> None:
    assert key_from_name(name) == _key_rule(name)
    assert key_from_name(name, identity="x/" + name) == _key_rule(name, "x/" + name)


@pytest.mark.parametrize(
    "name",
    [
        "a/b",
        "a/",
        "/a",
        "a//b",
        "a/b/",
        "a\\b",
        "_a/b",
        "a/_b",
        "a/b.c",
        "x" * 39 + "/" + "y" * 39,
        "x" * 40 + "/" + "y" * 39,
        "0/-",
        "-/0",
    ],
)
def test_key_from_name_edges_of_the_path_fast_path(name: str) -> None:
    assert key_from_name(name) == _key_rule(name)


@given(st.lists(st.lists(st.text(alphabet="ab0_-", max_size=12), max_size=5), max_size=6))
def test_keylist_extend_equals_appends(chunks: list[list[str]]) -> None:
    from shardify.keys import KeyList

    one, many = KeyList(), KeyList()
    for chunk in chunks:
        one.extend(chunk)
        for key in chunk:
            many.append(key)
    assert list(one) == list(many) == [k for chunk in chunks for k in chunk]
    assert [(bytes(d), e.tolist()) for d, e in one.spans()] == [(bytes(d), e.tolist()) for d, e in many.spans()]
