"""What a new user trips over on the command line: flags named in messages, empty results,
pipes, decoder chatter, examples in every help, labels shown, OUT that is a file."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from PIL import Image

from shardify.cli import EXIT_ERROR, EXIT_OK, EXIT_SKIPPED, EXIT_USAGE, main


def _folder(root: Path, make_image, files: dict[str, bytes] | None = None) -> Path:
    for rel, data in (files or {"c/a.jpg": make_image(seed=1), "d/b.jpg": make_image(seed=2)}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def _convert(src: Path, out: Path, *extra: str) -> int:
    return main(["convert", "imagefolder", str(src), str(out), "--quiet", "--workers", "1", "--no-fsync", *extra])


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param([], id="top"),
        pytest.param(["convert"], id="convert"),
        pytest.param(["info"], id="info"),
        pytest.param(["verify"], id="verify"),
        pytest.param(["bench"], id="bench"),
        pytest.param(["convert", "imagefolder"], id="imagefolder"),
        pytest.param(["show"], id="show"),
    ],
)
def test_every_help_has_an_example(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    out = capsys.readouterr().out
    assert "example" in out and "shardify " in out.split("example", 1)[1]


def test_several_splits_name_the_cli_flag_and_bench_defaults_to_train(tmp_path: Path, make_image, capsys) -> None:
    src = _folder(tmp_path / "src", make_image)
    out = tmp_path / "out"
    for split in ("validation", "test"):
        assert _convert(src, out, "--split", split) == EXIT_OK
    capsys.readouterr()
    assert main(["bench", str(out), "--no-webdataset"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "choose one with --split" in err and "test, validation" in err and "split=" not in err

    from shardify.cli.common import split_source as bench_source

    assert _convert(src, out, "--split", "train") == EXIT_OK
    assert bench_source(out, None).split == "train"  # the only split, or train
    assert bench_source(out, "test").split == "test"


def test_convert_ids_refuses_split(tmp_path: Path, capsys) -> None:
    (tmp_path / "p.json").write_text('{"train": ["a"]}')
    (tmp_path / "l.json").write_text('{"a": 0}')
    rc = main(
        [
            "convert",
            "ids",
            str(tmp_path),
            str(tmp_path / "out"),
            "--partition",
            str(tmp_path / "p.json"),
            "--labels",
            str(tmp_path / "l.json"),
            "--split",
            "foo",
        ]
    )
    assert rc == EXIT_USAGE
    assert "--split is not used" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_all_skipped_is_an_error_unless_allowed(tmp_path: Path, capsys) -> None:
    src = _folder(tmp_path / "src", None, {"c/a.jpg": b"", "c/b.jpg": b"not an image"})
    out = tmp_path / "out"
    assert _convert(src, out) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "no sample was written (2 skipped" in err and "--allow-empty" in err
    assert not (out / "manifest.json").exists()  # nothing finished
    assert len((out / "train.report.jsonl").read_text().splitlines()) == 2  # but the reasons are there
    assert _convert(src, out, "--allow-empty") == EXIT_SKIPPED
    assert json.loads((out / "manifest.json").read_text())["splits"]["train"]["samples"] == 0


def test_info_json_into_a_closed_pipe_ends_quietly(tmp_path: Path, make_image) -> None:
    out = tmp_path / "out"
    assert _convert(_folder(tmp_path / "src", make_image), out) == EXIT_OK
    read, write = os.pipe()
    os.close(read)  # the reader (`head`) is gone before anything is written
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "shardify.convert", "info", str(out), "--json"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.returncode == 141


def test_info_shows_int_labels_seen(tmp_path: Path, make_image, capsys) -> None:
    data = tmp_path / "data"
    data.mkdir()
    ids = [f"id{i}" for i in range(6)]
    for i, name in enumerate(ids):
        (data / f"{name}.jpg").write_bytes(make_image(seed=i))
    (tmp_path / "p.json").write_text(json.dumps({"train": ids[:4], "validation": ids[4:]}))
    (tmp_path / "l.json").write_text(json.dumps({name: i % 3 for i, name in enumerate(ids)}))
    out = tmp_path / "out"
    assert (
        main(
            [
                "convert",
                "ids",
                str(data),
                str(out),
                "--partition",
                str(tmp_path / "p.json"),
                "--labels",
                str(tmp_path / "l.json"),
                "--quiet",
                "--workers",
                "1",
            ]
        )
        == EXIT_OK
    )
    capsys.readouterr()
    assert main(["info", str(out)]) == EXIT_OK
    text = capsys.readouterr().out
    assert "train: 4 samples" in text and "3 int labels: 0..2" in text
    assert "validation: 2 samples" in text and "2 int labels: 1, 2" not in text and "2 int labels: 1..2" in text
    assert main(["info", str(out), "--json"]) == EXIT_OK
    labels = json.loads(capsys.readouterr().out)["splits"]["train"]["labels"]
    assert labels == {"distinct": 3, "min": 0, "max": 2, "counts": {"0": 2, "1": 1, "2": 1}}


def test_out_that_is_a_file_is_named_so(tmp_path: Path, make_image, capsys) -> None:
    (tmp_path / "out").write_text("x")
    assert _convert(_folder(tmp_path / "src", make_image), tmp_path / "out") == EXIT_ERROR
    assert "the output is a file" in capsys.readouterr().err


def _apng_with_bad_actl() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(buf, format="PNG")
    data = buf.getvalue()
    body = b"acTL" + struct.pack(">II", 0, 0)
    chunk = struct.pack(">I", 8) + body + struct.pack(">I", zlib.crc32(body))
    return data[:33] + chunk + data[33:]  # right after IHDR


def _tiff_with_65535_samples() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (9, 9, 9)).save(buf, format="TIFF")
    data = bytearray(buf.getvalue())
    ifd = struct.unpack("<I", data[4:8])[0]
    for i in range(struct.unpack("<H", data[ifd : ifd + 2])[0]):
        entry = ifd + 2 + 12 * i
        if struct.unpack("<H", data[entry : entry + 2])[0] == 277:  # SamplesPerPixel
            data[entry + 8 : entry + 10] = struct.pack("<H", 65535)
    return bytes(data)


def test_decoder_chatter_goes_to_the_report_not_the_terminal(tmp_path: Path, make_image) -> None:
    src = _folder(
        tmp_path / "src",
        make_image,
        {"c/ok.jpg": make_image(seed=1), "c/odd.png": _apng_with_bad_actl(), "c/bad.tiff": _tiff_with_65535_samples()},
    )
    out = tmp_path / "out"
    code = (
        "import sys\nfrom shardify.cli import main\n"
        f"sys.exit(main(['convert', 'imagefolder', {str(src)!r}, {str(out)!r}, '--quiet', '--workers', '1']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_SKIPPED, proc.stderr
    chatter = [line for line in proc.stderr.splitlines() if "Invalid APNG" in line or "More samples per" in line]
    assert chatter and all("decoder said: " in line for line in chatter), proc.stderr  # only in our summary
    report = {r["path"]: r for r in map(json.loads, (out / "train.report.jsonl").read_text().splitlines())}
    assert report["c/odd.png"]["kind"] == "note" and "Invalid APNG" in report["c/odd.png"]["reason"]
    assert report["c/bad.tiff"]["kind"] == "skipped"
    assert "More samples per pixel than can be decoded: 65535" in report["c/bad.tiff"]["reason"]
    assert json.loads((out / "manifest.json").read_text())["splits"]["train"]["samples"] == 2


def test_image_format_flag_stores_one_image_field(tmp_path: Path, make_image) -> None:
    src = _folder(tmp_path / "src", make_image, {"c/a.JPEG": make_image(seed=1), "c/b.JPEG": make_image("PNG", seed=2)})
    for fmt, fields in (("keep", ["cls", "jpg", "json", "png"]), ("jpg", ["cls", "jpg", "json"])):
        assert _convert(src, tmp_path / fmt, "--image-format", fmt) == EXIT_OK
        assert json.loads((tmp_path / fmt / "train.json").read_text())["shardify"]["fields"] == fields
