"""A tampered dataset is refused before a sample is read, never read with samples lost or doubled.

A split index whose entries were removed, repeated, replaced or recounted, or whose bytes were
edited in any other way, is not the one the manifest records (its size and SHA-256, its shards'
names and totals): :class:`IndexMismatchError` naming the split and the first entry that
disagrees, locally and over HTTP (tools/rangeserver.py on 127.0.0.1), ranged or whole-shard,
with ``verify=True`` too, and through a compact index. A manifest or index that sends the
reader outside the dataset's folder (an absolute path, ``../``, a link out of it,
``/etc/passwd``) is a :class:`LocationError` unless the user allows that place, and
``shardify verify`` reports the same.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import rangeserver  # tools/rangeserver.py (pytest's pythonpath holds tools/)

from shardify.convert import ShardWriter
from shardify.convert.verify import verify_dataset
from shardify.convert.write import finish
from shardify.errors import IndexMismatchError, LocationError, ManifestError
from shardify.reader import CacheOptions, DecodeOptions, ShardedDataset
from shardify.reader.io import compact as compact_io
from shardify.reader.io.sources import resolve_source

TIME_LIMIT_S = 120
"""A refusal comes at once: a test past this (seconds) hangs and fails (tests/conftest.py)."""


SHARDS, PER_SHARD = 8, 10
KEYS = {f"{i:09d}" for i in range(SHARDS * PER_SHARD)}


def _write(root: Path) -> None:
    with ShardWriter(root, samples_per_shard=PER_SHARD, fsync=False) as w:
        for i in range(SHARDS * PER_SHARD):
            w.write({"txt": chr(97 + i % 26) * (100 + i * 37 % 300), "cls": i % 5})


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One dataset read through its JSON index, one through its compact index (sidecars)."""
    out = {"json": tmp_path_factory.mktemp("json") / "ds"}
    _write(out["json"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(finish, "SIDECAR_ABOVE_SAMPLES", 0)
        out["compact"] = tmp_path_factory.mktemp("compact") / "ds"
        _write(out["compact"])
    return out


@pytest.fixture
def www(tmp_path: Path, pristine: dict[str, Path]) -> Callable[[str], Path]:
    """``make(kind)``: ``www/ds``, a fresh copy of the ``kind`` dataset, and ``www/other``, another copy."""

    def make(kind: str) -> Path:
        compact_io._facts.clear()  # a process remembers sidecars it checked: start as a new reader
        shutil.copytree(pristine[kind], tmp_path / "www" / "ds")
        shutil.copytree(pristine[kind], tmp_path / "www" / "other")
        return tmp_path / "www"

    return make


def _manifest(ds: Path) -> dict[str, Any]:
    return json.loads((ds / "manifest.json").read_text())


def _edit_manifest(ds: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    manifest = _manifest(ds)
    edit(manifest["splits"]["train"])
    (ds / "manifest.json").write_text(json.dumps(manifest))


def _index_path(ds: Path) -> Path:
    return ds / _manifest(ds)["splits"]["train"]["index"]


def _edit_index(ds: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Edit the split index the manifest names (and the copy wids opens, as a tamperer would)."""
    for path in (_index_path(ds), ds / "train.json"):
        index = json.loads(path.read_text())
        edit(index)
        path.write_text(json.dumps(index, indent=1))


def _replace(index: dict[str, Any]) -> None:
    index["shardlist"][3] = dict(index["shardlist"][2])


def _remove_last(index: dict[str, Any]) -> None:
    del index["shardlist"][-1]
    index["shardify"]["num_samples"] -= PER_SHARD


def _duplicate(index: dict[str, Any]) -> None:
    index["shardlist"].insert(5, dict(index["shardlist"][4]))
    index["shardify"]["num_samples"] += PER_SHARD


def _recount(index: dict[str, Any]) -> None:
    """One shard's count lowered by one, with what would tell (its table, the declared total) dropped."""
    del index["shardlist"][5]["samples"]
    index["shardlist"][5]["nsamples"] -= 1
    del index["shardify"]["num_samples"]


def _recount_keeping_the_table(index: dict[str, Any]) -> None:
    index["shardlist"][6]["nsamples"] -= 1


def _edit_checksum(index: dict[str, Any]) -> None:
    index["shardlist"][1]["sha256"] = hashlib.sha256(b"another shard").hexdigest()


TAMPERS: dict[str, tuple[Callable[[dict[str, Any]], None], int | None, str]] = {
    # name: (edit, the entry the error names (None: none can be), what the message says)
    "an entry replaced by another's": (_replace, 3, "-000002.tar' (shard 2's name)"),
    "the last entry removed": (_remove_last, SHARDS - 1, "missing from the index"),
    "an entry repeated": (_duplicate, 5, "-000004.tar' (shard 4's name)"),
    "a count lowered": (_recount, None, "79 samples"),
    "a count lowered, its table kept": (_recount_keeping_the_table, None, "-000006.tar"),
    "a checksum edited": (_edit_checksum, None, "SHA-256"),
}

MODES: dict[str, tuple[bool, dict[str, Any]]] = {
    # name: (over HTTP, ShardedDataset options)
    "local": (False, {}),
    "local, verify=True": (False, {"decoding": DecodeOptions(verify=True)}),
    "http, ranged": (True, {}),
    "http, whole shards": (True, {"cache": CacheOptions(ranged=False)}),
    "http, whole shards, verify=True": (
        True,
        {"cache": CacheOptions(ranged=False), "decoding": DecodeOptions(verify=True)},
    ),
}


def _keys(spec: str | Path, **options: Any) -> list[str]:
    ds = ShardedDataset(spec, batch_size=8, fields=("__key__",), **options)
    return [k for batch in ds for k in batch]


def _read(www: Path, http: bool, options: dict[str, Any]) -> Iterator[str | Path]:
    """The dataset ``www/ds`` as a reader names it: its folder, or its URL while served."""
    if not http:
        yield www / "ds"
        return
    with rangeserver.serve(www) as (base, _):
        yield f"{base}/ds"


@pytest.mark.parametrize("mode", MODES)
def test_the_untampered_dataset_reads_every_key_once_in_every_mode(www, mode: str) -> None:
    root = www("json")
    http, options = MODES[mode]
    for spec in _read(root, http, options):
        keys = _keys(spec, **options)
        assert sorted(keys) == sorted(KEYS)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tamper", TAMPERS)
def test_an_index_that_is_not_the_manifests_is_refused_naming_the_split_and_entry(www, tamper: str, mode: str) -> None:
    root = www("json")
    edit, entry, said = TAMPERS[tamper]
    _edit_index(root / "ds", edit)
    http, options = MODES[mode]
    for spec in _read(root, http, options):
        with pytest.raises(IndexMismatchError) as e:
            _keys(spec, **options)
        assert e.value.split == "train" and "split 'train'" in str(e.value)
        assert e.value.entry == entry and said in str(e.value)
        if entry is not None:
            assert f"entry {entry}" in str(e.value) or f"shard {entry}" in str(e.value)


@pytest.mark.parametrize("tamper", TAMPERS)
def test_shardify_verify_reports_each_tampered_index(www, tamper: str) -> None:
    root = www("json")
    _edit_index(root / "ds", TAMPERS[tamper][0])
    report = verify_dataset(root / "ds")
    assert not report.ok
    assert any(p.split == "train" and "split 'train'" in p.message for p in report.problems), report.problems


def test_an_index_edited_and_recorded_again_still_names_the_entry(www) -> None:
    """A manifest that records the edited index's digest: its shards' names and the totals still tell."""
    root = www("json")
    ds = root / "ds"
    _edit_index(ds, _replace)
    data = _index_path(ds).read_bytes()
    _edit_manifest(ds, lambda s: s.update(index_size=len(data), index_sha256=hashlib.sha256(data).hexdigest()))
    with pytest.raises(IndexMismatchError, match=r"entry 3 of the index names 'train-\w+-000002\.tar'") as e:
        _keys(ds)
    assert e.value.entry == 3


@pytest.mark.parametrize("missing", ["index_sha256", "index_size"])
def test_a_manifest_without_the_index_record_is_refused_naming_the_field(www, missing: str) -> None:
    root = www("json")
    _edit_manifest(root / "ds", lambda s: s.pop(missing))
    for spec in _read(root, False, {}):
        with pytest.raises(ManifestError, match=f"field '{missing}' is missing"):
            _keys(spec)
    with rangeserver.serve(root) as (base, _):
        with pytest.raises(ManifestError, match=f"field '{missing}' is missing"):
            _keys(f"{base}/ds")
    with pytest.raises(ManifestError, match=f"field '{missing}' is missing"):
        verify_dataset(root / "ds")  # as for any manifest it cannot use


# -- the compact index --------------------------------------------------------------------------


def _compact_path(ds: Path) -> Path:
    return ds / _manifest(ds)["splits"]["train"]["compact"]["index"]


def _drop_last_count(ds: Path) -> None:
    """The compact index with its last shard's count removed (and its header's totals made to
    agree), recorded again in the manifest: only the manifest's shard and sample totals tell."""
    import numpy as np

    from shardify import compactindex

    path = _compact_path(ds)
    old = compactindex.decode(path.read_bytes(), source=str(path))
    data = compactindex.encode(old.fields, np.asarray(old.counts[:-1]), old.root)
    path.write_bytes(data)
    _edit_manifest(ds, lambda s: s["compact"].update(size=len(data), sha256=hashlib.sha256(data).hexdigest()))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tamper", ["a byte edited", "a shard's count removed, recorded again"])
def test_a_tampered_compact_index_is_refused_naming_the_split(www, tamper: str, mode: str) -> None:
    root = www("compact")
    ds = root / "ds"
    if tamper == "a byte edited":
        data = bytearray(_compact_path(ds).read_bytes())
        data[-4] ^= 1  # the last shard's count
        _compact_path(ds).write_bytes(bytes(data))
    else:
        _drop_last_count(ds)
    http, options = MODES[mode]
    for spec in _read(root, http, options):
        with pytest.raises(IndexMismatchError) as e:
            _keys(spec, **options)
        assert e.value.split == "train" and "split 'train'" in str(e.value)
        if tamper != "a byte edited":
            assert e.value.entry == SHARDS - 1 and f"{SHARDS} shards" in str(e.value)
    assert not verify_dataset(ds).ok


def test_a_compact_splits_json_index_is_checked_by_verify(www) -> None:
    """The reader reads the compact index only; ``shardify verify`` checks the JSON one as well."""
    root = www("compact")
    _edit_index(root / "ds", _replace)
    assert sorted(_keys(root / "ds")) == sorted(KEYS)  # what the reader reads is whole
    problems = verify_dataset(root / "ds").problems
    assert any("entry 3" in p.message for p in problems), problems


# -- locations --------------------------------------------------------------------------------------


def _point_index(ds: Path, where: str) -> None:
    _edit_manifest(ds, lambda s: s.update(index=where))


@pytest.mark.parametrize("how", ["absolute", "dot-dot", "dot-dot to /etc/passwd", "a link"])
def test_a_local_manifest_cannot_send_the_reader_to_another_folders_index(www, how: str) -> None:
    root = www("json")
    ds, other = root / "ds", root / "other"
    name = _index_path(ds).name
    if how == "absolute":
        _point_index(ds, str(other / name))
    elif how == "dot-dot":
        _point_index(ds, f"../other/{name}")
    elif how == "dot-dot to /etc/passwd":
        _point_index(ds, "../" * len(ds.parts) + "etc/passwd")
    else:
        (ds / name).unlink()
        (ds / name).symlink_to(other / name)
    with pytest.raises(LocationError, match="refuses to read") as e:
        _keys(ds)
    assert ("/etc/passwd" if "passwd" in how else str(other / name)) in str(e.value)
    problems = verify_dataset(ds).problems
    assert any("refuses to read" in p.message for p in problems), problems
    if "passwd" not in how:  # the place allowed: read, as the user asked
        assert sorted(_keys(ds, cache=CacheOptions(allow_locations=(str(other),)))) == sorted(KEYS)
        assert verify_dataset(ds, allow_locations=(str(other),)).ok


@pytest.mark.parametrize("kind, what", [("json", "shard"), ("compact", "shard"), ("compact", "sidecar")])
def test_a_shard_or_sidecar_that_links_out_of_the_folder_is_refused_naming_it(www, kind: str, what: str) -> None:
    """A JSON split's shards are checked when it is opened; a compact split's (and their sidecars)
    when each is first read."""
    root = www(kind)
    ds, other = root / "ds", root / "other"
    index = json.loads(_index_path(ds).read_text())
    shard = index["shardlist"][3]["url"]
    name = shard if what == "shard" else shard + ".idx"
    (ds / name).unlink()
    (ds / name).symlink_to(other / name)  # the same bytes, elsewhere
    with pytest.raises(LocationError, match="refuses to read") as e:
        _keys(ds)
    assert name in str(e.value) and f"(which is {other / name})" in str(e.value)
    problems = verify_dataset(ds).problems
    assert any("refuses to read" in p.message and name in p.message for p in problems), problems
    compact_io._facts.clear()
    assert sorted(_keys(ds, cache=CacheOptions(allow_locations=(str(other),)))) == sorted(KEYS)


@pytest.mark.parametrize("where", ["{other}/{name}", "../other/{name}", "/etc/passwd"])
def test_a_split_index_named_directly_keeps_its_shards_in_its_folder(www, where: str) -> None:
    """An index read without a manifest (named by the user) is held to its own folder too."""
    root = www("json")
    ds, other = root / "ds", root / "other"
    index = ds / "train.json"
    obj = json.loads(index.read_text())
    obj["shardlist"][2]["url"] = where.format(other=other, name=obj["shardlist"][2]["url"])
    index.write_text(json.dumps(obj))
    with pytest.raises(LocationError, match="refuses to read"):
        _keys(index)
    assert not verify_dataset(index).ok


def test_over_http_a_manifest_cannot_send_the_reader_elsewhere_either(www) -> None:
    root = www("json")
    name = _index_path(root / "ds").name
    _point_index(root / "ds", f"../other/{name}")
    with rangeserver.serve(root) as (base, _):
        with pytest.raises(LocationError, match="refuses to read"):
            _keys(f"{base}/ds")
        assert not verify_dataset(f"{base}/ds").ok


def test_a_dataset_folder_reached_through_a_link_is_read_as_usual(www, tmp_path: Path) -> None:
    """Links are resolved on both sides: a link to the whole folder is the folder."""
    root = www("json")
    os.symlink(root / "ds", tmp_path / "alias")
    assert sorted(_keys(tmp_path / "alias")) == sorted(KEYS)
    assert verify_dataset(tmp_path / "alias").ok
    assert len(resolve_source(tmp_path / "alias").shards) == SHARDS
