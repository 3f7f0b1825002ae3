"""``shardify verify`` checks the split index's per-sample table (what ranged reads trust) against
the shards' bytes, sample by sample, and names the sample whose bytes do not match."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from builders import text_dataset

from shardify.cli import main as cli_main
from shardify.convert.verify import verify_dataset
from shardify.sampletable import RECORD


def _dataset(root: Path) -> Path:
    return text_dataset(root, 20, base=200, spread=500, classes=3)


def _index(root: Path) -> Path:
    """The split index the manifest names (``train.json`` beside it is a copy for other readers)."""
    return root / json.loads((root / "manifest.json").read_text())["splits"]["train"]["index"]


def _tamper_digest(index: Path, shard: int, sample: int) -> str:
    """Flip one byte of ``sample``'s digest in ``shard``'s table; return that sample's key."""
    obj = json.loads(index.read_text())
    entry = obj["shardlist"][shard]
    table = bytearray(base64.b64decode(entry["samples"]))
    table[sample * RECORD.size + 4] ^= 0xFF  # the digest follows the 4-byte length
    entry["samples"] = base64.b64encode(bytes(table)).decode("ascii")
    index.write_text(json.dumps(obj))
    return f"{shard * 8 + sample:09d}"


def test_an_intact_dataset_passes_with_its_sample_table(tmp_path: Path) -> None:
    out = _dataset(tmp_path / "ds")
    assert "samples" in json.loads(_index(out).read_text())["shardlist"][0]
    assert verify_dataset(out).ok


def test_a_sample_whose_bytes_do_not_match_the_table_is_named(tmp_path: Path, capsys, record_index) -> None:
    out = _dataset(tmp_path / "ds")
    key = _tamper_digest(_index(out), shard=1, sample=3)
    record_index(out)  # an index written so: the manifest records it, the samples' bytes tell
    shard = json.loads(_index(out).read_text())["shardlist"][1]["url"]
    report = verify_dataset(out)
    assert [(p.shard, p.key, p.message) for p in report.problems] == [
        (shard, key, "sample 3's bytes do not match the index's per-sample checksum")
    ]
    assert cli_main(["verify", str(out)]) != 0
    captured = capsys.readouterr()
    assert key in captured.out + captured.err
