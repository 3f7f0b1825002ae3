"""The one conversion session every way into the writer drives: one fingerprint rule, and a
split is listed only once it is published (the manifest last)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardify.convert import ShardWriter
from shardify.convert.write import identity
from shardify.convert.write.session import ConversionSession
from shardify.convert.write.shardtypes import ShardResult
from shardify.errors import OutputExistsError
from shardify.manifest import MANIFEST_NAME

FAST = {"fsync": False}


def _sample(i: int) -> dict[str, object]:
    return {"__key__": f"k{i:03d}", "txt": f"t{i}", "cls": i % 2}


def _version(out: Path) -> str:
    return json.loads((out / MANIFEST_NAME).read_text())["splits"]["train"]["version"]


def test_the_fingerprint_rule_is_pinned(tmp_path: Path, monkeypatch) -> None:
    """Pinned (the planned path's is in test_listing): a change to the one rule renames every
    output, so a rerun would no longer resume the files an earlier run wrote."""
    monkeypatch.setattr(identity, "__version__", "pinned")  # the fingerprint, whatever the release
    with ShardWriter(tmp_path / "writer", split="train", samples_per_shard=2, **FAST) as w:
        for i in range(5):
            w.write(_sample(i))
    assert _version(tmp_path / "writer") == "b53c84567a78"  # the rule of the release before the session: unchanged


def test_a_finished_split_is_listed_only_when_published(tmp_path: Path) -> None:
    out = tmp_path / "out"
    session = ConversionSession.open(out, {"train": "fp1"}, overwrite=False)
    with session.holding():
        version = session.begin("train", "fp1")
        results: list[ShardResult] = []
        stream = session.stream(
            "train", version, shard_size=None, samples_per_shard=2, fsync=False, chunk=None, on_shard=results.append
        )
        for i in range(3):
            stream.add(f"k{i}", [("txt", b"x")], 1024)
        session.end_stream("train", stream)
        session.finish("train", results, classes=(), converter={}, skipped=[], ignored=[], version=version)
        assert not (out / MANIFEST_NAME).exists()  # the index is written, the split not yet listed
        session.publish()
    assert _version(out) == version
    assert len(results) == 2 and (out / f"train-{version}-000001.tar").exists()
    with pytest.raises(OutputExistsError, match="already finished"):
        ConversionSession.open(out, {"train": "fp2"}, overwrite=False)
    ConversionSession.open(out, {"train": "fp2"}, overwrite=True).release()
