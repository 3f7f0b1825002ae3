"""Remote reads of only what a worker needs: URL confinement of a split index, per-sample
checksums and checked ranged reads, the bytes a node fetches against those it consumes,
and servers that misbehave (tools/rangeserver.py on 127.0.0.1)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

from shardify.convert import ShardWriter
from shardify.errors import LocationError
from shardify.reader.io.remote import RetryPolicy
from shardify.reader.io.sources import resolve_source

_SPEC = importlib.util.spec_from_file_location("rangeserver", Path(__file__).parents[2] / "tools" / "rangeserver.py")
rangeserver = importlib.util.module_from_spec(_SPEC)  # type: ignore[arg-type]
sys.modules["rangeserver"] = rangeserver
_SPEC.loader.exec_module(rangeserver)  # type: ignore[union-attr]

FAST = RetryPolicy(retries=2, backoff_s=0.01, max_backoff_s=0.02, timeout_s=5.0)


def _dataset(root: Path, n: int = 40, per_shard: int = 8) -> Path:
    with ShardWriter(root, samples_per_shard=per_shard, fsync=False) as w:
        for i in range(n):
            w.write({"txt": chr(97 + i % 26) * (300 + i * 37 % 700), "cls": i % 5})
    return root


@pytest.fixture
def www(tmp_path: Path) -> Path:
    """``www/ds``: 40 samples in 5 shards; ``www/other``: a copy of it outside the dataset."""
    _dataset(tmp_path / "www" / "ds")
    shutil.copytree(tmp_path / "www" / "ds", tmp_path / "www" / "other")
    return tmp_path / "www"


def _point_shard(index: Path, url: str) -> None:
    obj = json.loads(index.read_text())
    obj["shardlist"][1]["url"] = url
    index.write_text(json.dumps(obj))


@pytest.mark.parametrize("where", ["../other/{name}", "file://{root}/other/{name}", "%2e%2e/other/{name}",
                                   "http://localhost:1/ds/{name}"])
def test_a_remote_index_cannot_send_the_reader_elsewhere(www, where):
    index = www / "ds" / "train.json"
    name = json.loads(index.read_text())["shardlist"][1]["url"]
    bad = where.format(name=name, root=www)
    _point_shard(index, bad)
    with rangeserver.serve(www) as (base, _):
        with pytest.raises(LocationError) as e:
            resolve_source(f"{base}/ds/train.json", retry=FAST)
        assert f"{base}/ds/train.json" in str(e.value) and "refuses to read" in str(e.value)
        allow = (f"{base}/other/", f"file://{www}/other/", "http://localhost:1/")
        if "%2e" in where:  # a dot-dot segment the server would resolve: refused whatever is allowed
            with pytest.raises(LocationError):
                resolve_source(f"{base}/ds/train.json", retry=FAST, allow_locations=allow)
        else:
            assert len(resolve_source(f"{base}/ds/train.json", retry=FAST, allow_locations=allow).shards) == 5


def test_a_local_index_stays_in_its_folder_and_relative_shards_still_resolve(www):
    assert resolve_source(www / "ds" / "train.json").num_samples == 40
    with rangeserver.serve(www) as (base, _):
        assert resolve_source(f"{base}/ds").num_samples == 40
    _point_shard(www / "ds" / "train.json", "../other/" + json.loads((www / "ds" / "train.json").read_text())
                 ["shardlist"][1]["url"])
    with pytest.raises(LocationError, match="refuses to read"):
        resolve_source(www / "ds" / "train.json")
