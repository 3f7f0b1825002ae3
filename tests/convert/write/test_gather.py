"""The shard writer's I/O: gathered writes, inputs read by size, and durable shards."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shardify.convert.options import ConvertOptions
from shardify.convert.synth import make_imagefolder
from shardify.convert.write import gather, readsample, shards
from shardify.convert.write.gather import GatherFile
from shardify.convert.write.run import convert_imagefolder

PIECES = [b"h" * 512, os.urandom(200_000), b"\0" * 64, b"", os.urandom(3 << 20), b"tail", os.urandom(70_000)]


@pytest.mark.parametrize("short", [False, True], ids=["whole-writev", "short-writev"])
def test_gathered_pieces_land_in_order_and_whole(tmp_path: Path, monkeypatch, short: bool) -> None:
    if short:  # the kernel may write less than asked (a signal, a filling disk): the rest must follow
        real = os.writev
        monkeypatch.setattr(gather.os, "writev", lambda fd, parts: real(fd, [b"".join(parts)[:1001]]))
    slot = bytearray(b"abcdefgh")
    with GatherFile(tmp_path / "f") as f:
        for piece in PIECES[:3]:
            f.write(piece)
        f.write(memoryview(slot)[2:6])  # a view of a slot reused at once: written before write returns
        slot[:] = b"XXXXXXXX"
        for piece in PIECES[3:]:
            f.write(piece)
    assert (tmp_path / "f").read_bytes() == b"".join(PIECES[:3]) + b"cdef" + b"".join(PIECES[3:])


@pytest.mark.parametrize("durable", [True, False])
def test_a_durable_file_starts_its_disk_write_as_it_goes(tmp_path: Path, monkeypatch, durable: bool) -> None:
    asked: list[tuple[int, int]] = []
    monkeypatch.setattr(gather, "start_writeback", lambda fd, offset, n: asked.append((offset, n)) or True)
    with GatherFile(tmp_path / "f", write_behind=durable) as f:
        for _ in range(12):
            f.write(os.urandom(1 << 20))
    if not durable:
        assert asked == []
        return
    # contiguous ranges from 0, each at least WRITE_BEHIND_BYTES, covering all but the last few MiB
    assert asked and asked[0][0] == 0
    assert all(a + n == b for (a, n), (b, _) in zip(asked, asked[1:]))
    assert all(n >= gather.WRITE_BEHIND_BYTES for _, n in asked)
    assert 12 * (1 << 20) - gather.WRITE_BEHIND_BYTES < sum(n for _, n in asked) <= 12 * (1 << 20)


def test_sync_file_range_is_found_and_harmless_on_linux(tmp_path: Path) -> None:
    with GatherFile(tmp_path / "f") as f:
        f.write(b"x" * 4096)
        f.flush()
        found = gather.start_writeback(f.fileno(), 0, 4096)
    assert found == os.uname().sysname.startswith("Linux")
    assert (tmp_path / "f").read_bytes() == b"x" * 4096


def test_inputs_are_read_whole_when_fstat_is_out_of_date(tmp_path: Path, monkeypatch, make_image) -> None:
    image, other = tmp_path / "a.jpg", tmp_path / "b.bin"
    image.write_bytes(make_image(size=(300, 200)))
    other.write_bytes(os.urandom(50_000))
    real = os.fstat
    monkeypatch.setattr(readsample.os, "fstat", lambda fd: os.stat_result((*real(fd)[:6], 10, *real(fd)[7:])))
    assert readsample._read_input(str(image), image=True, limit=None) == image.read_bytes()
    assert readsample._read_input(str(other), image=False, limit=None) == other.read_bytes()


def test_an_image_larger_than_the_sniff_is_checked_then_read_whole(tmp_path: Path, monkeypatch, make_image) -> None:
    monkeypatch.setattr(readsample, "SNIFF_BYTES", 1024)
    good, junk = tmp_path / "good.jpg", tmp_path / "junk.jpg"
    good.write_bytes(make_image(size=(300, 200)))
    junk.write_bytes(b"\xff\xd8\xff" + b"\x01" * 5000)
    assert len(good.read_bytes()) > 1024
    assert readsample._read_input(str(good), image=True, limit=None) == good.read_bytes()
    with pytest.raises(ValueError, match="not an image"):
        readsample._read_input(str(junk), image=True, limit=None)
    with pytest.raises(ValueError, match="too large"):
        readsample._read_input(str(good), image=True, limit=100)


def test_each_shard_is_fsynced_before_its_rename_and_the_manifest_comes_last(tmp_path: Path, monkeypatch) -> None:
    from shardify.convert.write import outfs

    src = make_imagefolder(tmp_path / "src", classes=2, per_class=4, sizes=((64, 48),))
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        real_fsync(fd)

    def replace(a, b) -> None:
        events.append(("rename", os.path.basename(str(a))))
        real_replace(a, b)

    monkeypatch.setattr(outfs.os, "fsync", fsync)
    monkeypatch.setattr(outfs.os, "replace", replace)
    convert_imagefolder(src, tmp_path / "out", options=ConvertOptions(workers=1, progress=False, samples_per_shard=2))
    shards = sorted(p.name for p in (tmp_path / "out").glob("train-*.tar"))
    assert len(shards) == 4
    for name in shards:
        tmp = f".{name}.tmp"
        assert events.index(("fsync", tmp)) < events.index(("rename", tmp)), name
    manifest_write = max(
        i for i, (kind, name) in enumerate(events) if kind == "fsync" and name.startswith(".manifest.json")
    )
    assert all(events.index(("rename", f".{name}.tmp")) < manifest_write for name in shards)


def test_decoder_messages_keep_input_warnings_and_drop_deprecations() -> None:
    import warnings

    from shardify.convert.inputs.capture import decoder_messages

    with decoder_messages(native=False) as messages:
        warnings.warn("Palette images with Transparency expressed in bytes", UserWarning, stacklevel=1)
        warnings.warn("old API", DeprecationWarning, stacklevel=1)
        warnings.warn("older API", PendingDeprecationWarning, stacklevel=1)
        warnings.warn("Image appears to be a malformed MPO file", UserWarning, stacklevel=1)
    assert messages == [
        "UserWarning: Palette images with Transparency expressed in bytes",
        "UserWarning: Image appears to be a malformed MPO file",
    ]


def test_progress_counts_every_sample_and_byte_of_a_shard(tmp_path: Path) -> None:
    from dataclasses import replace

    from shardify.convert.inputs.imagefolder import scan_imagefolder
    from shardify.convert.write.plan import ShardPlan, plan_split
    from shardify.tarfmt import END_OF_ARCHIVE

    src = make_imagefolder(tmp_path / "src", classes=1, per_class=37, sizes=((32, 24),))
    scan = scan_imagefolder(src)
    plan = plan_split(scan, ConvertOptions(samples_per_shard=100))
    task = shards.ShardTask(
        out_dir=str(tmp_path / "out"),
        root=scan.root,
        split="train",
        plan=ShardPlan(-1, (), (), 0),
        check_full=False,
        max_side=None,
        quality=90,
        strict=False,
        fsync=False,
        version=plan.version,
    )
    (tmp_path / "out").mkdir()
    told: list[tuple[int, int]] = []
    result = shards.write_shard(replace(task, plan=plan.shard(0)), lambda n, b: told.append((n, b)))
    assert sum(n for n, _ in told) == result.nsamples == 37
    assert sum(b for _, b in told) == result.filesize - len(END_OF_ARCHIVE)
    assert len(told) < 37  # batched: the lock shared by the workers is not taken per sample
