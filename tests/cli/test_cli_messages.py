"""What the CLI says when a user lists keys, mistypes an option or reads its summaries."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shardify.cli import EXIT_OK, EXIT_USAGE, main
from shardify.cli.common import count
from shardify.cli.inspect import CHUNK_ADVICE_SHARE, field_bytes_text
from shardify.convert import ShardWriter
from shardify.errors import ShardFormatError
from shardify.reader import split_keys


def _dataset(root: Path, *, n: int = 10, per_shard: int = 4, chunk: int | None = None, split: str = "train") -> Path:
    with ShardWriter(root, split=split, samples_per_shard=per_shard, chunk=chunk) as w:
        for i in range(n):
            w.write({"__key__": f"s{i:02d}", "npy": np.full(3, i, np.uint8), "cls": i % 3})
    return root


@pytest.mark.parametrize("chunk", [None, 3], ids=["per-sample", "chunked"])
def test_split_keys_lists_the_keys_in_stored_order(tmp_path, chunk):
    root = _dataset(tmp_path / "ds", chunk=chunk)
    keys = list(split_keys(root, split="train"))
    assert sorted(keys) == [f"s{i:02d}" for i in range(10)] and len(keys) == 10
    from shardify.reader import ShardedDataset

    unshuffled = ShardedDataset(root, batch_size=1, fields=("__key__",))
    assert keys == [k for batch in unshuffled for k in batch]  # the order of an unshuffled epoch


def test_split_keys_names_a_shard_whose_count_is_not_the_index(tmp_path):
    root = _dataset(tmp_path / "ds")
    other = _dataset(tmp_path / "other", n=3, per_shard=3)
    first = sorted(root.glob("train-*.tar"))[0]
    first.write_bytes(sorted(other.glob("train-*.tar"))[0].read_bytes())
    from shardify.reader.io.sources import resolve_source

    source = resolve_source(root, split="train")
    source = type(source)(
        **{**source.__dict__, "shards": tuple(s.__class__(url=s.url, nsamples=s.nsamples) for s in source.shards)}
    )  # no checksums to stop it
    with pytest.raises(ShardFormatError, match=r"holds 3 samples, the split lists 4") as e:
        list(split_keys(source))
    assert e.value.shard.endswith(first.name)


def test_keys_prints_one_key_per_line(tmp_path):
    root = _dataset(tmp_path / "ds", split="validation")
    done = subprocess.run(
        [sys.executable, "-m", "shardify.cli", "keys", str(root), "--split", "validation"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == EXIT_OK, done.stderr
    assert done.stdout.splitlines() == list(split_keys(root, split="validation"))
    assert len(done.stdout.splitlines()) == 10


@pytest.mark.parametrize(
    ("argv", "usage", "hint"),
    [
        pytest.param(
            ["convert", "imagefolder", "a", "b", "--shard-szie", "5"],
            "usage: shardify convert imagefolder",
            "--shard-szie: did you mean --shard-size?",
            id="convert-imagefolder",
        ),
        pytest.param(["info", "x", "--jsn"], "usage: shardify info", "--jsn: did you mean --json?", id="info"),
        pytest.param(["keys", "x", "--splt=train"], "usage: shardify keys", "--splt: did you mean --split?", id="keys"),
    ],
)
def test_a_mistyped_option_shows_its_commands_usage_and_the_close_option(argv, usage, hint, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(usage) and "unrecognized arguments" in err and hint in err


def test_convert_ids_help_does_not_offer_split_and_the_refusal_names_partition(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["convert", "ids", "--help"])
    assert "--split SPLIT" not in capsys.readouterr().out  # neither in the usage nor among the options
    code = main(
        ["convert", "ids", str(tmp_path), str(tmp_path / "o"), "--partition", "p", "--labels", "l", "--split", "x"]
    )
    assert code == EXIT_USAGE and "--partition" in capsys.readouterr().err


def test_counts_are_plural_but_for_one():
    assert [count(n, "shard") for n in (0, 1, 2)] == ["0 shards", "1 shard", "2 shards"]


def test_summaries_say_1_shard(tmp_path, capsys):
    from PIL import Image

    src = tmp_path / "src"
    (src / "c").mkdir(parents=True)
    Image.new("RGB", (8, 8), (200, 10, 10)).save(src / "c" / "a.jpg")
    out = tmp_path / "out"
    assert main(["convert", "imagefolder", str(src), str(out), "--quiet", "--workers", "1", "--no-fsync"]) == EXIT_OK
    assert "train: 1 sample in 1 shard (" in capsys.readouterr().err
    assert main(["info", str(out)]) == EXIT_OK
    assert "train: 1 sample, 1 shard," in capsys.readouterr().out


def _field_bytes(data: float, headers: float, padding: float) -> dict:
    return {
        "source": "headers of 1 of 1 shards",
        "fields": {"jpg": {"data": data, "headers": headers, "padding": padding, "present": 1.0}},
    }


@pytest.mark.parametrize(
    ("data", "advised"),
    [
        pytest.param(78_000, False, id="78KB-jpeg-3pct"),
        pytest.param(2_000, True, id="2KB-sample-40pct"),
    ],
)
def test_info_advises_chunk_only_where_headers_are_a_large_share(data, advised):
    text = field_bytes_text(_field_bytes(data, 1536, 1200))
    share = 2736 / (data + 2736)
    assert (share >= CHUNK_ADVICE_SHARE) == advised
    assert ("--chunk N, would save most of it" in text) == advised
    assert ("keep one member per sample" in text) == (not advised)
