"""The manifest's record of a split index (its size and SHA-256, shard, sample and byte totals)
and :meth:`Manifest.split_index`, which checks an index against it: each way an index can differ
is an IndexMismatchError naming the split and the first entry that disagrees."""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

import pytest

from shardify.convert import ShardWriter
from shardify.errors import IndexMismatchError, ManifestError
from shardify.manifest import Manifest, index_bytes
from shardify.splitindex import ShardEntry, SplitIndex
from shardify.tarfmt import shard_name

VERSION = "0123456789ab"


def _index(counts: list[int], *, version: str | None = VERSION) -> SplitIndex:
    shards = tuple(
        ShardEntry(url=shard_name("train", i, version), nsamples=n, filesize=1024 * (n + 1), sha256="")
        for i, n in enumerate(counts)
    )
    return SplitIndex(split="train", shards=shards, version=version)


def _manifest(index: SplitIndex) -> Manifest:
    return Manifest(splits={}).with_split("train", index)


def test_the_writer_records_the_bytes_of_the_index_it_wrote_and_of_the_copy_wids_opens(tmp_path: Path) -> None:
    with ShardWriter(tmp_path / "ds", samples_per_shard=3, fsync=False) as w:
        for i in range(10):
            w.write({"txt": str(i)})
    ref = json.loads((tmp_path / "ds" / "manifest.json").read_text())["splits"]["train"]
    for name in (ref["index"], "train.json"):
        data = (tmp_path / "ds" / name).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (ref["index_size"], ref["index_sha256"])
    manifest = Manifest.load(tmp_path / "ds")
    assert manifest.load_split(tmp_path / "ds", "train").num_samples == 10
    assert Manifest.from_json(manifest.to_json(), source="m") == manifest  # the record round-trips


def test_the_index_the_manifest_records_loads() -> None:
    index = _index([5, 5, 3])
    assert _manifest(index).split_index("train", index_bytes(index), source="t.json") == index


def _shardlist(index: SplitIndex, edit) -> bytes:
    obj = index.to_json()
    edit(obj["shardlist"])
    del obj["shardify"]["num_samples"]
    return json.dumps(obj).encode()


@pytest.mark.parametrize(
    "edit, entry, said",
    [
        pytest.param(lambda s: s.__setitem__(1, dict(s[0])), 1, "entry 1 of the index names", id="replaced"),
        pytest.param(lambda s: s.insert(2, dict(s[1])), 2, "(shard 1's name)", id="repeated"),
        pytest.param(lambda s: s.pop(), 2, "is missing from the index", id="removed"),
        pytest.param(lambda s: s.append({**s[2], "url": shard_name("train", 3, VERSION)}), 3, "extra", id="added"),
        pytest.param(lambda s: s.reverse(), 0, "entry 0 of the index names", id="reordered"),
        pytest.param(lambda s: s[1].update(nsamples=4), None, "hold 12 samples, the manifest records 13", id="count"),
        pytest.param(lambda s: s[1].update(filesize=7), None, "bytes, the manifest records", id="size"),
        pytest.param(lambda s: s[1].update(sha256="0" * 64), None, "SHA-256", id="checksum"),
    ],
)
def test_an_index_that_differs_is_refused_naming_the_split_and_the_first_entry(edit, entry, said) -> None:
    index = _index([5, 5, 3])
    with pytest.raises(IndexMismatchError) as e:
        _manifest(index).split_index("train", _shardlist(index, edit), source="t.json")
    assert (e.value.split, e.value.entry) == ("train", entry)
    assert "t.json: split 'train'" in str(e.value) and said in str(e.value)


def test_the_entries_and_totals_are_checked_even_when_the_digest_agrees() -> None:
    """A manifest that records a wrong index's digest (written by hand): the shards still tell."""
    index = _index([5, 5, 3])
    data = _shardlist(index, lambda s: s.__setitem__(2, dict(s[1])))
    manifest = _manifest(index)
    ref = manifest.splits["train"]
    recorded = Manifest(
        splits={"train": type(ref)(**{**ref.__dict__, "index_size": len(data), "index_sha256": _sha(data)})}
    )
    with pytest.raises(IndexMismatchError, match="entry 2 of the index names") as e:
        recorded.split_index("train", data, source="t.json")
    assert e.value.entry == 2


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_an_index_that_does_not_parse_is_named_as_not_the_manifests() -> None:
    index = _index([5, 5])
    with pytest.raises(IndexMismatchError, match="changed after the manifest was written: .*not valid JSON") as e:
        _manifest(index).split_index("train", b"root:x:0:0:root:/root:/bin/bash\n", source="t.json")
    assert isinstance(e.value.__cause__, ManifestError)


def test_format_1_names_are_the_rule_for_an_unversioned_split() -> None:
    index = _index([2, 2], version=None)
    assert _manifest(index).split_index("train", index_bytes(index), source="t.json") == index


@pytest.mark.parametrize(
    "ref, message",
    [
        ({"index_size": 10}, "field 'index_sha256' is missing"),
        ({"index_sha256": "a" * 64}, "field 'index_size' is missing"),
        ({}, "fields 'index_size' and 'index_sha256' are missing"),
        ({"index_size": 10, "index_sha256": "ABC"}, "field 'index_sha256' should be 64 lowercase hex digits"),
        ({"index_size": 10, "index_sha256": None}, "field 'index_sha256' should be 64 lowercase hex digits"),
        ({"index_size": -1, "index_sha256": "a" * 64}, "a negative size"),
    ],
)
def test_a_manifest_without_a_usable_index_record_is_refused_naming_the_field(ref, message) -> None:
    split = {"index": "train.json", "samples": 1, "shards": 1, "bytes": 3072, **ref}
    with pytest.raises(ManifestError, match=message) as e:
        Manifest.from_json({"format": "shardify", "format_version": 2, "splits": {"train": split}}, source="m.json")
    assert "m.json (split 'train')" in str(e.value)


def test_index_mismatch_errors_survive_pickling() -> None:
    """As a worker process's error does (torch re-creates it from its message too)."""
    e = IndexMismatchError("t.json: split 'train': entry 3", split="train", entry=3)
    back = pickle.loads(pickle.dumps(e))
    assert (type(back), str(back), back.split, back.entry) == (IndexMismatchError, str(e), "train", 3)
    assert str(IndexMismatchError(str(e))) == str(e)
