"""Hostile and broken inputs to the converter: each file converted or reported, never a crash or hang."""

from __future__ import annotations

import io
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import pytest
from PIL import Image

from shardify.convert.synth import natural_image
from shardify.convert.write.run import convert_imagefolder

CLI = [sys.executable, "-m", "shardify.convert"]


def _save(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR declares ``width`` x ``height`` but holds almost no data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")

    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 10)) + chunk(b"IEND", b"")
    )


def _corpus() -> dict[str, bytes]:
    rgb = natural_image(48, 32, seed=1)
    good = _save(rgb, "JPEG")
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90
    palette = rgb.convert("P", palette=Image.ADAPTIVE)
    frames = [natural_image(24, 16, seed=s).convert("P") for s in range(3)]
    tiff = io.BytesIO()
    rgb.save(tiff, format="TIFF", save_all=True, append_images=[natural_image(48, 32, seed=2)])
    return {
        "ok.jpg": good,
        "truncated.jpg": good[: len(good) // 2],
        "zero.jpg": b"",
        "random.jpg": os.urandom(3000),
        "png_as.jpg": _save(rgb, "PNG"),
        "sixteen_bit.png": _save(Image.new("I;16", (40, 30), 40000), "PNG"),
        "palette_transparent.png": _save(palette, "PNG", transparency=0),
        "cmyk.jpg": _save(rgb.convert("CMYK"), "JPEG"),
        "animated.gif": _save(frames[0], "GIF", save_all=True, append_images=frames[1:]),
        "animated_as.png": _save(frames[0], "GIF", save_all=True, append_images=frames[1:]),
        "multiframe.tiff": tiff.getvalue(),
        "exif_rotated.jpg": _save(rgb, "JPEG", exif=exif.tobytes()),
        "huge_declared.png": _png_header_only(200_000, 200_000),
        "grayscale.jpg": _save(rgb.convert("L"), "JPEG"),
        "bomb.png": _save(Image.new("L", (3000, 3000)), "PNG"),
    }


@pytest.mark.parametrize("check", ["header", "full"])
def test_every_hostile_file_is_converted_or_reported(tmp_path: Path, options, read_split, check: str) -> None:
    corpus = _corpus()
    root = tmp_path / "src" / "c"
    root.mkdir(parents=True)
    for name, data in corpus.items():
        (root / name).write_bytes(data)
    out = tmp_path / "out"
    limit = Image.MAX_IMAGE_PIXELS
    result = convert_imagefolder(root.parent, out, options=options(check=check, max_pixels=4_000_000, workers=1))
    assert Image.MAX_IMAGE_PIXELS == limit  # in-process shard writing restores Pillow's limit for the reader
    packed = {json.loads(s["json"])["path"]: s for s in read_split(out, "train").values()}
    report = {
        json.loads(line)["path"]: json.loads(line) for line in (out / "train.report.jsonl").read_text().splitlines()
    }
    for name in corpus:
        rel = f"c/{name}"
        assert (rel in packed) != (rel in report), f"{rel} must be either packed or reported"
    assert set(report) == {
        "c/truncated.jpg",
        "c/zero.jpg",
        "c/random.jpg",
        "c/animated.gif",
        "c/huge_declared.png",
        "c/bomb.png",
    }
    assert report["c/animated.gif"]["kind"] == "ignored"
    assert report["c/huge_declared.png"]["reason"].startswith("decompression bomb")
    assert report["c/bomb.png"]["reason"].startswith("decompression bomb")
    assert result.num_skipped == 5
    # original bytes kept, extension names the real content
    assert packed["c/animated_as.png"]["gif"] == corpus["animated_as.png"]
    assert packed["c/png_as.jpg"]["png"] == corpus["png_as.jpg"]
    assert packed["c/multiframe.tiff"]["tiff"] == corpus["multiframe.tiff"]
    assert packed["c/sixteen_bit.png"]["png"] == corpus["sixteen_bit.png"]


def test_symlinks_followed_inside_the_root_only_and_loops_end(tmp_path: Path, options, read_split, make_image) -> None:
    root = tmp_path / "src"
    (root / "a").mkdir(parents=True)
    (root / "a" / "real.jpg").write_bytes(make_image())
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.jpg").write_bytes(make_image(seed=2))
    (root / "a" / "inside_link.jpg").symlink_to(root / "a" / "real.jpg")
    (root / "a" / "outside_link.jpg").symlink_to(tmp_path / "outside" / "secret.jpg")
    (root / "a" / "outside_dir").symlink_to(tmp_path / "outside")
    (root / "a" / "loop").symlink_to(root / "a")
    (root / "a" / "dangling.jpg").symlink_to(root / "nothing.jpg")
    out = tmp_path / "out"
    result = convert_imagefolder(root, out, options=options())
    packed = sorted(json.loads(s["json"])["path"] for s in read_split(out, "train").values())
    assert packed == ["a/inside_link.jpg", "a/real.jpg"]
    reasons = {p.path: p.reason for p in result.splits["train"].skipped}
    assert reasons["a/outside_link.jpg"] == "symbolic link points outside the source root"
    assert reasons["a/outside_dir"] == "symbolic link points outside the source root"
    assert reasons["a/dangling.jpg"].startswith("cannot stat")
    report = (out / "train.report.jsonl").read_text()
    assert "folder reached twice through symbolic links" in report

    nofollow = convert_imagefolder(root, tmp_path / "nf", options=options(follow_symlinks=False))
    assert nofollow.splits["train"].samples == 1


# Runs the CLI as an unprivileged user (root reads any file): the interpreter starts as
# root, imports what it needs, then drops to nobody before converting.
AS_NOBODY = (
    "import os, sys\n"
    "from PIL import Image; Image.init()\n"
    "import shardify.convert.write.run, shardify.cli, shardify.cli.__main__, "
    "tqdm, json, hashlib, fcntl, shutil, codecs\n"
    'for name in ("ascii", "utf-8", "latin-1"): codecs.lookup(name)\n'
    "if os.geteuid() == 0:\n"
    "    os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
    "sys.exit(shardify.cli.main(sys.argv[1:]))\n"
)


def test_unreadable_file_is_reported(make_image) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        os.chmod(base, 0o777)
        src = base / "src" / "c"
        src.mkdir(parents=True)
        (src / "ok.jpg").write_bytes(make_image())
        (src / "locked.jpg").write_bytes(make_image(seed=1))
        os.chmod(src / "locked.jpg", 0)
        for p in (base / "src", src):
            os.chmod(p, 0o755)
        out = base / "out"
        out.mkdir()
        os.chmod(out, 0o777)
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                AS_NOBODY,
                "convert",
                "imagefolder",
                str(base / "src"),
                str(out),
                "--quiet",
                "--workers",
                "1",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 3, proc.stderr
        assert "skipped c/locked.jpg: cannot read: Permission denied" in proc.stderr


def test_write_failure_is_clear_and_output_never_looks_finished(tmp_path: Path) -> None:
    from shardify.convert.synth import make_imagefolder

    src = make_imagefolder(tmp_path / "src", classes=2, per_class=6, sizes=((160, 120),))
    out = tmp_path / "out"

    def small_disk() -> None:  # files over 40 KB fail with EFBIG, like a full disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (40_000, 40_000))

    args = [*CLI, "convert", "imagefolder", str(src), str(out), "--quiet", "--samples-per-shard", "4"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60, preexec_fn=small_disk)
    assert proc.returncode == 1, proc.stderr
    assert "cannot write shard" in proc.stderr and re.search(r"train-[0-9a-f]{12}-00000", proc.stderr)
    assert not (out / "manifest.json").exists()
    assert not list(out.glob(".*.tmp"))
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (out / "manifest.json").exists()


def _junk_with_magic() -> dict[str, bytes]:
    """Files whose first bytes name an image format and whose rest is junk: Pillow's errors
    for them carry object reprs with memory addresses (``<_io.BytesIO object at 0x...>``)."""
    return {
        "jpg_junk.jpg": b"\xff\xd8\xff" + bytes(range(256)) * 4,
        "png_junk.png": b"\x89PNG\r\n\x1a\n" + bytes(40),
        "tiff_junk.tif": b"II*\x00" + b"\xff" * 50,
        "gif_junk.gif": b"GIF89a" + b"\x01" * 5,
        "webp_junk.webp": b"RIFF\x00\x00\x00\x00WEBP" + bytes(10),
        "bmp_junk.bmp": b"BM" + bytes(100),
        "ppm_junk.ppm": b"P6\n" + b"x" * 10,
    }


def test_report_is_byte_identical_across_runs(tmp_path: Path, options) -> None:
    root = tmp_path / "src" / "c"
    root.mkdir(parents=True)
    for name, data in _junk_with_magic().items():
        (root / name).write_bytes(data)
    reports = []
    for run in ("a", "b"):
        convert_imagefolder(
            root.parent, tmp_path / run, options=options(workers=1 if run == "a" else 2, allow_empty=True)
        )
        reports.append((tmp_path / run / "train.report.jsonl").read_bytes())
    lines = [json.loads(line) for line in reports[0].decode().splitlines()]
    assert len(lines) == len(_junk_with_magic())
    assert not [r for r in lines if " at 0x" in r["reason"] or "object at" in r["reason"]], reports[0].decode()
    assert reports[0] == reports[1]


def _replace_member(shard: Path, ext: str, data: bytes) -> None:
    """Rewrite ``shard`` (in the format's layout) with every ``.{ext}`` member holding ``data``."""
    import tarfile

    from shardify.tarfmt import END_OF_ARCHIVE, padding, ustar_header

    out = bytearray()
    with tarfile.open(shard) as tf:
        for m in tf.getmembers():
            body = data if m.name.endswith(f".{ext}") else tf.extractfile(m).read()
            out += ustar_header(m.name, len(body)) + body + padding(len(body))
    shard.write_bytes(bytes(out + END_OF_ARCHIVE))


def _one_image_dataset(tmp_path: Path, options, make_image) -> Path:
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    (src / "a.jpg").write_bytes(make_image())
    out = tmp_path / "out"
    convert_imagefolder(src.parent, out, options=options())
    return out


def test_verify_reports_a_deeply_nested_json_member_never_a_traceback(tmp_path: Path, options, make_image) -> None:
    out = _one_image_dataset(tmp_path, options, make_image)
    _replace_member(out / json.loads((out / "train.json").read_text())["shardlist"][0]["url"], "json", b"[" * 200_000)
    proc = subprocess.run([*CLI, "verify", str(out), "--decode"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    assert "key 'c__a': json member is nested too deeply to parse" in proc.stdout, proc.stdout


def test_verify_reports_any_error_of_a_sample_check(tmp_path: Path, options, make_image, monkeypatch) -> None:
    from shardify.convert import verify

    out = _one_image_dataset(tmp_path, options, make_image)

    def broken(key: str) -> str:
        raise RuntimeError(f"unexpected trouble at {object()!r}")

    monkeypatch.setattr(verify, "check_key", broken)
    report = verify.verify_dataset(out, decode=True)
    assert [p.message for p in report.problems] == [
        "cannot check the sample: RuntimeError: unexpected trouble at <object>"
    ]
    assert report.problems[0].key == "c__a"


# Converts one folder in a child process and prints its peak RSS (MiB, VmHWM: unlike ru_maxrss
# it does not carry the forking parent's peak across exec) and the seconds taken.
_MEASURED = (
    "import re, sys, time\n"
    "from shardify.cli import main\n"
    "began = time.monotonic()\n"
    "rc = main(sys.argv[1:])\n"
    "hwm = int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"
    "print(hwm / 1024, time.monotonic() - began)\n"
    "sys.exit(rc)\n"
)


def _sparse(path: Path, head: bytes, size: int) -> None:
    """A file of ``size`` bytes that starts with ``head`` and is zeros after (sparse: no disk used)."""
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)


@pytest.mark.parametrize(
    "name, head, size, limit, reason",
    [
        pytest.param(
            "huge.jpg",
            b"\xff\xd8\xff\xe0",
            1_500_000_000,
            "1GiB",
            "too large: 1500000000 bytes, over the limit of 1073741824",
            id="1.5GB-over-the-limit",
        ),
        pytest.param(
            "junk.jpg",
            b"\xff\xd8\xff\xe0\x00\x10JFIF\x00",
            200_000_000,
            "1GiB",
            "not an image: a JPEG signature, then more than 1 MiB of junk between segments",
            id="200MB-jpeg-signature-then-zeros",
        ),
        pytest.param(
            "noscan.jpg",
            b"\xff\xd8" + (b"\xff\xfe\xff\xff" + b"c" * 65533) * 260,
            200_000_000,
            "1GiB",
            "not an image: a JPEG signature, but no scan in the first 16 MiB",
            id="200MB-comments-no-scan",
        ),
        pytest.param("zeros.png", b"", 200_000_000, "1GiB", "not an image (unknown format)", id="200MB-no-signature"),
    ],
)
def test_a_big_junk_file_costs_bounded_memory_and_time(
    tmp_path: Path, name: str, head: bytes, size: int, limit: str, reason: str
) -> None:
    root = tmp_path / "src" / "c"
    root.mkdir(parents=True)
    _sparse(root / name, head, size)
    (root / "ok.jpg").write_bytes(_save(natural_image(48, 32, seed=1), "JPEG"))
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _MEASURED,
            "convert",
            "imagefolder",
            str(root.parent),
            str(out),
            "--quiet",
            "--workers",
            "1",
            "--max-image-bytes",
            limit,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr
    rss_mib, seconds = map(float, proc.stdout.split())
    report = [json.loads(line) for line in (out / "train.report.jsonl").read_text().splitlines()]
    assert report == [{"kind": "skipped", "path": f"c/{name}", "reason": report[0]["reason"]}]
    assert report[0]["reason"].startswith(reason), report[0]["reason"]
    assert rss_mib < 150 and seconds < 10, (rss_mib, seconds)


def _decodes_fully(data: bytes) -> bool:
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
        return True
    except Exception:
        return False


def _decoder_tolerated() -> dict[str, tuple[bytes, str, str]]:
    """Images that Pillow decodes (or not) despite odd structure: ``name -> (bytes, header, full)``,
    where each outcome is ``"kept"`` or the start of the reason reported (``""``: not asserted)."""
    rgb = natural_image(48, 32, seed=1)
    jpg, bmp = _save(rgb, "JPEG"), _save(rgb, "BMP")
    return {
        "bmp_size_zero.bmp": (bmp[:2] + bytes(4) + bmp[6:], "kept", "kept"),
        "bmp_size_too_big.bmp": (bmp[:2] + (10**6).to_bytes(4, "little") + bmp[6:], "kept", "kept"),
        "bmp_size_too_small.bmp": (bmp[:2] + (100).to_bytes(4, "little") + bmp[6:], "kept", "kept"),
        "bmp_cut.bmp": (bmp[:-100], "truncated bmp (pixel data cut short)", "truncated bmp (pixel data cut short)"),
        "jpg_junk_between_segments.jpg": (jpg[:20] + b"junk\x00\x01" + jpg[20:], "kept", "kept"),
        "jpg_app_length_zero.jpg": (jpg[:2] + b"\xff\xef\x00\x00" + jpg[2:], "kept", "kept"),
        # APP1 declares 64 bytes but holds 26: skipping it swallows a quantization table, so
        # the pixels cannot decode; the structure alone cannot tell (header keeps it).
        "jpg_app1_cut_short.jpg": (
            jpg[:2] + b"\xff\xe1\x00\x40Exif\x00\x00" + b"x" * 20 + jpg[2:],
            "",
            "cannot decode jpg: OSError: broken data stream",
        ),
        "jpg_no_end_marker.jpg": (jpg[:-2], "truncated jpg (no end marker)", "truncated jpg (no end marker)"),
        # Pillow would decode this, a byte at a time; more than 1 MiB of junk is refused.
        "jpg_2mb_junk.jpg": (
            jpg[:20] + b"j" * (2 << 20) + jpg[20:],
            "cannot decode jpg: more than 1 MiB of junk",
            "cannot decode jpg: more than 1 MiB of junk",
        ),
        "bigtiff.tiff": (_save(rgb, "TIFF", big_tiff=True), "kept", "kept"),
    }


@pytest.mark.parametrize("check", ["header", "full"])
def test_images_the_decoder_tolerates_are_kept_by_the_documented_rule(
    tmp_path: Path, options, read_split, check: str
) -> None:
    corpus = _decoder_tolerated()
    root = tmp_path / "src" / "c"
    root.mkdir(parents=True)
    for name, (data, _, _) in corpus.items():
        (root / name).write_bytes(data)
    out = tmp_path / "out"
    convert_imagefolder(root.parent, out, options=options(check=check))
    packed = {json.loads(s["json"])["path"]: s for s in read_split(out, "train").values()}
    report = {
        json.loads(line)["path"]: json.loads(line)["reason"]
        for line in (out / "train.report.jsonl").read_text().splitlines()
    }
    for name, (data, header, full) in corpus.items():
        want, rel = header if check == "header" else full, f"c/{name}"
        if want == "kept":
            assert rel in packed, (name, report.get(rel))
            assert _decodes_fully(data), f"{name}: kept, so the reader must decode it"
            assert next(v for k, v in packed[rel].items() if k not in ("__key__", "json", "cls")) == data
        elif want:
            assert report.get(rel, "").startswith(want), (name, report.get(rel))
        if check == "full" and name != "jpg_2mb_junk.jpg":  # full: decoding decides
            assert (rel in packed) == _decodes_fully(data), name
