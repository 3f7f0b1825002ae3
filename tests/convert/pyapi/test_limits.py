"""convert_items with a time limit per item and a memory ceiling per worker: an item whose fn
hangs or allocates without bound is reported, its worker replaced, and the conversion goes
on, with the same bytes for any number of workers (or stops under strict).

Each limit is tested in a conversion of its own: an item over both (a hog still allocating when
its time is up, on a busy machine) could be reported for either, so a test with both limits on
would depend on the machine's speed."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from shardify.convert import convert_items
from shardify.convert.pyapi.fromitems import ItemsOptions
from shardify.errors import InputError

TIME_LIMIT_S = 180
FAST = {"fsync": False, "progress": False, "samples_per_shard": 5, "chunk_size": 4}
HANG, HOG = 5, 11
ITEM_TIMEOUT_S = 2.0
"""A trivial item takes well under a millisecond: only the hanging one can reach this."""
HOG_STOPS_AT = 640 << 20
"""The hog holds this much (over the 200 MiB ceiling) and then waits to be killed: a supervisor
slowed down by a busy machine notices it late, never after it took all the memory."""
_leak: list[bytes] = []


def _sample(i: int) -> dict[str, object]:
    return {"npy": np.full((2, 2), i, dtype=np.int32), "cls": i % 3}


def hangs(i: int) -> dict[str, object]:
    """Item HANG sleeps forever."""
    if i == HANG:
        time.sleep(10**6)
    return _sample(i)


def hogs(i: int) -> dict[str, object]:
    """Item HOG allocates (and touches) memory far over the ceiling, then waits forever."""
    if i == HOG:
        hog = [b"\x01" * (8 << 20) for _ in range(HOG_STOPS_AT // (8 << 20))]
        time.sleep(10**6)
        del hog
    return _sample(i)


LIMITS = [
    pytest.param(hangs, {"item_timeout": ITEM_TIMEOUT_S}, HANG, "timed out after 2 s", id="hang"),
    pytest.param(hogs, {"max_worker_memory": "200MiB"}, HOG, "worker exceeded 200 MiB", id="memory-hog"),
]


def leaky(i: int) -> dict[str, object]:
    """Keeps 40 MB per item: fine alone and in one chunk of 4, over 200 MiB after a few chunks."""
    _leak.append(b"\x01" * (40 << 20))
    return {"npy": np.full((2,), i, dtype=np.int32)}


def report(out: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (out / "train.report.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("fn, limit, item, reason", LIMITS)
def test_an_item_over_its_limit_is_reported_and_the_rest_written(tmp_path: Path, tree_bytes, fn, limit, item, reason):
    outs = []
    for workers in (1, 2, 3):
        out = tmp_path / f"w{workers}"
        started = time.monotonic()
        summary = convert_items(range(24), fn, out, workers=workers, **limit, **FAST)
        assert time.monotonic() - started < TIME_LIMIT_S  # does not hang (a few seconds when quiet)
        assert summary.samples == 23
        outs.append(tree_bytes(out))
        reasons = {(r["path"], r["reason"]) for r in report(out) if "path" in r}
        assert reasons == {(f"item {item}: {item}", reason)}, report(out)
    assert outs[0] == outs[1] == outs[2]


def test_under_strict_a_hanging_item_stops_the_run_naming_it(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=f"item {HANG} \\({HANG}\\).*timed out after 2 s"):
        convert_items(range(12), hangs, tmp_path / "out", workers=2, item_timeout=ITEM_TIMEOUT_S, strict=True, **FAST)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_memory_kept_over_many_items_is_not_blamed_on_one(tmp_path: Path, tree_bytes) -> None:
    """A worker that grows over the ceiling through many chunks is replaced, and its chunk runs
    again in a fresh worker, where it stays under: no item is reported, and the bytes are the
    same for 1 and 2 workers."""
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        summary = convert_items(range(24), leaky, out, workers=workers, max_worker_memory=200 << 20, **FAST)
        assert summary.samples == 24 and not summary.skipped
        outs.append(tree_bytes(out))
    assert outs[0] == outs[1]


@pytest.mark.parametrize(
    "options, message",
    [
        pytest.param({"item_timeout": 0}, "item_timeout=0 should be > 0", id="timeout-zero"),
        pytest.param({"max_worker_memory": "lots"}, "size 'lots' should be a number", id="memory-text"),
        pytest.param({"max_worker_memory": 0}, "size 0 should be positive", id="memory-zero"),
    ],
)
def test_limit_options_are_checked(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ItemsOptions(**options)


def test_on_ray_the_limits_give_the_same_report_and_bytes(tmp_path: Path, tree_bytes) -> None:
    """Each Ray task watches a fresh forked worker for its chunk: the same rule as the local pool."""
    ray = pytest.importorskip("ray")
    runs = [(hangs, {"item_timeout": ITEM_TIMEOUT_S}), (hogs, {"max_worker_memory": "200MiB"})]
    for n, (fn, limit) in enumerate(runs):
        convert_items(range(24), fn, tmp_path / f"local{n}", workers=2, **limit, **FAST)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        for n, (fn, limit) in enumerate(runs):
            convert_items(range(24), fn, tmp_path / f"ray{n}", engine="ray", **limit, **FAST)
        convert_items(range(24), leaky, tmp_path / "ray-leaky", engine="ray", max_worker_memory=200 << 20, **FAST)
    finally:
        ray.shutdown()
    for n in range(len(runs)):
        assert tree_bytes(tmp_path / f"ray{n}") == tree_bytes(tmp_path / f"local{n}")
        assert len(report(tmp_path / f"ray{n}")) == 1
    assert not report(tmp_path / "ray-leaky")


def test_the_cli_takes_the_limits(tmp_path: Path, monkeypatch) -> None:
    from shardify.cli import main
    from shardify.cli.common import EXIT_SKIPPED

    (tmp_path / "hangmod.py").write_text(
        "import time\n\ndef make(row):\n    if row['i'] == 2:\n"
        "        time.sleep(10**6)\n    return {'txt': str(row['i'])}\n"
    )
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"i": i}) + "\n" for i in range(6)))
    monkeypatch.chdir(tmp_path)
    code = main(
        [
            "convert",
            "python",
            "hangmod:make",
            "rows.jsonl",
            "out",
            "--workers",
            "2",
            "--quiet",
            "--no-fsync",
            "--item-timeout",
            "2",
            "--max-worker-memory",
            "300MiB",
        ]
    )
    assert code == EXIT_SKIPPED
    assert [r["reason"] for r in report(tmp_path / "out")] == ["timed out after 2 s"]
