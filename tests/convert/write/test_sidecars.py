"""The writer's sidecars (``<shard>.idx``, :mod:`shardify.sidecar`): a split over the threshold
keeps its per-sample tables beside its shards, not in its JSON index; the shards stay plain tars
(tar and webdataset read them); ``shardify gc`` keeps the current ones and removes the old;
``shardify verify`` checks them against the index and the shards' bytes."""

from __future__ import annotations

import hashlib
import json
import subprocess
import zlib
from pathlib import Path

import pytest
from builders import text_dataset

from shardify.cli import main as cli_main
from shardify.convert.synth import make_imagefolder
from shardify.convert.verify import verify_dataset
from shardify.convert.write import finish
from shardify.convert.write.run import convert_imagefolder
from shardify.convert.write.versions import collect_garbage
from shardify.manifest import Manifest
from shardify.reader import ShardedDataset
from shardify.sidecar import HEADER, SIDECAR_RECORD, decode


def _dataset(root: Path, n: int = 20, *, fsync: bool = False) -> Path:
    return text_dataset(root, n, base=200, spread=500, classes=3, fsync=fsync)


def _index(root: Path) -> Path:
    return root / json.loads((root / "manifest.json").read_text())["splits"]["train"]["index"]


@pytest.fixture
def sidecars(monkeypatch: pytest.MonkeyPatch) -> None:
    """Splits of more than 19 samples keep their tables in sidecars."""
    monkeypatch.setattr(finish, "SIDECAR_ABOVE_SAMPLES", 19)


def test_a_split_over_the_threshold_keeps_its_tables_in_sidecars(tmp_path: Path, sidecars: None) -> None:
    big, small = _dataset(tmp_path / "big"), _dataset(tmp_path / "small", n=19)
    assert all("samples" in e and "sidecar" not in e for e in json.loads(_index(small).read_text())["shardlist"])
    assert not list(small.glob("*.idx"))
    entries = json.loads(_index(big).read_text())["shardlist"]
    assert entries == json.loads((big / "train.json").read_text())["shardlist"]  # the wids copy too
    for e in entries:
        data = (big / f"{e['url']}.idx").read_bytes()
        assert "samples" not in e and e["sidecar"] == {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        table = decode(data, shard=e["url"], ref=None, nsamples=e["nsamples"], filesize=e["filesize"])
        shard = (big / e["url"]).read_bytes()
        assert [a for a, _, _ in table.ranges()][::32] == e["offsets"]
        ranges = table.ranges()
        assert all(hashlib.sha256(shard[a:b]).digest()[:16] == d for a, b, d in ranges)
        assert all(zlib.crc32(shard[a:b]) == ranges.crcs[i] for i, (a, b, _) in enumerate(ranges))
    assert verify_dataset(big).ok
    keys = [k for batch in ShardedDataset(big, batch_size=5, fields=("__key__",)) for k in batch]
    assert sorted(keys) == [f"{i:09d}" for i in range(20)]


def test_shards_with_sidecars_are_plain_tars_to_tar_and_webdataset(tmp_path: Path, sidecars: None) -> None:
    import webdataset as wds

    out = _dataset(tmp_path / "ds")
    shards = sorted(out.glob("train-*.tar"))
    assert sorted(out.glob("*.idx")) == [p.with_name(p.name + ".idx") for p in shards]
    listed = subprocess.run(["tar", "tf", str(shards[0])], check=True, capture_output=True, text=True).stdout.split()
    assert listed == [f"{i:09d}.{ext}" for i in range(8) for ext in ("cls", "txt")]
    got = [s["__key__"] for s in wds.WebDataset([str(p) for p in shards], shardshuffle=False)]
    assert got == [f"{i:09d}" for i in range(20)]


def test_verify_names_a_tampered_sidecar(
    tmp_path: Path, sidecars: None, capsys: pytest.CaptureFixture[str], record_index
) -> None:
    out = _dataset(tmp_path / "ds")
    entry = json.loads(_index(out).read_text())["shardlist"][1]
    idx = out / f"{entry['url']}.idx"
    data = bytearray(idx.read_bytes())
    data[HEADER.size + 3 * SIDECAR_RECORD.size + 12] ^= 0xFF  # the checksum of sample 3 (after its offset and length)
    idx.write_bytes(bytes(data))
    report = verify_dataset(out)
    assert [(p.shard, "sha256" in p.message) for p in report.problems] == [(entry["url"], True)]
    assert cli_main(["verify", str(out)]) != 0
    assert entry["url"] in "".join(capsys.readouterr())
    for name in (_index(out), out / "train.json"):  # an index that agrees with the tampered sidecar
        obj = json.loads(name.read_text())
        obj["shardlist"][1]["sidecar"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        name.write_text(json.dumps(obj))
    record_index(out)  # and a manifest that agrees with that index
    problems = verify_dataset(out).problems  # the root still tells, and the sample's bytes do
    assert [(p.shard, p.key) for p in problems] == [(entry["url"], None), (entry["url"], f"{8 + 3:09d}")]
    assert "does not belong" in problems[0].message and "per-sample checksum" in problems[1].message


def test_verify_checks_the_compact_index_against_the_json_index(tmp_path: Path, sidecars: None) -> None:
    out = _dataset(tmp_path / "ds")
    name = json.loads((out / "manifest.json").read_text())["splits"]["train"]["compact"]["index"]
    assert verify_dataset(out).ok
    data = bytearray((out / name).read_bytes())
    data[-12] += 1  # one more sample in shard 0, one fewer in shard 2: the same sum
    data[-4] -= 1
    (out / name).write_bytes(bytes(data))
    assert [(p.shard, "sha256" in p.message) for p in verify_dataset(out).problems] == [(name, True)]
    manifest = json.loads((out / "manifest.json").read_text())  # a manifest that agrees with the change
    manifest["splits"]["train"]["compact"]["sha256"] = hashlib.sha256(data).hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest))
    problems = verify_dataset(out).problems
    assert [(p.shard, p.message) for p in problems] == [(name, "its shard counts are not the JSON index's")]


def test_gc_keeps_the_current_sidecars_and_removes_old_ones(tmp_path: Path, options, monkeypatch) -> None:
    monkeypatch.setattr(finish, "SIDECAR_ABOVE_SAMPLES", 0)
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=4, sizes=((32, 24),))
    out = tmp_path / "out"
    convert_imagefolder(src, out, options=options(samples_per_shard=3))
    old = Manifest.load(out).splits["train"].version
    convert_imagefolder(src, out, options=options(samples_per_shard=4, overwrite=True))
    current = Manifest.load(out).splits["train"].version
    assert len(list(out.glob(f"train-{old}-*.tar.idx"))) == 3 and len(list(out.glob(f"train-{current}-*.idx"))) == 2
    removed = collect_garbage(out).removed
    assert {n for n in removed if n.endswith(".idx")} == {f"train-{old}-{i:06d}.tar.idx" for i in range(3)}
    assert sorted(p.name for p in out.glob("*.idx")) == [f"train-{current}-{i:06d}.tar.idx" for i in range(2)]
    assert f"train-{old}.cidx" in removed and sorted(p.name for p in out.glob("*.cidx")) == [f"train-{current}.cidx"]
    assert verify_dataset(out).ok


def test_an_unlisted_version_s_sidecars_go_with_its_shards(tmp_path: Path, options, monkeypatch) -> None:
    """Killed after its sidecars and index, before the manifest: the next, different conversion
    removes the abandoned version's sidecars as it removes its shards; the listed ones stay."""
    from shardify.convert.write import session

    monkeypatch.setattr(finish, "SIDECAR_ABOVE_SAMPLES", 0)
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=4, sizes=((32, 24),))
    out = tmp_path / "out"
    convert_imagefolder(src, out, options=options(samples_per_shard=3))
    listed = Manifest.load(out).splits["train"].version

    def crash(*a: object, **k: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as mp:
        mp.setattr(session, "publish_splits", crash)
        with pytest.raises(KeyboardInterrupt):
            convert_imagefolder(src, out, options=options(samples_per_shard=2, overwrite=True))
    abandoned = {p.name for p in out.glob("*.idx")} - {p.name for p in out.glob(f"train-{listed}-*.idx")}
    assert len(abandoned) == 4
    convert_imagefolder(src, out, options=options(samples_per_shard=1, overwrite=True))
    current = Manifest.load(out).splits["train"].version
    assert {p.name for p in out.glob("*.idx")} == {
        *(f"train-{listed}-{i:06d}.tar.idx" for i in range(3)),
        *(f"train-{current}-{i:06d}.tar.idx" for i in range(8)),
    }


def test_each_sidecar_is_fsynced_and_in_place_before_the_index_that_names_it(
    tmp_path: Path, sidecars: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from shardify import jsonfiles

    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        real_fsync(fd)

    def replace(a: str, b: str) -> None:
        events.append(("rename", os.path.basename(str(b))))
        real_replace(a, b)

    monkeypatch.setattr(jsonfiles.os, "fsync", fsync)
    monkeypatch.setattr(jsonfiles.os, "replace", replace)
    out = _dataset(tmp_path / "ds", fsync=True)
    names = sorted(p.name for p in out.glob("*.idx"))
    index = _index(out).name
    compact = json.loads((out / "manifest.json").read_text())["splits"]["train"]["compact"]["index"]
    assert len(names) == 3
    for name in names:
        synced = [i for i, (kind, f) in enumerate(events) if kind == "fsync" and f.startswith(f".{name}.")]
        assert synced and synced[0] < events.index(("rename", name)) < events.index(("rename", compact))
    assert (
        events.index(("rename", compact)) < events.index(("rename", index)) < events.index(("rename", "manifest.json"))
    )
    events.clear()
    _dataset(tmp_path / "nosync", fsync=False)  # sidecars follow the conversion's fsync option
    assert not [f for kind, f in events if kind == "fsync" and ".idx." in f]
    assert [f for kind, f in events if kind == "rename" and f.endswith(".idx")]
