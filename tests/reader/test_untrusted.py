"""Untrusted shards: pickles never run unless allowed, and verify=True checks checksums.

A malicious pickle (its ``__reduce__`` calls ``os.system``) in a ``.pkl``/``.pickle``/``.pyd``
field is refused, a ``.pt``/``.pth`` field goes only through ``torch.load(weights_only=True)``,
an object ``.npy`` only through ``np.load(allow_pickle=False)``: read end to end with workers,
the marker file the payload would create never appears. ``verify=True`` compares each shard's
SHA-256 with the split index before using it.
"""

from __future__ import annotations

import io
import os
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from shardify.errors import SampleError, ShardFormatError
from shardify.reader import DecodeOptions, ShardedDataset, make_loader

TIME_LIMIT_S = 60
"""A hang fails the test instead of stalling the run (see tests/conftest.py)."""


class Payload:
    """Unpickling this runs a shell command that creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, (f": > '{self.marker}'",))


def _encode(ext: str, marker: Path) -> bytes:
    if ext in ("pt", "pth"):
        buf = io.BytesIO()
        torch.save({"weights": torch.zeros(2), "hook": Payload(marker)}, buf)
        return buf.getvalue()
    if ext == "npy":
        buf = io.BytesIO()
        arr = np.empty(1, dtype=object)
        arr[0] = Payload(marker)
        np.save(buf, arr, allow_pickle=True)
        return buf.getvalue()
    return pickle.dumps({"label": 1, "hook": Payload(marker)})


EXPECTED = {
    "pkl": "refusing to unpickle it",
    "pickle": "refusing to unpickle it",
    "pyd": "refusing to unpickle it",
    "pt": "torch.load(weights_only=True) refused it",
    "pth": "torch.load(weights_only=True) refused it",
    "npy": "allow_pickle=False",
}


@pytest.fixture
def evil_dataset(tmp_path: Path, shards):
    """``make(ext)`` -> (dataset root, marker path): 2 shards of 4 samples, each with a payload field."""

    def make(ext: str) -> tuple[Path, Path]:
        marker = tmp_path / f"pwned-{ext}"
        data = [
            [(f"s{s}_{i}", {"cls": str(i).encode(), ext: _encode(ext, marker)}) for i in range(4)] for s in range(2)
        ]
        return shards.write_dataset(tmp_path / ext, data), marker

    return make


@pytest.mark.parametrize("ext", sorted(EXPECTED))
def test_malicious_pickle_never_runs_when_read_with_workers(evil_dataset, ext: str) -> None:
    root, marker = evil_dataset(ext)
    ds = ShardedDataset(root, batch_size=2, fields=("cls", ext), shuffle=True)
    with make_loader(ds, num_workers=2) as loader, pytest.raises(SampleError) as caught:
        list(loader)
    message = str(caught.value)
    assert "train-00000" in message and "key 's" in message, message
    assert f"field {ext!r}" in message and EXPECTED[ext] in message, message
    assert not marker.exists(), "the pickle payload ran"


@pytest.mark.parametrize("ext", sorted(EXPECTED))
def test_malicious_pickle_under_the_skip_policy(evil_dataset, ext: str) -> None:
    root, marker = evil_dataset(ext)
    ds = ShardedDataset(root, batch_size=2, fields=("cls", ext), decoding=DecodeOptions(on_error="skip"))
    if ext in ("pkl", "pickle", "pyd"):
        # A refused pickle is a setting to change, not bad data: it raises even when skipping.
        with make_loader(ds, num_workers=2) as loader, pytest.raises(SampleError, match="allow_pickle=True"):
            list(loader)
    else:
        with make_loader(ds, num_workers=2) as loader, pytest.raises(SampleError, match="nothing to pad them with"):
            list(loader)  # every sample is bad: each worker says so, naming the first
    assert not marker.exists(), "the pickle payload ran"


def test_some_malicious_samples_are_skipped_and_counted(tmp_path: Path, shards) -> None:
    marker = tmp_path / "pwned"
    data = [
        [
            (f"s{s}_{i}", {"cls": str(i).encode(), "pt": _encode("pt", marker) if i == 1 else _encode_safe_pt(i)})
            for i in range(4)
        ]
        for s in range(2)
    ]
    root = shards.write_dataset(tmp_path / "mixed", data)
    ds = ShardedDataset(root, batch_size=2, fields=("cls", "pt"), decoding=DecodeOptions(on_error="skip"))
    with make_loader(ds, num_workers=2) as loader:
        batches = list(loader)
    assert len(batches) == len(ds) == 4
    report = ds.last_epoch_report
    assert report.bad == 2 and all("weights_only=True" in reason for _, _, reason in report.entries)
    assert {key for _, key, _ in report.entries} == {"s0_1", "s1_1"}
    assert not marker.exists()


def _encode_safe_pt(i: int) -> bytes:
    buf = io.BytesIO()
    torch.save({"weights": torch.full((2,), float(i))}, buf)
    return buf.getvalue()


@pytest.mark.parametrize("ext", ["pkl", "pt"])
def test_map_decoding_every_field_refuses_too(evil_dataset, ext: str) -> None:
    root, marker = evil_dataset(ext)
    ds = ShardedDataset(root, batch_size=2, map=lambda s: s["cls"])
    with pytest.raises(SampleError, match=re.escape(EXPECTED[ext])):
        list(ds)
    assert not marker.exists()


@pytest.mark.parametrize("ext", ["pkl", "pt"])
def test_the_payload_is_live_when_the_user_opts_in(evil_dataset, ext: str) -> None:
    """The control: with allow_pickle=True the same shards do run the payload."""
    root, marker = evil_dataset(ext)
    list(ShardedDataset(root, batch_size=2, fields=("cls", ext), decoding=DecodeOptions(allow_pickle=True)))
    assert marker.exists()


def test_unselected_pickle_fields_are_never_decoded(evil_dataset) -> None:
    root, marker = evil_dataset("pkl")
    assert len(list(ShardedDataset(root, batch_size=2, fields=("cls",)))) == 4
    assert not marker.exists()


# -- checksums ---------------------------------------------------------------------------------------


def _tamper(shard: Path) -> None:
    """Change one label digit: the tar stays well formed, only the checksum can tell."""
    raw = bytearray(shard.read_bytes())
    raw[512] = ord("7") if raw[512] != ord("7") else ord("8")  # data of the first member (cls)
    shard.write_bytes(bytes(raw))


def test_verify_passes_and_hashes_each_shard_once_per_process(counting_dataset, monkeypatch) -> None:
    from shardify.reader.io import shardfile

    root = counting_dataset([5, 6, 4])
    calls: list[int] = []
    real = shardfile.file_sha256
    monkeypatch.setattr(shardfile, "file_sha256", lambda f: (calls.append(1), real(f))[1])
    ds = ShardedDataset(root, batch_size=3, fields=("cls",), shuffle=True, decoding=DecodeOptions(verify=True))
    for epoch in range(2):
        ds.set_epoch(epoch)
        assert sorted(int(x) for b in ds for x in b) == list(range(15))
    assert len(calls) == 3


def test_tampered_shard_reads_silently_without_verify_and_fails_with_it(counting_dataset) -> None:
    root = counting_dataset([5, 6, 4])
    _tamper(root / "train-000001.tar")
    values = sorted(int(x) for b in ShardedDataset(root, batch_size=3, fields=("cls",)) for x in b)
    assert values != list(range(15))  # the tar is fine; the label changed
    ds = ShardedDataset(root, batch_size=3, fields=("cls",), decoding=DecodeOptions(verify=True))
    with make_loader(ds, num_workers=2) as loader, pytest.raises(ShardFormatError) as caught:
        list(loader)
    assert "train-000001.tar" in str(caught.value) and "sha256" in str(caught.value)
    assert "does not match the manifest" in str(caught.value)


def test_tampered_shard_is_skipped_whole_and_counted(counting_dataset, monkeypatch) -> None:
    root = counting_dataset([12, 6, 12])  # every worker keeps good samples to pad with
    _tamper(root / "train-000001.tar")
    monkeypatch.setenv("WORLD_SIZE", "2")
    seen, lost, counts = set(), 0, []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        ds = ShardedDataset(
            root, batch_size=3, fields=("cls",), decoding=DecodeOptions(verify=True, on_error="skip"), shuffle=True
        )
        with make_loader(ds, num_workers=2) as loader:
            batches = list(loader)
        counts.append(len(batches))
        seen |= {int(x) for b in batches for x in b}
        report = ds.last_epoch_report
        lost += report.lost
        assert all("train-000001.tar" in shard and "sha256" in reason for shard, _, reason in report.entries)
    assert counts == [len(ds)] * 2
    assert lost == 6 and seen.isdisjoint(range(12, 18))


def test_verify_needs_checksums(counting_dataset) -> None:
    root = counting_dataset([3])
    with pytest.raises(ValueError, match="sha256"):
        ShardedDataset(
            [str(root / "train-000000.tar")], batch_size=2, fields=("cls",), decoding=DecodeOptions(verify=True)
        )


def test_shardify_verify_finds_the_same_tampering(counting_dataset, capsys) -> None:
    from shardify.cli import main

    root = counting_dataset([5, 6, 4])
    _tamper(root / "train-000001.tar")
    assert main(["verify", str(root)]) == 3
    assert "train-000001.tar: sha256 does not match" in capsys.readouterr().out
