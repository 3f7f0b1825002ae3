"""Dataset versions: converting again never changes bytes a reader may be reading.

A conversion names its files with a version token from its plan, the manifest switches to
it at once, earlier versions stay until ``shardify gc``, and a reader keeps the version it
opened (or raises, naming both versions, once that version is gone).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shardify.cli import EXIT_OK, main
from shardify.convert.synth import make_imagefolder
from shardify.convert.write.outfs import open_output
from shardify.convert.write.run import convert_imagefolder
from shardify.convert.write.versions import collect_garbage, folder_state
from shardify.errors import DatasetVersionError, ManifestError, OutputExistsError
from shardify.jsonfiles import json_bytes
from shardify.manifest import Manifest
from shardify.reader import BatchOptions
from shardify.splitindex import SplitIndex

TIME_LIMIT_S = 120
"""A hang fails the test instead of stalling the run (see tests/conftest.py)."""


def _path(sample: dict[str, Any]) -> str:
    """The source path of a sample: the same image has the same path in every version."""
    return sample["json"]["path"]  # map gets each field decoded


def _epoch(loader: Any, ds: Any, epoch: int) -> list[str]:
    ds.set_epoch(epoch)
    return [p for batch in loader for p in batch]


def _version(out: Path) -> str:
    return Manifest.load(out).splits["train"].version


def _killed_before_the_report(src: Path, out: Path, options: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A conversion interrupted after writing every shard, before its report, index and manifest."""
    from shardify.convert.write import finish

    def crash(*a: object, **k: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as mp:
        mp.setattr(finish, "write_report", crash)
        with pytest.raises(KeyboardInterrupt):
            convert_imagefolder(src, out, options=options)


def test_reconversion_between_epochs_never_mixes_versions(tmp_path: Path, options) -> None:
    from shardify.reader import ShardedDataset, make_loader

    src = make_imagefolder(tmp_path / "src", classes=3, per_class=10, sizes=((32, 24),))
    out = tmp_path / "out"
    convert_imagefolder(src, out, options=options(samples_per_shard=4))
    first_version = _version(out)
    ds = ShardedDataset(out, batch_size=4, shuffle=True, map=_path, batching=BatchOptions(collate_fn=list))
    assert ds.source.version == first_version
    loader = make_loader(ds, num_workers=2)  # persistent workers, the default
    try:
        first = _epoch(loader, ds, 0)
        assert len(first) == 30 and len(set(first)) == 30
        # Converted again while the workers hold the first version's layouts: other inputs
        # (5 removed, 3 added) and another seed, so every shard's bytes change.
        removed = sorted(p for p in src.rglob("*") if p.is_file())
        for p in removed[:5]:
            p.unlink()
        for i, p in enumerate(removed[5:8]):
            (p.parent / f"new{i}{p.suffix}").write_bytes(p.read_bytes())
        result = convert_imagefolder(src, out, options=options(samples_per_shard=4, seed=1, overwrite=True))
        second_version = _version(out)
        assert second_version != first_version
        assert any("shardify gc" in n and first_version in n for n in result.splits["train"].notes)
        # The next epoch reads the version it opened, exactly once: no sample of the new one.
        second = _epoch(loader, ds, 1)
        assert sorted(second) == sorted(first)
        # Once the old version is removed, reading it raises, naming the dataset and both versions.
        removed_files = collect_garbage(out).removed
        assert removed_files and all(first_version in name for name in removed_files)
        with pytest.raises(DatasetVersionError) as caught:
            _epoch(loader, ds, 2)
        message = str(caught.value)
        assert str(out) in message and first_version in message and second_version in message, message
    finally:
        loader.close()
    fresh = ShardedDataset(out, batch_size=4, map=_path, batching=BatchOptions(collate_fn=list))
    got = [p for batch in fresh for p in batch]
    assert fresh.source.version == second_version and len(got) == 28 and len(set(got)) == 28
    assert not set(got) & {str(p.relative_to(src)) for p in removed[:5]}


def test_the_same_conversion_keeps_its_names_and_bytes(tmp_path: Path, options, tree_bytes) -> None:
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=4, sizes=((32, 24),))
    out = tmp_path / "out"
    convert_imagefolder(src, out, options=options(samples_per_shard=3))
    before = tree_bytes(out)
    result = convert_imagefolder(src, out, options=options(samples_per_shard=3, overwrite=True))
    assert tree_bytes(out) == before  # same version, same names, same bytes: nothing a reader sees changes
    assert not any("gc" in n for n in result.splits["train"].notes)
    index = SplitIndex.load(out / "train.json")
    assert (out / f"train-{index.version}.json").read_bytes() == (out / "train.json").read_bytes()
    assert [s.url for s in index.shards] == [f"train-{index.version}-{i:06d}.tar" for i in range(3)]
    with pytest.raises(OutputExistsError):
        convert_imagefolder(src, out, options=options(samples_per_shard=3))


def test_a_killed_reconversion_keeps_the_old_version_listed_and_resumes(
    tmp_path: Path, options, tree_bytes, monkeypatch
) -> None:
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=4, sizes=((32, 24),))
    out, ref = tmp_path / "out", tmp_path / "ref"
    convert_imagefolder(src, out, options=options(samples_per_shard=3))
    old_manifest = (out / "manifest.json").read_bytes()
    _killed_before_the_report(src, out, options(samples_per_shard=2, overwrite=True), monkeypatch)
    assert (out / "manifest.json").read_bytes() == old_manifest  # readers still get the old version, whole
    with pytest.raises(OutputExistsError):  # the new one is not finished: replacing still needs the flag
        convert_imagefolder(src, out, options=options(samples_per_shard=2))
    result = convert_imagefolder(src, out, options=options(samples_per_shard=2, overwrite=True))
    assert result.splits["train"].reused_shards == 4
    collect_garbage(out)
    convert_imagefolder(src, ref, options=options(samples_per_shard=2))
    assert tree_bytes(out) == tree_bytes(ref)


def test_an_abandoned_unlisted_version_is_removed_by_the_next_conversion(tmp_path: Path, options, monkeypatch) -> None:
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=4, sizes=((32, 24),))
    out = tmp_path / "out"
    convert_imagefolder(src, out, options=options(samples_per_shard=3))
    listed = _version(out)
    _killed_before_the_report(src, out, options(samples_per_shard=2, overwrite=True), monkeypatch)
    abandoned = {p.name for p in out.glob("train-*.tar")} - {p.name for p in out.glob(f"train-{listed}-*.tar")}
    assert len(abandoned) == 4
    convert_imagefolder(src, out, options=options(samples_per_shard=1, overwrite=True))
    names = {p.name for p in out.glob("train-*.tar")}
    assert not names & abandoned, "a version no manifest listed is nobody's: it goes"
    assert len(list(out.glob(f"train-{listed}-*.tar"))) == 3, "the listed one stays for its readers"


def test_gc_keeps_the_current_version_and_unfinished_work(tmp_path: Path, options, monkeypatch, capsys) -> None:
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=4, sizes=((32, 24),))
    out = tmp_path / "out"
    convert_imagefolder(src, out, options=options(samples_per_shard=3))
    convert_imagefolder(src, out, options=options(samples_per_shard=4, overwrite=True))
    current = _version(out)
    _killed_before_the_report(src, out, options(samples_per_shard=2, overwrite=True), monkeypatch)
    (out / "notes.txt").write_text("the user's own file")
    state = folder_state(open_output(out))
    unfinished = state.in_progress["train"]
    assert len(state.old_versions("train")) == 1 and unfinished != current
    assert main(["gc", str(out), "--dry-run"]) == EXIT_OK
    assert len(list(out.glob("train-*.tar"))) == 3 + 2 + 4
    assert main(["gc", str(out)]) == EXIT_OK
    assert "removed 4 files" in capsys.readouterr().out
    assert {p.name.split("-")[1] for p in out.glob("train-*.tar")} == {current, unfinished}
    assert (out / "notes.txt").exists()
    result = convert_imagefolder(src, out, options=options(samples_per_shard=2, overwrite=True))
    assert result.splits["train"].reused_shards == 4


def test_format_1_indexes_still_load_and_a_manifest_without_the_index_record_is_refused(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(
        json.dumps(
            {
                "format": "shardify",
                "format_version": 1,
                "splits": {"train": {"index": "train.json", "samples": 1, "shards": 1, "bytes": 3072}},
            }
        )
    )
    (tmp_path / "train.json").write_text(
        json.dumps(
            {
                "__kind__": "wids-shard-index-v1",
                "wids_version": 1,
                "name": "train",
                "shardlist": [{"url": "train-000000.tar", "nsamples": 1, "filesize": 3072, "sha256": ""}],
                "shardify": {"format_version": 1, "split": "train", "num_samples": 1, "classes": []},
            }
        )
    )
    with pytest.raises(ManifestError, match="fields 'index_size' and 'index_sha256' are missing"):
        Manifest.load(tmp_path)  # a manifest that cannot vouch for its index
    index = SplitIndex.load(tmp_path / "train.json")
    assert index.version is None and index.shards[0].url == "train-000000.tar"
    Manifest(splits={}).with_split("train", index).save(tmp_path)
    manifest = Manifest.load(tmp_path)
    assert manifest.splits["train"].version is None and manifest.splits["train"].index == "train.json"
    (tmp_path / "train.json").write_bytes(json_bytes(index.to_json()))
    assert manifest.load_split(tmp_path, "train") == index


@pytest.mark.parametrize(
    "name, split, want",
    [
        pytest.param("train-3f2a9c1d0b7e-000007.tar", "train", ("3f2a9c1d0b7e", 7), id="versioned"),
        pytest.param("train-000007.tar", "train", (None, 7), id="format-1"),
        pytest.param("train-extra-000007.tar", "train", None, id="another-split"),
        pytest.param("train-3f2a9c1d0b7e-000007.tar", "train-3f2a9c1d0b7e", (None, 7), id="split-named-like-a-version"),
        pytest.param("train-3F2A9C1D0B7E-000007.tar", "train", None, id="upper-case"),
        pytest.param("train-3f2a9c1d0b7e-07.tar", "train", None, id="short-index"),
        pytest.param("train-3f2a9c1d0b7e.json", "train", None, id="index"),
    ],
)
def test_shard_names_parse_back_per_split(name: str, split: str, want: tuple[str | None, int] | None) -> None:
    from shardify.tarfmt import shard_name, shard_of_split

    assert shard_of_split(name, split) == want
    if want is not None:
        assert shard_name(split, want[1], want[0]) == name
