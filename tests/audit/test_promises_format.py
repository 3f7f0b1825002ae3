"""Audit of format promises that no other test pinned (docs/audit.md).

docs/format.md, "Top-level manifest": "The index the manifest names must carry the same
`version` (loading checks it)". Nothing failed when that check was removed: a manifest that
names an index of another version (a copy from elsewhere, a hand edit, a half-done restore)
would be read as if it were the listed version.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardify.convert import ShardWriter
from shardify.errors import ManifestError
from shardify.manifest import Manifest
from shardify.reader import ShardedDataset

TIME_LIMIT_S = 30


def test_an_index_of_another_version_than_the_manifest_lists_is_refused_naming_both(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    with ShardWriter(root, samples_per_shard=3, shard_size=None, fsync=False) as w:
        for i in range(5):
            w.write({"cls": i})
    listed = Manifest.load(root).splits["train"]
    ShardedDataset(root, batch_size=2, fields=("cls",))  # intact: reads
    path = root / listed.index
    index = json.loads(path.read_text())
    index["shardify"]["version"] = "0123456789ab"
    path.write_text(json.dumps(index))
    want = (
        rf"{path.name}: field 'version' is '0123456789ab', the manifest lists version '{listed.version}' "
        r"for split 'train'"
    )
    with pytest.raises(ManifestError, match=want):
        ShardedDataset(root, batch_size=2, fields=("cls",))
    with pytest.raises(ManifestError, match=want):
        Manifest.load(root).load_split(root, "train")


def test_verify_and_info_check_the_index_version_too(tmp_path: Path, capsys) -> None:
    """``shardify verify``/``info`` load the index through their own reader of the folder: it
    must apply the manifest's check as ShardedDataset does, not report the mismatch as
    misnamed shards (verify) or show the other version's figures (info)."""
    from shardify.cli.__main__ import main
    from shardify.convert.verify import verify_dataset

    root = tmp_path / "ds"
    with ShardWriter(root, samples_per_shard=3, shard_size=None, fsync=False) as w:
        for i in range(5):
            w.write({"cls": i})
    listed = Manifest.load(root).splits["train"]
    path = root / listed.index
    index = json.loads(path.read_text())
    index["shardify"]["version"] = "0123456789ab"
    path.write_text(json.dumps(index))
    want = f"field 'version' is '0123456789ab', the manifest lists version '{listed.version}'"
    assert [p.message for p in verify_dataset(root).problems if want in p.message], verify_dataset(root).problems
    assert main(["info", str(root)]) == 1
    assert want in capsys.readouterr().err
