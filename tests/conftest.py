"""Shared test plumbing: a per-test time limit for modules that could hang if a promise broke, and tiny
datasets written directly with the format modules in tmp_path (the reader's, the tools' and the
command line's tests use them).

Samples of a "counting" dataset carry their global index as ``cls`` (and a ``txt`` copy), so
a test reads indices back and checks exactly-once without any image decoding.
"""

from __future__ import annotations

import hashlib
import json
import signal
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest
from builders import text_dataset  # tests/builders.py: builders test modules import by name

from shardify.convert.synth import jpeg_bytes, natural_image
from shardify.jsonfiles import write_json_atomic
from shardify.keys import member_name
from shardify.manifest import Manifest
from shardify.splitindex import ShardEntry, SplitIndex
from shardify.tarfmt import END_OF_ARCHIVE, padding, shard_name, ustar_header

pytest_plugins = ["forkguard"]  # tests/forkguard.py: a forked copy of the session ends at once

_SESSION_HANDLERS = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
"""SIGTERM's and SIGINT's handlers as the session began (before any test or fixture ran)."""


@pytest.fixture(autouse=True)
def _signal_handlers_kept() -> Iterator[None]:
    """Every test starts and ends with SIGTERM and SIGINT as the session began: ``ray.init``
    (in a test or a module's fixture) installs a SIGTERM handler that calls ``sys.exit`` and
    ``ray.shutdown`` leaves it; a process forked later inherits it, and a stray SIGTERM then
    raises SystemExit in the child, which went on running the suite (a whole run once did)."""
    _reset_signals()
    yield
    _reset_signals()


def _reset_signals() -> None:
    for s, handler in _SESSION_HANDLERS.items():
        if signal.getsignal(s) is not handler:
            signal.signal(s, handler)


@pytest.fixture(autouse=True)
def _time_limit(request: pytest.FixtureRequest) -> Iterator[None]:
    """In a module that sets ``TIME_LIMIT_S``, a test past that many seconds fails instead of hanging."""
    seconds = getattr(request.module, "TIME_LIMIT_S", None)
    if seconds is None:
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"test ran past its {seconds} s limit: a hang?")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


Sample = tuple[str, dict[str, bytes]]


def tar_bytes(samples: Sequence[Sample]) -> bytes:
    """A shard in the format's layout: members ordered by extension, fixed headers."""
    out = bytearray()
    for key, fields in samples:
        for ext in sorted(fields):
            data = fields[ext]
            out += ustar_header(member_name(key, ext), len(data)) + data + padding(len(data))
    return bytes(out + END_OF_ARCHIVE)


def write_dataset(
    root: Path,
    shards: Sequence[Sequence[Sample]],
    *,
    split: str = "train",
    classes: Sequence[str] = (),
) -> Path:
    """Write shards, the split index and the manifest of one split under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    entries, fields = [], set()
    for i, samples in enumerate(shards):
        data = tar_bytes(samples)
        name = shard_name(split, i)
        (root / name).write_bytes(data)
        entries.append(
            ShardEntry(url=name, nsamples=len(samples), filesize=len(data), sha256=hashlib.sha256(data).hexdigest())
        )
        for _, f in samples:
            fields.update(f)
    index = SplitIndex(split=split, shards=tuple(entries), classes=tuple(classes), fields=tuple(sorted(fields)))
    write_json_atomic(root / f"{split}.json", index.to_json())
    Manifest.load_or_empty(root).with_split(split, index).save(root)
    return root


def counting_shards(sizes: Sequence[int]) -> list[list[Sample]]:
    """Shards of the given sizes; sample ``g`` (global index) has ``cls`` = ``txt`` = ``g``."""
    shards, g = [], 0
    for s, n in enumerate(sizes):
        samples = []
        for i in range(n):
            samples.append((f"s{s:03d}_{i:05d}", {"cls": str(g).encode(), "txt": str(g).encode()}))
            g += 1
        shards.append(samples)
    return shards


def image_shards(sizes: Sequence[int], *, classes: int = 3, size: tuple[int, int] = (48, 40)) -> list[list[Sample]]:
    """Shards of small natural JPEGs; ``cls`` is the global index modulo ``classes``."""
    shards, g = [], 0
    for n in sizes:
        samples = []
        for _ in range(n):
            w, h = size if g % 2 else (size[1], size[0])
            jpg = jpeg_bytes(natural_image(w, h, seed=g), quality=85)
            samples.append((f"img{g:05d}", {"cls": str(g % classes).encode(), "jpg": jpg}))
            g += 1
        shards.append(samples)
    return shards


@pytest.fixture
def counting_dataset(tmp_path: Path) -> Callable[..., Path]:
    """``make(sizes, name="ds")`` -> the directory of a counting dataset."""

    def make(sizes: Sequence[int], *, name: str = "ds") -> Path:
        return write_dataset(tmp_path / name, counting_shards(sizes))

    return make


@pytest.fixture(scope="session")
def image_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 shards of 7, 2 and 13 small JPEGs (22 in all), 3 classes."""
    root = tmp_path_factory.mktemp("images") / "ds"
    return write_dataset(root, image_shards([7, 2, 13]), classes=("a", "b", "c"))


@pytest.fixture(scope="session")
def shards() -> SimpleNamespace:
    """The builders above, for tests that write their own shards."""
    return SimpleNamespace(
        tar_bytes=tar_bytes,
        write_dataset=write_dataset,
        counting=counting_shards,
        images=image_shards,
        text=text_dataset,
    )


@pytest.fixture
def record_index() -> Callable[..., None]:
    """``record(root, split="train")``: after a test edited a split index on purpose, record its
    new size and SHA-256 in the manifest as a writer would, so that the edit reaches the later
    check the test is about instead of the manifest's digest check, which refuses it first."""

    def record(root: Path, split: str = "train") -> None:
        path = root / "manifest.json"
        manifest = json.loads(path.read_text())
        ref = manifest["splits"][split]
        data = (root / ref["index"]).read_bytes()
        ref["index_size"], ref["index_sha256"] = len(data), hashlib.sha256(data).hexdigest()
        path.write_text(json.dumps(manifest))

    return record
