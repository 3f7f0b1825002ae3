"""shardify.cli: help grouped by what the user wants to do, errors mapped in one place, info's bytes per field."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from shardify.cli import EXIT_OK, EXIT_USAGE, build_parser, main
from shardify.cli.__main__ import GROUPS
from shardify.convert import ShardWriter
from shardify.convert.dataset_files import locate_dataset
from shardify.convert.fieldsizes import field_bytes, spread


def _dataset(root: Path, n: int = 12, per_shard: int = 4) -> Path:
    """``n`` samples of a 1-3 digit ``cls`` and a 100-byte ``txt``, ``per_shard`` to a shard."""
    with ShardWriter(root, split="train", samples_per_shard=per_shard) as w:
        for i in range(n):
            w.write({"cls": i * 10, "txt": "x" * 100})
    return root


EXPECTED_GROUPS = [
    ("convert", ["convert"]),
    ("inspect a finished dataset", ["info", "verify", "keys", "show"]),
    ("read it as training does", ["bench"]),
    ("maintain", ["gc"]),
]


def test_help_lists_the_commands_under_their_headings_in_order(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: shardify [-h] [--version] COMMAND ...")
    commands = text[: text.index("\nexamples:")].split("\n\n")
    found = [
        (block.splitlines()[0].rstrip(":"), re.findall(r"^  (\w+)  ", block, flags=re.M))
        for block in commands
        if re.search(r"^  \w+  ", block, flags=re.M) and not block.startswith("options:")
    ]
    assert found == EXPECTED_GROUPS


def test_every_command_has_a_heading():
    parser = build_parser()  # raises when a command is missing from GROUPS
    sub = next(a for a in parser._actions if a.dest == "command")
    assert sorted(sub.choices) == sorted(n for _, names in GROUPS for n in names)


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["info", "--help"], id="info"),
        pytest.param(["convert", "ids", "--help"], id="convert-ids"),
        pytest.param(["bench", "--help"], id="bench"),
        pytest.param(["gc", "--help"], id="gc"),
    ],
)
def test_each_command_names_itself_in_its_usage(argv, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert capsys.readouterr().out.startswith("usage: shardify " + " ".join(a for a in argv if a != "--help"))


def test_options_that_do_not_go_together_are_a_usage_error(tmp_path, capsys):
    code = main(
        [
            "convert",
            "ids",
            str(tmp_path),
            str(tmp_path / "out"),
            "--partition",
            "p.json",
            "--labels",
            "l.json",
            "--split",
            "train",
        ]
    )
    assert code == EXIT_USAGE
    assert capsys.readouterr().err == (
        "shardify: error: convert ids takes its splits from --partition; --split is not used there\n"
    )


def test_spread_takes_first_and_last():
    assert spread(130, 2) == [0, 129] and spread(3, 5) == [0, 1, 2] and spread(7, 3) == [0, 3, 6]
    assert spread(0, 2) == [] and spread(5, 1) == [0]


def test_field_bytes_count_data_headers_and_padding(tmp_path):
    root = _dataset(tmp_path / "ds", n=12, per_shard=4)
    located = locate_dataset(root)
    index = located.load_split("train")
    fb = field_bytes(located.files, index, shards=2)
    assert fb.samples == 8 and fb.source == "headers of 2 of 3 shards (8 samples)"
    # shards 0 and 2: cls 0,10,20,30 and 80,90,100,110 (1, 2 or 3 digits); txt 100 bytes
    cls_data = sum(len(str(i * 10)) for i in (0, 1, 2, 3, 8, 9, 10, 11)) / 8
    assert fb.fields["cls"].data == pytest.approx(cls_data)
    assert fb.fields["cls"].headers == 512 and fb.fields["txt"].headers == 512
    assert fb.fields["cls"].padding == pytest.approx(512 - cls_data)
    assert fb.fields["txt"].data == 100 and fb.fields["txt"].padding == 412
    assert fb.fields["txt"].present == 1.0
    assert list(fb.fields) == ["txt", "cls"]  # largest first
    assert fb.framing == pytest.approx(2 * 512 + 412 + 512 - cls_data)


def test_info_prints_bytes_per_field_and_where_they_come_from(tmp_path, capsys):
    root = _dataset(tmp_path / "ds")
    assert main(["info", str(root)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "bytes per sample by field, from the headers of 2 of 3 shards (8 samples):" in out
    header = next(line for line in out.splitlines() if "tar headers" in line)
    assert header.split() == ["field", "data", "tar", "headers", "padding", "in", "samples"]
    txt = next(line for line in out.splitlines() if line.split()[:1] == ["txt"])
    assert txt.split() == ["txt", "100", "B", "512", "B", "412", "B", "100%"]
    assert "tar headers and padding:" in out and "% of the shard bytes" in out


def test_info_describes_what_it_can_when_a_shard_is_unreadable(tmp_path, capsys):
    root = _dataset(tmp_path / "ds")
    last = sorted(root.glob("*.tar"))[-1]
    last.write_bytes(b"not a tar" * 100)
    assert main(["info", str(root)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "train: 12 samples, 3 shards" in out
    assert f"bytes per field: not measured: shard {last.name}" in out


def test_info_json_holds_the_figures_and_can_skip_them(tmp_path, capsys):
    root = _dataset(tmp_path / "ds")
    assert main(["info", str(root), "--json"]) == EXIT_OK
    split = json.loads(capsys.readouterr().out)["splits"]["train"]
    assert split["field_bytes"]["fields"]["txt"] == {"data": 100.0, "headers": 512.0, "padding": 412.0, "present": 1.0}
    assert main(["info", str(root), "--json", "--sample-shards", "0"]) == EXIT_OK
    assert "field_bytes" not in json.loads(capsys.readouterr().out)["splits"]["train"]


def test_field_bytes_of_a_chunked_split_are_per_sample_not_per_chunk(tmp_path, capsys):
    """A chunked split's tar samples are chunks: the figures divide by the samples they hold."""
    import numpy as np

    from shardify.convert import ShardWriter

    root = tmp_path / "chunked"
    with ShardWriter(root, split="train", chunk=64) as w:
        for i in range(500):
            w.write({"npy": np.zeros((3, 32, 32), np.uint8), "cls": i % 10})
    located = locate_dataset(root)
    fb = field_bytes(located.files, located.load_split("train"), shards=2)
    assert fb.samples == 500 and fb.chunk == 64 and fb.source == "headers of 1 of 1 shards (500 samples in 8 chunks)"
    assert fb.fields["npy"].data == pytest.approx(3 * 32 * 32 + 128 * 8 / 500)  # the stacked .npy's header per chunk
    assert fb.fields["npy"].headers == pytest.approx(8 * 512 / 500)
    assert fb.fields["cls"].present == 1.0
    assert main(["info", str(root)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "already one member per field per chunk" in out and "--chunk N" not in out


def test_info_says_what_is_true_of_a_cls_field_written_from_python(tmp_path, capsys):
    """ShardWriter and convert_items do not summarise ``cls`` (any value may be there): info says
    so, never that this very version's converter is too old to record it."""
    from shardify.cli.inspect import labels_text

    assert main(["info", str(_dataset(tmp_path / "ds"))]) == EXIT_OK
    out = capsys.readouterr().out
    assert "a cls field (written from Python: its values are not summarised in the index)" in out
    assert "converter version" not in out
    old = {"classes": 0, "fields": ["cls", "jpg"], "labels": None, "converter": {"source": "ids", "version": "0.0.9"}}
    assert labels_text(old) == "int labels (not recorded by converter version 0.0.9)"
    assert labels_text({**old, "fields": ["jpg"]}) == "no labels"
