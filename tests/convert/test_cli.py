"""The command line: a thin layer with documented exit codes, no torch at start-up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shardify.cli import EXIT_ERROR, EXIT_OK, EXIT_SKIPPED, EXIT_USAGE, main


def test_help_and_convert_do_not_import_torch(tmp_path: Path, make_image) -> None:
    (tmp_path / "src" / "c").mkdir(parents=True)
    (tmp_path / "src" / "c" / "a.jpg").write_bytes(make_image())
    code = (
        "import sys\n"
        "from shardify.cli import main\n"
        f"rc = main(['convert', 'imagefolder', {str(tmp_path / 'src')!r}, {str(tmp_path / 'out')!r}, '--quiet'])\n"
        "assert rc == 0, rc\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    out = subprocess.run(
        [sys.executable, "-m", "shardify.convert", "--help"], capture_output=True, text=True, check=True
    )
    assert "convert" in out.stdout


@pytest.mark.parametrize(
    "kind, example",
    [
        ("imagefolder", "shardify convert imagefolder ~/data/imagenet/train"),
        ("ids", "--partition partition.json --labels labels.json"),
        ("listing", "shardify convert listing train.jsonl out/mydata"),
    ],
)
def test_help_shows_an_example_for_each_input_kind(kind: str, example: str, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["convert", kind, "--help"])
    assert example in capsys.readouterr().out


def _shard(out: Path, i: int) -> Path:
    """Shard ``i`` of the train split, named as the index lists it (names carry the version)."""
    return out / json.loads((out / "train.json").read_text())["shardlist"][i]["url"]


def test_exit_codes_info_and_verify(tmp_path: Path, make_image, capsys) -> None:
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    (src / "a.jpg").write_bytes(make_image())
    out = tmp_path / "out"
    assert main(["convert", "imagefolder", str(src.parent), str(out), "--quiet", "--workers", "1"]) == EXIT_OK
    assert main(["convert", "imagefolder", str(src.parent), str(out), "--quiet"]) == EXIT_ERROR
    assert "--overwrite" in capsys.readouterr().err
    (src / "bad.jpg").write_bytes(b"")
    assert main(["convert", "imagefolder", str(src.parent), str(out), "--quiet", "--overwrite"]) == EXIT_SKIPPED
    assert "skipped c/bad.jpg: empty file" in capsys.readouterr().err
    assert main(["convert", "imagefolder", str(src.parent), str(out), "--shard-size", "12XB"]) == EXIT_USAGE

    assert main(["info", str(out), "--json"]) == EXIT_OK
    info = json.loads(capsys.readouterr().out)
    assert info["splits"]["train"]["samples"] == 1 and info["splits"]["train"]["class_names"] == ["c"]
    assert info["splits"]["train"]["skipped"] == {"empty file": 1}

    assert main(["verify", str(out), "--decode"]) == EXIT_OK
    shard = _shard(out, 0)
    raw = bytearray(shard.read_bytes())
    raw[2000] ^= 0xFF
    shard.write_bytes(bytes(raw))
    capsys.readouterr()
    assert main(["verify", str(out)]) == EXIT_SKIPPED
    assert f"train/{shard.name}: sha256 does not match" in capsys.readouterr().out
    assert main(["info", str(tmp_path / "nowhere")]) == EXIT_ERROR


def test_verify_finds_truncation_count_and_stray_shards(tmp_path: Path, make_image, capsys) -> None:
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    for i in range(4):
        (src / f"{i}.jpg").write_bytes(make_image(seed=i))
    out = tmp_path / "out"
    main(["convert", "imagefolder", str(src.parent), str(out), "--quiet", "--samples-per-shard", "2"])
    shard = _shard(out, 1)
    shard.write_bytes(shard.read_bytes()[:1000])
    stray = shard.name.replace("-000001.tar", "-000005.tar")
    (out / stray).write_bytes(b"")
    assert main(["verify", str(out)]) == EXIT_SKIPPED
    text = capsys.readouterr().out
    assert f"{shard.name}: shard {shard.name}, key 'c__" in text and ": truncated: member" in text
    assert f"{stray}: shard file not listed in the index" in text
