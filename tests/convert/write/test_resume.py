"""Interruption: a converter killed with SIGKILL resumes and ends byte-identical; nothing looks finished early."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardify.convert.synth import make_imagefolder
from shardify.convert.write.run import convert_imagefolder
from shardify.convert.write.versions import collect_garbage
from shardify.errors import OutputExistsError

CMD = [sys.executable, "-m", "shardify.convert", "convert", "imagefolder"]
OPTS = ["--samples-per-shard", "2", "--workers", "2", "--quiet"]


# The same CLI, with each image check slowed down so that the kill lands mid-run (forked
# workers inherit the patch).
SLOW = [
    sys.executable,
    "-c",
    "import sys, time\n"
    "import shardify.convert.write.readsample as w\n"
    "check = w.check_image\n"
    "w.check_image = lambda *a, **k: (time.sleep(0.05), check(*a, **k))[1]\n"
    "from shardify.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n",
    "convert",
    "imagefolder",
]


def test_sigkill_then_rerun_is_byte_identical(tmp_path: Path, tree_bytes) -> None:
    src = make_imagefolder(tmp_path / "src", classes=3, per_class=10, sizes=((96, 64),))
    ref = tmp_path / "ref"
    subprocess.run([*CMD, str(src), str(ref), *OPTS], check=True)

    out = tmp_path / "out"
    proc = subprocess.Popen([*SLOW, str(src), str(out), *OPTS], start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done = list(out.glob("train-*.tar"))
        if len(done) >= 3:
            break
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    shards_before = {p.name for p in out.glob("train-*.tar")}
    assert 3 <= len(shards_before) < 15, "the kill should land mid-run"
    assert not (out / "manifest.json").exists(), "a killed run must not look finished"

    rerun = subprocess.run([*CMD, str(src), str(out), *OPTS], capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    assert "reused" in rerun.stderr
    assert tree_bytes(out) == tree_bytes(ref)


def _interrupted_before_the_report(src: Path, out: Path, options) -> None:
    """A conversion stopped after writing its shards and records, before its report, index and manifest."""
    with pytest.MonkeyPatch.context() as mp:
        from shardify.convert.write import finish

        def crash(*a, **k):
            raise KeyboardInterrupt

        mp.setattr(finish, "write_report", crash)
        with pytest.raises(KeyboardInterrupt):
            convert_imagefolder(src, out, options=options)


def test_damaged_finished_shard_is_rewritten_on_resume(tmp_path: Path, options, tree_bytes) -> None:
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=4, sizes=((64, 48),))
    convert_imagefolder(src, tmp_path / "ref", options=options(samples_per_shard=2))
    out = tmp_path / "out"
    # simulate an interrupted run: shards and records written, manifest and index not yet
    _interrupted_before_the_report(src, out, options(samples_per_shard=2))
    assert not (out / "manifest.json").exists()
    damaged = next(out.glob("train-*-000001.tar"))
    raw = bytearray(damaged.read_bytes())
    raw[600:700] = bytes(b ^ 0xFF for b in raw[600:700])
    damaged.write_bytes(bytes(raw))
    result = convert_imagefolder(src, out, options=options(samples_per_shard=2))
    assert result.splits["train"].reused_shards == 3
    assert tree_bytes(out) == tree_bytes(tmp_path / "ref")


@pytest.mark.parametrize("damage", ["empty", "gone", "torn", "no offsets"])
def test_a_lost_record_costs_only_a_rewrite_of_its_shard(tmp_path: Path, options, tree_bytes, damage: str) -> None:
    """Records of finished shards are not fsynced: after a crash one may be empty, missing or
    cut; a record written before sample offsets were has none. The rerun then rewrites that
    shard and ends byte-identical (index included)."""
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=4, sizes=((64, 48),))
    convert_imagefolder(src, tmp_path / "ref", options=options(samples_per_shard=2))
    out = tmp_path / "out"
    _interrupted_before_the_report(src, out, options(samples_per_shard=2))
    record = out / ".shardify-work" / "train" / "000001.json"
    if damage == "empty":
        record.write_bytes(b"")
    elif damage == "gone":
        record.unlink()
    elif damage == "no offsets":
        kept = json.loads(record.read_bytes())
        del kept["offsets"]
        record.write_text(json.dumps(kept))
    else:
        record.write_bytes(record.read_bytes()[:20])
    result = convert_imagefolder(src, out, options=options(samples_per_shard=2))
    assert result.splits["train"].reused_shards == 3
    assert tree_bytes(out) == tree_bytes(tmp_path / "ref")


def test_finished_output_is_not_overwritten_without_flag(tmp_path: Path, options, make_image) -> None:
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    (src / "a.jpg").write_bytes(make_image())
    convert_imagefolder(src.parent, tmp_path / "out", options=options())
    with pytest.raises(OutputExistsError, match="--overwrite"):
        convert_imagefolder(src.parent, tmp_path / "out", options=options())
    (src / "b.jpg").write_bytes(make_image(seed=2))
    (src / "c.jpg").write_bytes(make_image(seed=3))
    (src / "d.jpg").write_bytes(make_image(seed=4))
    result = convert_imagefolder(src.parent, tmp_path / "out", options=options(overwrite=True, samples_per_shard=1))
    assert result.splits["train"].samples == 4
    result = convert_imagefolder(src.parent, tmp_path / "out", options=options(overwrite=True, samples_per_shard=3))
    version = json.loads((tmp_path / "out" / "train.json").read_text())["shardify"]["version"]
    listed = [f"train-{version}-000000.tar", f"train-{version}-000001.tar"]
    assert [s["url"] for s in json.loads((tmp_path / "out" / "train.json").read_text())["shardlist"]] == listed
    assert "shardify gc" in result.splits["train"].notes[-1]  # the earlier versions are kept for readers
    assert len(list((tmp_path / "out").glob("train-*.tar"))) == 1 + 4 + 2
    collect_garbage(tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").glob("train-*.tar")) == listed


def test_two_splits_in_one_folder(tmp_path: Path, options, make_image) -> None:
    from shardify.manifest import Manifest

    for split in ("train", "validation"):
        d = tmp_path / split / "c"
        d.mkdir(parents=True)
        (d / "a.jpg").write_bytes(make_image())
        convert_imagefolder(d.parent, tmp_path / "out", options=options(split=split))
    assert set(Manifest.load(tmp_path / "out").splits) == {"train", "validation"}


# The CLI, killed with SIGKILL at one os.replace of the finalize: before or after renaming the
# temporary file of ``argv[1]`` (``index``: the versioned split index) into place.
KILL_AT = [
    sys.executable,
    "-c",
    "import os, re, signal, sys\n"
    "target, when = sys.argv.pop(1), sys.argv.pop(1)\n"
    "real = os.replace\n"
    "def hit(dst):\n"
    "    name = os.path.basename(dst)\n"
    "    return name == target or (target == 'index' and re.fullmatch(r'train-[0-9a-f]{12}\\.json', name))\n"
    "def replace(src, dst, *a, **k):\n"
    "    if hit(dst) and when == 'before': os.kill(os.getpid(), signal.SIGKILL)\n"
    "    real(src, dst, *a, **k)\n"
    "    if hit(dst) and when == 'after': os.kill(os.getpid(), signal.SIGKILL)\n"
    "os.replace = replace\n"
    "from shardify.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n",
]


@pytest.mark.parametrize(
    "target, when",
    [("index", "before"), ("manifest.json", "before"), ("manifest.json", "after"), ("train.json", "before")],
)
def test_rerun_after_a_kill_in_the_finalize_cleans_up_and_finishes(
    tmp_path: Path, tree_bytes, capsys, target: str, when: str
) -> None:
    from shardify.cli import main

    src = make_imagefolder(tmp_path / "src", classes=2, per_class=3, sizes=((48, 32),))
    args = ["convert", "imagefolder", str(src), "OUT", "--samples-per-shard", "2", "--workers", "1", "--quiet"]
    ref, out = tmp_path / "ref", tmp_path / "out"
    subprocess.run([*CMD[:3], *[a if a != "OUT" else str(ref) for a in args]], check=True)
    killed = subprocess.run([*KILL_AT, target, when, *[a if a != "OUT" else str(out) for a in args]])
    assert killed.returncode == -signal.SIGKILL
    assert (list(out.glob(".*.tmp")) != []) == (when == "before"), "the kill should leave the temp file"
    if (out / "manifest.json").exists():  # verify tells what the kill left
        capsys.readouterr()
        assert main(["verify", str(out)]) == 3
        text = capsys.readouterr().out
        assert (".tmp: temporary file of an interrupted write" in text) == (when == "before"), text
        assert ".shardify-work/: an interrupted conversion's work folder" in text, text
    rerun = subprocess.run([*CMD[:3], *[a if a != "OUT" else str(out) for a in args]], capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    assert tree_bytes(out) == tree_bytes(ref)  # every file: no temp file, no work folder left
    assert main(["verify", str(out)]) == 0
