"""Audit of the converter's promises that no other test pinned (docs/audit.md).

"Never half-written" (README, docs/reliability.md "Converter speed without losing durability"):
every writer (the CLI's planned shards, ``ShardWriter``, ``convert_items``) fsyncs each shard
before renaming it into place, writes the split index durably, makes the renames durable
(the folder is fsynced), and only then writes the manifest. And "standard tar files"
(docs/format.md, "Shards"): fixed header fields, members of a sample adjacent and ordered by
extension, two zero blocks at the end, from every writer.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from shardify.convert import ShardWriter, convert_items
from shardify.convert.options import ConvertOptions
from shardify.convert.synth import make_imagefolder
from shardify.convert.write.run import convert_imagefolder
from shardify.manifest import MANIFEST_NAME
from shardify.tarfmt import BLOCK

TIME_LIMIT_S = 60


def _sample(i: int) -> dict[str, object]:
    return {"__key__": f"k{i:03d}", "npy": np.full((2, 3), i, dtype=np.uint8), "cls": i % 3, "txt": "t" * (i % 4)}


def _items_fn(i: int) -> dict[str, object]:
    return _sample(i)


def _write_imagefolder(tmp_path: Path) -> Path:
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=4, sizes=((32, 24),))
    convert_imagefolder(src, tmp_path / "out", options=ConvertOptions(workers=1, progress=False, samples_per_shard=3))
    return tmp_path / "out"


def _write_shardwriter(tmp_path: Path) -> Path:
    with ShardWriter(tmp_path / "out", samples_per_shard=3, shard_size=None) as w:
        for i in range(8):
            w.write(_sample(i))
    return tmp_path / "out"


def _write_items(tmp_path: Path) -> Path:
    convert_items(
        range(8), _items_fn, tmp_path / "out", samples_per_shard=3, shard_size=None, workers=2, progress=False
    )
    return tmp_path / "out"


WRITERS: dict[str, Callable[[Path], Path]] = {
    "imagefolder": _write_imagefolder,
    "shard-writer": _write_shardwriter,
    "convert-items": _write_items,
}


@pytest.mark.parametrize("writer", list(WRITERS))
def test_every_writer_makes_shards_index_and_folder_durable_before_the_manifest(
    tmp_path: Path, monkeypatch, writer: str
) -> None:
    """Events seen by the calling process: ``("fsync", path)`` and ``("rename", src, dst)``."""
    events: list[tuple[str, ...]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(a: object, b: object) -> None:
        events.append(("rename", os.fspath(a), os.fspath(b)))  # type: ignore[arg-type]
        real_replace(a, b)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    out = WRITERS[writer](tmp_path).resolve()

    def renamed_to(name: str) -> int:
        return next(i for i, e in enumerate(events) if e[0] == "rename" and os.path.basename(e[2]) == name)

    def fsynced(pred: Callable[[str], bool]) -> list[int]:
        return [i for i, e in enumerate(events) if e[0] == "fsync" and pred(e[1])]

    manifest = renamed_to(MANIFEST_NAME)
    assert fsynced(lambda p: os.path.basename(p).startswith(f".{MANIFEST_NAME}.")), "the manifest is not fsynced"
    shards = sorted(p.name for p in out.glob("train-*.tar"))
    assert len(shards) == 3, shards
    for name in shards:
        rename = renamed_to(name)
        before = fsynced(lambda p, name=name: os.path.basename(p) == f".{name}.tmp")
        assert before and before[0] < rename, f"{writer}: {name} renamed into place before it was fsynced"
        assert rename < manifest, f"{writer}: {name} renamed after the manifest"
    index = next(p.name for p in out.glob("train-*.json"))  # the versioned split index the manifest names
    index_synced = fsynced(lambda p: os.path.basename(p).startswith(f".{index}."))
    assert index_synced and index_synced[0] < renamed_to(index) < manifest, (
        f"{writer}: the split index {index} is not durable before the manifest"
    )
    last_shard = max(renamed_to(name) for name in shards)
    folder = [i for i in fsynced(lambda p: p == str(out)) if last_shard < i < manifest]
    assert folder, f"{writer}: the folder is not fsynced between the last shard's rename and the manifest"


@pytest.mark.parametrize("writer", list(WRITERS))
def test_shards_are_plain_ustar_with_fixed_fields_and_two_zero_blocks_at_the_end(tmp_path: Path, writer: str) -> None:
    out = WRITERS[writer](tmp_path)
    shards = sorted(out.glob("train-*.tar"))
    assert shards
    for path in shards:
        data = path.read_bytes()
        assert len(data) % BLOCK == 0, f"{path.name}: {len(data)} bytes, not whole 512-byte blocks"
        assert data[-2 * BLOCK :] == bytes(2 * BLOCK), f"{path.name} does not end with two zero blocks"
        with tarfile.open(path) as tar:
            members = tar.getmembers()
        assert sum(BLOCK + -(-m.size // BLOCK) * BLOCK for m in members) + 2 * BLOCK == len(data), (
            f"{path.name}: bytes beyond its members and the two end blocks"
        )
        for m in members:
            assert (m.isreg(), m.mode, m.uid, m.gid, m.uname, m.gname, m.mtime) == (True, 0o644, 0, 0, "", "", 0), (
                f"{path.name}: {m.name} has header fields {m.mode:o} {m.uid} {m.gid} {m.uname!r} {m.gname!r} {m.mtime}"
            )
            assert not m.pax_headers and len(m.name) <= 100
        keys = [m.name.split(".", 1)[0] for m in members]
        runs = [k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]
        assert len(runs) == len(set(runs)), f"{path.name}: the members of a sample are not adjacent"
        for key in runs:
            exts = [m.name.split(".", 1)[1] for m in members if m.name.split(".", 1)[0] == key]
            assert exts == sorted(exts, key=str.encode), f"{path.name}: {key}'s members not in extension order"


def test_a_link_into_a_sibling_whose_name_extends_the_roots_is_outside(tmp_path: Path) -> None:
    """README: "Symbolic links are followed only inside SRC". ``/x/src-extra`` starts with the
    characters of ``/x/src`` but is not inside it (a prefix test without the separator lets it in)."""
    from shardify.convert.synth import jpeg_bytes, natural_image

    root = tmp_path / "src"
    (root / "a").mkdir(parents=True)
    (root / "a" / "real.jpg").write_bytes(jpeg_bytes(natural_image(16, 12, seed=1), quality=80))
    sibling = tmp_path / "src-extra"
    sibling.mkdir()
    (sibling / "secret.jpg").write_bytes(jpeg_bytes(natural_image(16, 12, seed=2), quality=80))
    (root / "a" / "sibling_file.jpg").symlink_to(sibling / "secret.jpg")
    (root / "a" / "sibling_dir").symlink_to(sibling)
    result = convert_imagefolder(root, tmp_path / "out", options=ConvertOptions(workers=1, progress=False, fsync=False))
    summary = result.splits["train"]
    reasons = {p.path: p.reason for p in summary.skipped}
    assert reasons.get("a/sibling_file.jpg") == "symbolic link points outside the source root", reasons
    assert reasons.get("a/sibling_dir") == "symbolic link points outside the source root", reasons
    assert summary.samples == 1


def test_num_classes_n_makes_label_n_out_of_range_and_keeps_n_minus_1(tmp_path: Path) -> None:
    """README: "a label out of range (--num-classes) is skipped and listed"; the range is 0..N-1."""
    import json

    from shardify.convert.write.run import convert_ids

    src = tmp_path / "data"
    src.mkdir()
    for i in ("a", "b", "c"):
        (src / f"{i}.txt").write_text(i)
    (tmp_path / "p.json").write_text(json.dumps({"train": ["a", "b", "c"]}))
    (tmp_path / "l.json").write_text(json.dumps({"a": 0, "b": 4, "c": 5}))
    result = convert_ids(
        src,
        tmp_path / "out",
        partition=tmp_path / "p.json",
        labels=tmp_path / "l.json",
        options=ConvertOptions(workers=1, progress=False, fsync=False, num_classes=5),
    )
    summary = result.splits["train"]
    assert {p.path: p.reason for p in summary.skipped} == {"c": "label 5 out of range (0..4)"}
    assert summary.samples == 2
    lines = [json.loads(x) for x in (tmp_path / "out" / "train.report.jsonl").read_text().splitlines()]
    assert {"kind": "skipped", "path": "c", "reason": "label 5 out of range (0..4)"} in lines


@pytest.mark.parametrize("writer", ["ids", "shard-writer"])
def test_a_sample_larger_than_the_bound_gets_a_shard_of_its_own(tmp_path: Path, writer: str) -> None:
    """README "Shard size": "A single sample larger than the bound gets a shard of its own."
    The first sample is the big one: no empty shard may come before it."""
    import json

    from shardify.convert.write.run import convert_ids

    sizes = {"a": 40_000, "b": 1_000, "c": 1_000, "d": 1_000}
    out = tmp_path / "out"
    if writer == "ids":
        src = tmp_path / "data"
        src.mkdir()
        for name, n in sizes.items():
            (src / f"{name}.txt").write_text("x" * n)
        (tmp_path / "p.json").write_text(json.dumps({"train": list(sizes)}))
        (tmp_path / "l.json").write_text(json.dumps({name: 0 for name in sizes}))
        convert_ids(
            src,
            out,
            partition=tmp_path / "p.json",
            labels=tmp_path / "l.json",
            options=ConvertOptions(
                workers=1,
                progress=False,
                fsync=False,
                shuffle=False,
                min_shards=1,
                shard_size=16_000,
                samples_per_shard=None,
            ),
        )
    else:
        with ShardWriter(out, shard_size=16_000, samples_per_shard=None, fsync=False) as w:
            for name, n in sizes.items():
                w.write({"__key__": name, "txt": "x" * n, "cls": 0})
    shards = json.loads((out / "train.json").read_text())["shardlist"]
    assert [s["nsamples"] for s in shards] == [1, 3], shards
    assert sorted(p.name for p in out.glob("train-*.tar")) == sorted(s["url"] for s in shards)
    assert shards[1]["filesize"] <= 16_000
