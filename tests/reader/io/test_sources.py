"""Sources: dataset directories, manifests, split indexes, shard lists and patterns, .tgz,
shards written by webdataset's TarWriter and by GNU tar."""

from __future__ import annotations

import gzip
import logging
import subprocess
import tarfile
from pathlib import Path

import pytest

from shardify.errors import ManifestError
from shardify.reader import BatchOptions, SamplingOptions, ShardedDataset
from shardify.reader.io.sources import expand_shards, resolve_source


def values(ds: ShardedDataset) -> list[int]:
    return sorted(int(x) for batch in ds for x in batch)


def test_dataset_directory_manifest_and_index_resolve_alike(counting_dataset):
    root = counting_dataset([3, 4])
    for spec in (root, root / "manifest.json", root / "train.json", str(root)):
        src = resolve_source(spec)
        assert src.split == "train" and src.sizes == [3, 4] and src.unique_keys
        assert [Path(s.url).name for s in src.shards] == ["train-000000.tar", "train-000001.tar"]


def test_split_is_required_when_there_are_several(tmp_path, shards):
    root = tmp_path / "ds"
    shards.write_dataset(root, shards.counting([2]), split="train")
    shards.write_dataset(root, shards.counting([5]), split="val")
    with pytest.raises(ManifestError, match=r"splits: \['train', 'val'\]"):
        resolve_source(root)
    assert resolve_source(root, split="val").sizes == [5]
    with pytest.raises(ManifestError, match="no split 'test'"):
        resolve_source(root, split="test")
    with pytest.raises(ManifestError, match="not 'val'"):
        resolve_source(root / "train.json", split="val")


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param("https://example.invalid/ds", id="url"),
        pytest.param("notes.txt", id="not-a-dataset"),
    ],
)
def test_unusable_sources_say_why(spec, tmp_path):
    from shardify.remote import RetryPolicy

    no_retries = RetryPolicy(retries=0, timeout_s=5.0)  # no waiting on a machine without DNS
    with pytest.raises(ManifestError, match="example.invalid|notes.txt"):
        resolve_source(spec if "://" in spec else str(tmp_path / spec), retry=no_retries)


def test_brace_pattern_and_list_are_counted_and_logged(counting_dataset, caplog):
    root = counting_dataset([7, 2, 13])
    pattern = str(root / "train-{000000..000002}.tar")
    assert len(expand_shards(pattern)) == 3
    with caplog.at_level(logging.INFO, logger="shardify.reader"):
        src = resolve_source(pattern)
    assert src.sizes == [7, 2, 13] and not src.unique_keys and src.split is None
    assert "counted 22 samples in 3 shards" in caplog.text and "train-000002.tar=13" in caplog.text
    listed = resolve_source([root / "train-000001.tar", str(root / "train-000000.tar")])
    assert listed.sizes == [2, 7]
    ds = ShardedDataset(pattern, batch_size=5, fields=("cls",))
    assert values(ds) == list(range(22))


@pytest.mark.parametrize("suffix", [".tgz", ".tar.gz"])
def test_gzip_shards_read_like_plain_ones(counting_dataset, tmp_path, suffix):
    root = counting_dataset([7, 2, 13])
    for i in range(3):
        data = (root / f"train-{i:06d}.tar").read_bytes()
        (tmp_path / f"part-{i}{suffix}").write_bytes(gzip.compress(data, mtime=0))
    ds = ShardedDataset(
        str(tmp_path / ("part-{0..2}" + suffix)),
        batch_size=4,
        fields=("cls",),
        shuffle=True,
        sampling=SamplingOptions(shuffle_block=3, shuffle_buffer=5),
    )
    assert ds.source.sizes == [7, 2, 13]
    assert values(ds) == list(range(22))


def test_webdataset_tarwriter_shards(tmp_path):
    import webdataset as wds

    for s in range(2):
        with wds.TarWriter(str(tmp_path / f"wds-{s}.tar")) as sink:
            for i in range(5):
                g = s * 5 + i
                sink.write({"__key__": f"dir.d/sample{i:04d}", "cls": g, "seg.txt": f"text {g}"})
    ds = ShardedDataset(
        str(tmp_path / "wds-{0..1}.tar"),
        batch_size=3,
        fields=("cls", "seg.txt"),
        batching=BatchOptions(collate_fn=list),
    )
    samples = [s for batch in ds for s in batch]
    assert sorted(samples)[:10] == [(g, f"text {g}") for g in range(10)]
    ours = sorted(c for c, _ in samples[:10])
    theirs = sorted(
        int(s["cls"]) for s in wds.WebDataset(str(tmp_path / "wds-{0..1}.tar"), shardshuffle=False).decode()
    )
    assert ours == theirs


def test_gnu_tar_shards_with_long_names_and_directories(tmp_path):
    src = tmp_path / "src"
    long_dir = "d" * 60 + "/" + "e" * 50
    (src / long_dir).mkdir(parents=True)
    for i in range(4):
        (src / long_dir / f"item{i}.cls").write_text(str(i))
        (src / long_dir / f"item{i}.txt").write_text(f"t{i}")
    files = sorted(str(p.relative_to(src)) for p in src.rglob("*") if p.is_file())
    out = tmp_path / "gnu.tar"
    try:
        subprocess.run(["tar", "--format=gnu", "-cf", str(out), "-C", str(src), *files], check=True)
    except (OSError, subprocess.CalledProcessError):
        with tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as tf:
            for f in files:
                tf.add(src / f, arcname=f)
    for shuffle in (False, True):  # shuffled: ranges out of order, read forward (long names)
        ds = ShardedDataset(
            str(out),
            batch_size=2,
            fields=("cls", "txt"),
            batching=BatchOptions(collate_fn=list),
            shuffle=shuffle,
            sampling=SamplingOptions(shuffle_block=1, shuffle_buffer=2),
        )
        assert sorted(s for batch in ds for s in batch) == [(i, f"t{i}") for i in range(4)]
