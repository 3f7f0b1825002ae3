"""Sample offsets in the split index: written by every writer, checked by verify, and used by
the reader to read a short range after scanning only the windows of OFFSET_STRIDE samples it
falls in, with the same samples as a whole-shard scan and a fallback wherever the shard does
not match its index."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardify.convert import ShardWriter, convert_items
from shardify.convert.verify import verify_dataset
from shardify.errors import ManifestError
from shardify.reader.io import shardfile as shardfile_module
from shardify.reader.io.sources import resolve_source
from shardify.reader.io.stream import ShardReader
from shardify.splitindex import ShardEntry
from shardify.tarfmt import OFFSET_STRIDE
from shardify.tario import scan_layout

N = 3 * OFFSET_STRIDE + 17  # four windows, the last one short


def _sample(i: int) -> dict[str, object]:
    return {"txt": "x" * (i * 37 % 1500), "cls": i % 5, **({"json": {"i": i}} if i % 3 == 0 else {})}


CHUNK = 2
"""Samples per chunk where a test runs over the chunked layout too: small, so a shard has
several windows of OFFSET_STRIDE chunks."""


def _dataset(root: Path, chunk: int | None = None) -> Path:
    with ShardWriter(root, samples_per_shard=N, fsync=False, chunk=chunk) as w:
        for i in range(N):
            w.write(_sample(i))
    return root


def _index(root: Path) -> dict:
    return json.loads((root / "train.json").read_text())


@pytest.mark.parametrize("chunk", [None, 3], ids=["per-sample", "chunked"])
@pytest.mark.parametrize("writer", ["ShardWriter", "convert_items", "cli listing"])
def test_every_writer_lists_the_offset_of_every_strideth_sample(tmp_path: Path, writer: str, chunk: int | None) -> None:
    """Per sample, or in a chunked split per chunk (the tar samples of its shards)."""
    out = tmp_path / "out"
    if writer == "ShardWriter":
        _dataset(out, chunk)
    elif writer == "convert_items":
        convert_items(
            range(N), _sample, out, samples_per_shard=100, workers=2, fsync=False, progress=False, chunk=chunk
        )
    else:
        from shardify.cli import main

        listing = tmp_path / "rows.jsonl"
        listing.write_text(
            "".join(json.dumps({"id": f"r{i:04d}", "label": i % 3, "text": "t" * (i % 90)}) + "\n" for i in range(N))
        )
        assert (
            main(
                [
                    "convert",
                    "listing",
                    str(listing),
                    str(out),
                    "--samples-per-shard",
                    str(2 * OFFSET_STRIDE + 5),
                    "--quiet",
                    "--no-fsync",
                    "--workers",
                    "2",
                    *(["--chunk", str(chunk)] if chunk else []),
                ]
            )
            == 0
        )
    shards = _index(out)["shardlist"]
    assert len(shards) >= (1 if writer == "ShardWriter" else 2)
    assert _index(out)["shardify"].get("chunk") == chunk
    for entry in shards:
        with open(out / entry["url"], "rb") as f:
            layout = scan_layout(f, shard=entry["url"])
        assert entry["offsets"] == list(layout.offsets[::OFFSET_STRIDE])
    assert verify_dataset(out).ok


def _reader(root: Path, offsets: bool = True) -> tuple[ShardReader, int]:
    src = resolve_source(root)
    (shard,) = src.shards
    return ShardReader(
        [shard.url],
        [shard.nsamples],
        skip_damaged=False,
        offsets=[shard.offsets] if offsets else None,
        chunks=[shard.chunk],
    ), shard.nsamples


def _plain(items: list) -> list:
    """Items without their byte offsets and shard paths (which differ between layouts)."""
    return [{k: v for k, v in x.items() if k not in ("__offset__", "__shard__")} for x in items]


S = OFFSET_STRIDE
RANGES = [
    (0, 4),
    (S - 4, S + 4),
    (S - 2, 2 * S + 2),
    (S, S + 1),
    (2 * S - 1, 2 * S + 1),
    (3 * S - 2, N),
    (N - 3, N),
    (0, 1),
    (5, 2 * S - 8),
]


@pytest.mark.parametrize("chunk", [None, CHUNK], ids=["per-sample", "chunked"])
def test_short_ranges_read_through_windows_equal_a_whole_shard_scan(
    tmp_path: Path, monkeypatch, chunk: int | None
) -> None:
    """Chunked: the windows are of chunks, and the samples equal the per-sample layout's."""
    root = _dataset(tmp_path / "ds", chunk)
    plain, n = _reader(root, offsets=False)
    expected = {r: list(plain.read(0, *r)) for r in RANGES}
    if chunk is not None:
        per_sample, _ = _reader(_dataset(tmp_path / "plain"), offsets=False)
        for r in RANGES:
            assert _plain(expected[r]) == _plain(list(per_sample.read(0, *r))), r

    def no_whole_scan(*a, **k):
        raise AssertionError("a short range must not scan the whole shard")

    monkeypatch.setattr(shardfile_module, "scan_layout", no_whole_scan)
    windowed, _ = _reader(root)
    for r in RANGES:
        assert list(windowed.read(0, *r)) == expected[r], r
    assert len(windowed._files._windows) == (4 if chunk is None else -(-N // CHUNK // OFFSET_STRIDE))


@pytest.mark.parametrize("tamper", ["one shifted", "swapped", "last too early", "past the end", "file size"])
def test_a_shard_that_does_not_match_its_offsets_is_scanned_whole(tmp_path: Path, tamper: str) -> None:
    root = _dataset(tmp_path / "ds")
    plain, n = _reader(root, offsets=False)
    expected = {r: list(plain.read(0, *r)) for r in RANGES}
    src = resolve_source(root)
    offsets = list(src.shards[0].offsets)
    with open(src.shards[0].url, "rb") as f:
        every = list(scan_layout(f, shard="s").offsets)
    size = src.shards[0].filesize
    if tamper == "one shifted":  # still a real sample's header, one sample late
        offsets[1] = every[OFFSET_STRIDE + 1]
    elif tamper == "swapped":
        offsets[1], offsets[2] = offsets[2], offsets[1]
    elif tamper == "last too early":
        offsets[-1] = every[-2]
    elif tamper == "past the end":
        offsets[-1] = every[-1] + 10**6
    else:  # the file is not the one the index was written for
        size += 512
    reader = ShardReader([src.shards[0].url], [n], skip_damaged=False, offsets=[offsets], filesizes=[size])
    for r in RANGES:
        assert list(reader.read(0, *r)) == expected[r], (tamper, r)
    if tamper == "file size":  # the first window was refused, and the whole shard scanned instead
        assert list(reader._files._windows.values()) == [None]


def test_the_index_refuses_offsets_that_cannot_be_right_and_omits_none() -> None:
    entry = {"url": "a.tar", "nsamples": 2 * OFFSET_STRIDE + 2, "filesize": 10**6, "sha256": ""}
    assert "offsets" not in ShardEntry.from_json(entry, source="t").to_json()
    good = ShardEntry.from_json({**entry, "offsets": [0, 5000, 9000]}, source="t")
    assert good.to_json()["offsets"] == [0, 5000, 9000]
    for bad in (
        [0, 5000],
        [1, 5000, 9000],
        [0, 9000, 5000],
        [0, 5000, 10**6],
        [0, "x", 9000],
        "0",
        [0, 5000, 9000, 9500],
    ):
        with pytest.raises(ManifestError, match="offsets"):
            ShardEntry.from_json({**entry, "offsets": bad}, source="t")


def test_verify_reports_an_index_whose_offsets_do_not_match(tmp_path: Path, record_index) -> None:
    root = _dataset(tmp_path / "ds")
    for name in ("train.json", next(p.name for p in root.glob("train-*.json"))):
        index = json.loads((root / name).read_text())
        index["shardlist"][0]["offsets"][2] += 512
        (root / name).write_text(json.dumps(index))
    record_index(root)  # an index written so (not edited after the manifest): its offsets are checked
    report = verify_dataset(root)
    assert [p.message for p in report.problems] == [
        f"the index's offset of sample {2 * OFFSET_STRIDE} is "
        f"{json.loads((root / 'train.json').read_text())['shardlist'][0]['offsets'][2]}, "
        f"the shard's is {json.loads((root / 'train.json').read_text())['shardlist'][0]['offsets'][2] - 512}"
    ]
