"""tools/benchlib: the corpora are deterministic and one definition each; timing and output."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from shardify.convert.synth import make_imagefolder

TOOLS = Path(__file__).resolve().parents[2] / "tools"


def _lib(monkeypatch: pytest.MonkeyPatch, name: str) -> ModuleType:
    monkeypatch.syspath_prepend(str(TOOLS))
    return importlib.import_module(f"benchlib.{name}")


@pytest.fixture()
def corpus(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return _lib(monkeypatch, "corpus")


@pytest.fixture()
def timing(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return _lib(monkeypatch, "timing")


@pytest.fixture()
def memory(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return _lib(monkeypatch, "memory")


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_photos_are_make_imagefolders_files_made_on_every_core(corpus: ModuleType, tmp_path: Path) -> None:
    sizes = ((40, 30), (30, 40))
    made = corpus.photos(tmp_path / "a", 6, classes=2, sizes=sizes)
    again = corpus.photos(tmp_path / "b", 6, classes=2, sizes=sizes)
    reference = make_imagefolder(tmp_path / "ref", classes=2, per_class=3, seed=0, sizes=sizes)
    assert _files(made) == _files(again) == _files(reference)
    assert len(_files(made)) == 6


def test_a_photo_dataset_with_copies_holds_each_image_that_many_times(corpus: ModuleType, tmp_path: Path) -> None:
    from shardify.reader import ShardedDataset

    sizes = dict(classes=2, samples_per_shard=4, shard_size=None)
    _, once = corpus.photo_dataset(tmp_path, 4, **sizes)
    _, twice = corpus.photo_dataset(tmp_path, 4, copies=2, **sizes)
    assert once != twice
    assert ShardedDataset(twice, batch_size=1).num_samples == 2 * ShardedDataset(once, batch_size=1).num_samples == 8


def test_arrays_are_deterministic_and_every_class_alike(corpus: ModuleType) -> None:
    images, labels = corpus.arrays(30, classes=10)
    again, _ = corpus.arrays(30, classes=10)
    assert all((a == b).all() for a, b in zip(images, again))
    assert images[0].shape == (3, 32, 32) and images[0].dtype.name == "uint8"
    assert sorted(labels) == sorted(list(range(10)) * 3)
    assert not all((a == images[0]).all() for a in images[1:])


def test_the_listing_is_the_same_file_each_time(corpus: ModuleType, tmp_path: Path) -> None:
    a = corpus.listing(tmp_path / "a.jsonl", 50).read_bytes()
    assert a == corpus.listing(tmp_path / "b.jsonl", 50).read_bytes()
    rows = [json.loads(line) for line in a.splitlines()]
    assert len(rows) == 50 and rows[1] == {"id": "img00000001", "label": 7919 % 1000, "text": rows[1]["text"]}


def test_timing_runs_each_call_between_syncs(timing: ModuleType) -> None:
    ticks = iter(range(100))
    events: list[str] = []
    got = timing.runs(lambda: events.append("fn"), 3, clock=lambda: float(next(ticks)), sync=lambda: events.append("s"))
    assert got == [1.0, 1.0, 1.0] and events == ["s", "fn", "s"] * 3
    assert timing.best_of(lambda: None, 2) >= 0
    assert timing.summary([3.0, 1.0, 2.0]) == {"best": 1.0, "median": 2.0}
    assert timing.min_median([3.0, 1.0, 2.0], ".1f") == "1.0 / 2.0"


def test_results_print_as_one_json_line_or_a_markdown_table(
    timing: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    timing.emit({"b": 2, "a": 1}, as_json=True)
    timing.emit({"b": 2, "a": 1}, as_json=False)
    first, *table = capsys.readouterr().out.splitlines()
    assert json.loads(first) == {"b": 2, "a": 1}
    assert table == ["| figure | value |", "|---|---|", "| a | 1 |", "| b | 2 |"]


def test_memory_counts_this_process(memory: ModuleType) -> None:
    assert memory.rss_mib() > 0 and memory.threads() >= 1
    other, _shm = memory.fd_counts()
    assert other >= 3  # stdin, stdout, stderr at least
    assert memory.peak_mib() >= memory.rss_mib() - 1


def test_the_camera_corpus_mixes_the_encodings_a_device_decoder_meets(corpus: ModuleType, tmp_path: Path) -> None:
    from PIL import Image

    from shardify.reader import ShardedDataset

    dataset = corpus.camera_dataset(tmp_path, 52)
    assert ShardedDataset(dataset, batch_size=4).num_samples == 52
    files = sorted((tmp_path / "camera-52").rglob("*.JPEG"), key=lambda p: int(p.stem.split("_")[1]))
    modes = [Image.open(p).mode for p in files]
    assert modes.count("L") == 2 and modes.count("CMYK") == 1 and modes.count("RGB") == 49
    assert sum(bool(Image.open(p).info.get("progressive")) for p in files) == 3
    assert corpus.camera_dataset(tmp_path, 52) == dataset  # made once


def test_a_dataset_made_by_an_older_format_is_made_again(corpus: ModuleType, tmp_path: Path) -> None:
    """The tools cache their datasets; one whose manifest this code refuses is removed and remade
    (a benchmark once failed on a dataset cached before the manifest recorded its index's SHA-256)."""
    root = corpus.arrays_dataset(tmp_path / "arrays", 20, samples_per_shard=10)
    assert corpus.made(root)
    manifest = json.loads((root / "manifest.json").read_text())
    for ref in manifest["splits"].values():
        ref.pop("index_sha256")
    (root / "manifest.json").write_text(json.dumps(manifest))
    assert not corpus.made(root) and not root.exists()
    assert corpus.made(corpus.arrays_dataset(tmp_path / "arrays", 20, samples_per_shard=10))


_FORK_CHECK = """
import signal, sys
sys.path.insert(0, sys.argv[1])
from benchlib import corpus

def default(_):
    return signal.getsignal(signal.SIGTERM) == signal.SIG_DFL

signal.signal(signal.SIGTERM, lambda s, f: sys.exit(s))  # what ray.init leaves
with corpus.fork_pool() as pool:
    print(pool.map(default, range(4)))
print(signal.getsignal(signal.SIGTERM) != signal.SIG_DFL)  # the parent's handler is back
"""


def test_photo_pool_workers_start_with_the_default_sigterm_whatever_the_parent_handles() -> None:
    """Pool.terminate's SIGTERM must end a worker: one that inherited a handler calling sys.exit
    (ray.init leaves one) could wait on the pool's queue lock and hang terminate for ever, or raise
    SystemExit in a copy of the parent. Checked in a process of its own: a fork of pytest holding
    such a handler once ran a second copy of the suite."""
    tools = Path(__file__).resolve().parents[2] / "tools"
    out = subprocess.run(
        [sys.executable, "-c", _FORK_CHECK, str(tools)], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split("\n")[:2] == ["[True, True, True, True]", "True"]
