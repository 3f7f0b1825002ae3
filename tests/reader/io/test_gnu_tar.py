"""Shards made by GNU tar: readable when a sample's members are adjacent (``--sort=name``),
and an error that says how to get there when they are not."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from shardify.errors import ShardFormatError
from shardify.reader import BatchOptions, ShardedDataset


def _files(folder: Path) -> list[str]:
    names = []
    for i in range(4):
        for ext, data in (("cls", str(i % 2).encode()), ("txt", f"sample {i}".encode())):
            (folder / f"s{i}.{ext}").write_bytes(data)
            names.append(f"s{i}.{ext}")
    return names


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs GNU tar")
def test_gnu_tar_sort_name_shard_reads(tmp_path: Path) -> None:
    folder = tmp_path / "files"
    folder.mkdir()
    _files(folder)
    shard = tmp_path / "shard.tar"
    subprocess.run(["tar", "--sort=name", "-cf", str(shard), "-C", str(folder), "."], check=True)
    ds = ShardedDataset([str(shard)], batch_size=4, fields=("txt", "cls"), batching=BatchOptions(collate_fn=list))
    got = sorted(s for b in ds for s in b)
    assert got == [(f"sample {i}", i % 2) for i in range(4)]


def test_non_adjacent_members_error_names_tar_sort(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for name, data in (("a.cls", b"0"), ("b.cls", b"1"), ("a.txt", b"x")):  # a directory's order
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    shard = tmp_path / "mixed.tar"
    shard.write_bytes(buf.getvalue())
    with pytest.raises(ShardFormatError, match=r"mixed.tar.*non-adjacent.*tar --sort=name"):
        ShardedDataset([str(shard)], batch_size=1, fields=("cls",))
