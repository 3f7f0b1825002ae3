"""Per-sample checks of whole-shard reads: a sample whose bytes changed since the conversion is
an error naming the shard and key by default (a counted skip under ``on_error="skip"``), with 0
and 2 workers, for JPEGs that still decode and for tiny samples; ``check_samples=False`` reads
it; ``verify=True`` hashes a shard again when its file changed between two epochs of
persistent workers."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from PIL import Image

from shardify.cli import main as cli
from shardify.convert import ShardWriter
from shardify.convert.synth import make_imagefolder
from shardify.errors import SampleChecksumError, SampleError, ShardFormatError
from shardify.reader import DecodeOptions, ShardedDataset, make_loader
from shardify.reader import transforms as T
from shardify.tarfmt import BLOCK


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A converted image folder: 16 JPEGs of 4 classes, in 2 shards (kept pristine: copied per test)."""
    root = tmp_path_factory.mktemp("photos")
    make_imagefolder(root / "in", classes=4, per_class=4, sizes=((48, 40),))
    assert cli(["convert", "imagefolder", str(root / "in"), str(root / "out"), "--split", "train",
                "--samples-per-shard", "8"]) == 0  # fmt: skip
    return root / "out"


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


def _shards(root: Path) -> list[Path]:
    return sorted(root.glob("*.tar"))


def _member(shard: Path, suffix: str, nth: int = 0) -> tuple[str, int, int]:
    """``(key, data offset, size)`` of the ``nth`` member named ``*suffix`` in ``shard``."""
    raw = shard.read_bytes()
    at, seen = 0, 0
    while at + BLOCK <= len(raw) and raw[at] != 0:
        name = raw[at : at + 100].split(b"\0", 1)[0].decode()
        size = int(raw[at + 124 : at + 136].split(b"\0", 1)[0].strip() or b"0", 8)
        if name.endswith(suffix):
            if seen == nth:
                return name.rsplit("/", 1)[-1].split(".", 1)[0], at + BLOCK, size
            seen += 1
        at += BLOCK + size + (-size % BLOCK)
    raise AssertionError(f"no member {suffix} #{nth} in {shard}")


def _change_jpeg(shard: Path) -> str:
    """Change the first JPEG of ``shard`` in place, same length, so that it still decodes (its
    JFIF density); the changed sample's key."""
    key, at, size = _member(shard, ".jpg")
    raw = bytearray(shard.read_bytes())
    jpeg = bytes(raw[at : at + size])
    jfif = jpeg.index(b"JFIF\0")
    raw[at + jfif + 8] ^= 0x01  # the low byte of the horizontal density: not a pixel changes
    changed = bytes(raw[at : at + size])
    assert changed != jpeg
    Image.open(io.BytesIO(changed)).convert("RGB").load()  # still a good JPEG
    mtime = shard.stat().st_mtime_ns
    shard.write_bytes(bytes(raw))
    os.utime(shard, ns=(mtime, mtime))  # even the mtime as before
    return key


def _photos_ds(root: Path, **decoding: object) -> ShardedDataset:
    return ShardedDataset(
        root,
        batch_size=4,
        transform=T.imagenet_train(32),
        fields=("image", "cls"),
        decoding=DecodeOptions(**decoding),  # type: ignore[arg-type]
    )


def _read(ds: ShardedDataset, workers: int) -> int:
    with make_loader(ds, num_workers=workers) as loader:
        return sum(len(labels) for _, labels in loader)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_jpeg_changed_in_place_is_an_error_naming_shard_and_key(photos: Path, tmp_path: Path, workers: int) -> None:
    root = _copy(photos, tmp_path / "ds")
    shard = _shards(root)[1]
    key = _change_jpeg(shard)
    with pytest.raises(SampleError) as caught:
        _read(_photos_ds(root), workers)
    assert isinstance(caught.value, SampleChecksumError)  # (a worker's comes back as its message)
    assert f"{shard.name}, key {key!r}" in str(caught.value) and "checksum" in str(caught.value)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_jpeg_changed_in_place_is_a_counted_skip(photos: Path, tmp_path: Path, workers: int) -> None:
    root = _copy(photos, tmp_path / "ds")
    shard = _shards(root)[0]
    key = _change_jpeg(shard)
    ds = _photos_ds(root, on_error="skip")
    assert _read(ds, workers) == 16  # the batch is filled with good samples
    report = ds.last_epoch_report
    assert report.lost + report.bad == 1
    [(where, _, reason)] = report.entries
    assert where.endswith(shard.name) and key in reason and "checksum" in reason


def test_check_samples_false_reads_the_changed_jpeg(photos: Path, tmp_path: Path) -> None:
    root = _copy(photos, tmp_path / "ds")
    _change_jpeg(_shards(root)[0])
    assert _read(_photos_ds(root, check_samples=False), 0) == 16


def test_a_changed_padding_byte_is_caught_too(photos: Path, tmp_path: Path) -> None:
    """The checksum covers a sample's whole tar bytes: headers and padding too."""
    root = _copy(photos, tmp_path / "ds")
    shard = _shards(root)[0]
    key, at, size = _member(shard, ".cls")
    raw = bytearray(shard.read_bytes())
    raw[at + size] = ord("x")  # after the label, in its padding: the sample reads the same
    shard.write_bytes(bytes(raw))
    with pytest.raises(SampleChecksumError) as caught:
        _read(_photos_ds(root), 0)
    assert caught.value.key == key


# -- tiny samples ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 tiny samples (a label and a short text) in 4 shards, tables inline."""
    root = tmp_path_factory.mktemp("tiny") / "ds"
    with ShardWriter(root, samples_per_shard=10, fsync=False) as w:
        for i in range(40):
            w.write({"__key__": f"{i:04d}", "txt": f"text {i:04d}", "cls": i % 3})
    index = json.loads(next(p for p in root.glob("*.json") if p.name != "manifest.json").read_text())
    assert all(e.get("samples") for e in index["shardlist"])
    return root


def _change_text(shard: Path) -> str:
    """Change one character of the second text of ``shard`` in place; the sample's key."""
    key, at, _ = _member(shard, ".txt", nth=1)
    raw = bytearray(shard.read_bytes())
    raw[at] = ord("T")  # "text ..." -> "Text ...": a valid sample, another value
    shard.write_bytes(bytes(raw))
    return key


def _texts(root: Path, workers: int, **decoding: object) -> tuple[list[str], ShardedDataset]:
    ds = ShardedDataset(root, batch_size=4, fields=("txt",), decoding=DecodeOptions(**decoding))  # type: ignore[arg-type]
    with make_loader(ds, num_workers=workers) as loader:
        return [t for batch in loader for t in batch], ds


@pytest.mark.parametrize("workers", [0, 2])
def test_a_tiny_sample_changed_in_place_is_an_error_or_a_counted_skip(tiny: Path, tmp_path: Path, workers: int) -> None:
    root = _copy(tiny, tmp_path / "ds")
    shard = _shards(root)[2]
    key = _change_text(shard)
    with pytest.raises(SampleChecksumError) as caught:
        _texts(root, workers)
    assert f"{shard.name}, key {key!r}" in str(caught.value)
    texts, ds = _texts(root, workers, on_error="skip")
    assert len(texts) == 40 and not any(t.startswith("Text") for t in texts)
    assert ds.last_epoch_report.lost + ds.last_epoch_report.bad == 1
    texts, _ = _texts(root, workers, check_samples=False)
    assert sum(t.startswith("Text") for t in texts) == 1  # the opt-out reads the changed sample


def test_a_field_subset_is_checked_too(tiny: Path, tmp_path: Path) -> None:
    """Reading only ``cls`` still checks the sample whose text changed (its bytes are one checksum)."""
    root = _copy(tiny, tmp_path / "ds")
    key = _change_text(_shards(root)[0])
    ds = ShardedDataset(root, batch_size=4, fields=("cls",))
    with pytest.raises(SampleChecksumError) as caught:
        list(ds)
    assert caught.value.key == key


def test_a_shard_shorter_than_its_table_loses_the_rest(tiny: Path, tmp_path: Path) -> None:
    """Under skip, a damaged shard is read by its table up to the cut, each sample still
    checked (not forward and unchecked): the changed sample before the cut is skipped too."""
    root = _copy(tiny, tmp_path / "ds")
    shard = _shards(root)[1]
    _change_text(shard)  # the second sample, well before the cut
    raw = shard.read_bytes()
    shard.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ShardFormatError, match="truncated"):
        _texts(root, 0)
    texts, ds = _texts(root, 0, on_error="skip")
    assert len(texts) == 40 and not any(t.startswith("Text") for t in texts)
    assert ds.last_epoch_report.lost >= 6


# -- verify=True and a shard changed between epochs ---------------------------------------------------


def test_verify_hashes_a_shard_again_when_it_changed_between_epochs(tiny: Path, tmp_path: Path) -> None:
    """Persistent workers hash each shard once; a shard changed after that is hashed again (the
    per-sample check is off here, so only verify can tell)."""
    root = _copy(tiny, tmp_path / "ds")
    shard = _shards(root)[3]
    decoding = DecodeOptions(verify=True, check_samples=False)
    ds = ShardedDataset(root, batch_size=4, fields=("txt",), decoding=decoding)
    with make_loader(ds, num_workers=2, persistent_workers=True) as loader:
        ds.set_epoch(0)
        assert len([t for b in loader for t in b]) == 40
        _change_text(shard)
        ds.set_epoch(1)
        with pytest.raises(ShardFormatError) as caught:
            list(loader)
    assert shard.name in str(caught.value) and "sha256" in str(caught.value)


def test_verify_hashes_a_shard_once_while_its_file_stays_the_same(tiny: Path, tmp_path: Path, monkeypatch) -> None:
    """The stamp looked at before each read costs no hash while the file is unchanged; a touch
    (same bytes, new mtime) is hashed again and passes."""
    from shardify.jsonfiles import file_sha256
    from shardify.reader.io import shardfile

    root = _copy(tiny, tmp_path / "ds")
    shard = _shards(root)[0]
    calls: list[int] = []
    monkeypatch.setattr(shardfile, "file_sha256", lambda f: (calls.append(1), file_sha256(f))[1])
    with open(shard, "rb") as f:
        sha = file_sha256(f)
    files = shardfile.ShardFiles(
        [str(shard)],
        [10],
        skip_damaged=False,
        opener=lambda url: (open(url, "rb"), True),
        checks=shardfile.ShardChecks(checksums=[sha]),
        max_member=1 << 20,
        keep=None,
    )
    assert files.verify(0) is None and files.verify(0) is None and len(calls) == 1
    os.utime(shard, ns=(1, 1))
    assert files.verify(0) is None and len(calls) == 2
    _change_text(shard)
    problem = files.verify(0)
    assert problem is not None and "sha256" in str(problem) and len(calls) == 3
    files.close()


def test_show_and_bench_read_checked_samples(photos: Path, tmp_path: Path) -> None:
    """``shardify show`` and the benchmark's image reader pass over a changed sample, as the
    loader does: they read with the shards' per-sample tables."""
    from shardify.cli.bench.measure import _encoded_images
    from shardify.reader.io.sources import resolve_source
    from shardify.reader.show import _read

    root = _copy(photos, tmp_path / "ds")
    shard = _shards(root)[0]
    key, at, _ = _member(shard, ".jpg", 2)
    raw = bytearray(shard.read_bytes())
    raw[at + 200] ^= 0xFF  # deep in the JPEG's data: it may still decode
    shard.write_bytes(bytes(raw))
    source = resolve_source(root / "train.json")
    shown = {str(s["__key__"]) for s in _read(source, list(range(16)))}
    benched = {k for k, _ in _encoded_images(source, None)}
    assert len(shown) == len(benched) == 15 and key not in shown and key not in benched
