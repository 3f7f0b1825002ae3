"""convert_items: the same bytes for any worker count, a report of failing items, and resume after SIGKILL."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from shardify.cli import EXIT_SKIPPED, main
from shardify.convert import ShardWriter, convert_items
from shardify.errors import EncodeError, InputError, KeyRuleError, WorkerError
from shardify.manifest import Manifest

FAST = {"fsync": False, "progress": False}


def make_sample(i: int) -> dict[str, object] | None:
    """Filters every 7th item, fails on every 11th, and makes varied sizes otherwise."""
    if i % 7 == 3:
        return None
    if i % 11 == 5:
        raise ValueError(f"item {i} is bad")
    return {"npy": np.full((i % 5 + 1, 3), i, dtype=np.int32), "cls": i % 4, "txt": "x" * (i % 13)}


def test_bytes_are_identical_for_one_and_two_workers_and_match_shardwriter(tmp_path: Path, tree_bytes) -> None:
    runs = {
        w: convert_items(
            range(120), make_sample, tmp_path / f"w{w}", workers=w, samples_per_shard=9, chunk_size=4, **FAST
        )
        for w in (1, 2)
    }
    assert tree_bytes(tmp_path / "w1") == tree_bytes(tmp_path / "w2")
    assert runs[1].samples == sum(i % 7 != 3 and i % 11 != 5 for i in range(120)) == 94
    # the same samples through ShardWriter give the same shards
    with ShardWriter(tmp_path / "sw", samples_per_shard=9, fsync=False) as w:
        for i in range(120):
            try:
                sample = make_sample(i)
            except ValueError:
                continue
            if sample is not None:
                w.write({"__key__": f"{i:09d}", **sample})
    # (the names differ: each writer's version token comes from its own fingerprint)
    shards = [[p.read_bytes() for p in sorted((tmp_path / d).glob("*.tar"))] for d in ("w1", "sw")]
    assert len(shards[0]) == 11 and shards[0] == shards[1]


def test_chunks_come_back_through_shared_memory_or_the_pipe_with_the_same_bytes(monkeypatch) -> None:
    import mmap

    from shardify.convert.pyapi import itemchunks, itemmap
    from shardify.convert.pyapi.values import ValueOptions

    monkeypatch.setattr(itemchunks.ChunkSlots, "SLOT_LIMIT", mmap.PAGESIZE)  # 1 sample fits a slot, 4 do not
    runner = itemchunks.ChunkRunner(make_sample, ValueOptions(), ())
    chunks, start = [], 0
    for n in [1, 4] * 6:
        chunks.append(
            itemchunks.ItemChunk(
                start=start, indexes=tuple(range(start, start + n)), items=tuple(range(start, start + n))
            )
        )
        start += n
    got = [
        (type(out.data), bytes(out.data), out.outcomes)  # read before the slot is reused
        for _, out in itemmap.map_ordered(runner, chunks, workers=2, engine="local")
    ]
    assert [(data, outcomes) for _, data, outcomes in got] == [(runner(c).data, runner(c).outcomes) for c in chunks]
    assert {kind for kind, _, _ in got} == {memoryview, bytes}


def test_a_failing_fn_is_reported_with_index_repr_and_error(tmp_path: Path) -> None:
    out = tmp_path / "out"
    items = [{"id": i, "payload": "p" * 500} for i in range(30)]
    summary = convert_items(items, lambda it: make_sample(it["id"]), out, workers=2, chunk_size=3, **FAST)
    failing = [i for i in range(30) if i % 11 == 5 and i % 7 != 3]
    lines = [json.loads(line) for line in (out / "train.report.jsonl").read_text().splitlines()]
    assert [line["path"].split(":")[0] for line in lines] == [f"item {i}" for i in failing]
    assert all(line["reason"] == f"fn raised ValueError: item {i} is bad" for line, i in zip(lines, failing))
    assert all("{'id': " in line["path"] and len(line["path"]) < 140 for line in lines)  # repr, cut short
    index = json.loads((out / "train.json").read_text())["shardify"]
    assert index["skipped"] == {"fn raised ValueError": len(failing)}
    assert index["ignored"] == {"filtered": sum(i % 7 == 3 for i in range(30))}
    assert len(summary.skipped) == len(failing)
    with pytest.raises(InputError, match=r"item 5 \(\{'id': 5.*fn raised ValueError: item 5 is bad"):
        convert_items(items, lambda it: make_sample(it["id"]), tmp_path / "strict", strict=True, workers=1, **FAST)
    assert not (tmp_path / "strict" / "manifest.json").exists()


def test_bad_values_and_duplicate_keys_from_fn_are_errors_naming_the_item(tmp_path: Path) -> None:
    with pytest.raises(EncodeError, match=r"item 3 \(3\): field 'npy': cannot store a builtins.list"):
        convert_items(
            range(10),
            lambda i: {"npy": [i]} if i == 3 else {"txt": "ok"},
            tmp_path / "a",
            workers=2,
            chunk_size=2,
            **FAST,
        )
    with pytest.raises(KeyRuleError, match=r"item 4 and item 0 have the same key 'k0'"):
        convert_items(range(10), lambda i: {"__key__": f"k{i % 4}", "txt": "x"}, tmp_path / "b", workers=1, **FAST)
    for name in ("a", "b"):
        assert not (tmp_path / name / "manifest.json").exists()


def test_a_worker_that_dies_is_an_error_naming_its_items(tmp_path: Path) -> None:
    def crash(i: int) -> dict[str, object]:
        if i == 13:
            os._exit(3)
        return {"txt": str(i)}

    with pytest.raises(WorkerError, match=r"positions (\d+)\.\.(\d+) .*rerun to resume") as caught:
        convert_items(range(40), crash, tmp_path / "out", workers=2, chunk_size=4, **FAST)
    first, last = map(int, re.search(r"positions (\d+)\.\.(\d+)", str(caught.value)).groups())
    assert first <= 13 <= last and last - first < 16  # the chunks in flight, not the whole input
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_shuffle_is_seeded_and_needs_a_sequence(tmp_path: Path) -> None:
    import tarfile

    def keys(out: Path) -> list[str]:
        with tarfile.open(next(out.glob("train-*.tar"))) as tf:
            return [n.split(".")[0] for n in tf.getnames()]

    convert_items(list(range(20)), lambda i: {"txt": str(i)}, tmp_path / "a", shuffle=True, seed=1, **FAST)
    convert_items(list(range(20)), lambda i: {"txt": str(i)}, tmp_path / "b", shuffle=True, seed=1, workers=2, **FAST)
    convert_items(list(range(20)), lambda i: {"txt": str(i)}, tmp_path / "c", shuffle=True, seed=2, **FAST)
    assert keys(tmp_path / "a") == keys(tmp_path / "b") != keys(tmp_path / "c")
    assert sorted(keys(tmp_path / "a")) == [f"{i:09d}" for i in range(20)] != keys(tmp_path / "a")
    with pytest.raises(ValueError, match="shuffle=True needs a sequence"):
        convert_items(iter(range(3)), lambda i: {"txt": "x"}, tmp_path / "d", shuffle=True, **FAST)


def test_items_are_streamed_not_listed(tmp_path: Path) -> None:
    pulled = [0]

    def items():
        for i in range(500):
            pulled[0] = i
            yield i

    ahead = []

    def fn(i: int) -> dict[str, object]:
        ahead.append(pulled[0] - i)
        return {"txt": str(i)}

    summary = convert_items(items(), fn, tmp_path / "out", workers=1, chunk_size=8, **FAST)
    assert summary.samples == 500 and max(ahead) < 8


def _interrupt_at(n: int):
    def fn(i: int) -> dict[str, object]:
        if i == n:
            raise KeyboardInterrupt
        return {"npy": np.arange(i % 9), "cls": i}

    return fn


def test_resume_reuses_finished_shards_and_detects_changed_items(tmp_path: Path, tree_bytes) -> None:
    opts = dict(samples_per_shard=5, workers=1, **FAST)
    convert_items(range(50), _interrupt_at(-1), tmp_path / "ref", **opts)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        convert_items(range(50), _interrupt_at(33), out, **opts)
    assert not (out / "manifest.json").exists() and len(list(out.glob("train-*.tar"))) == 6
    summary = convert_items(range(50), _interrupt_at(-1), out, **opts)
    assert summary.reused_shards == 6
    assert tree_bytes(out) == tree_bytes(tmp_path / "ref")

    changed = tmp_path / "changed"
    with pytest.raises(KeyboardInterrupt):
        convert_items(range(50), _interrupt_at(33), changed, **opts)
    with pytest.raises(InputError, match=r"positions 0\.\.4 differ from those of the interrupted run"):
        convert_items(range(100, 150), _interrupt_at(-1), changed, **opts)
    convert_items(range(50), _interrupt_at(-1), changed, **opts)  # the records were dropped: starts over
    assert tree_bytes(changed) == tree_bytes(tmp_path / "ref")


SAMPLE_MODULE = textwrap.dedent("""
    import os, time
    import numpy as np

    def make(row):
        time.sleep(float(os.environ.get("SLOW", "0")))
        if row["i"] % 9 == 4:
            raise ValueError("bad row")
        return {"__key__": f"row-{row['i']}", "npy": np.full(row["i"] % 7 + 1, row["i"], np.int64),
                "txt": row["text"], "cls": row["i"] % 3}
""")


def test_sigkill_mid_convert_items_then_rerun_is_byte_identical(tmp_path: Path, tree_bytes) -> None:
    (tmp_path / "rowmod.py").write_text(SAMPLE_MODULE)
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"i": i, "text": f"row {i}"}) + "\n" for i in range(60)))
    cmd = [sys.executable, "-m", "shardify.convert", "convert", "python", "rowmod:make", str(items)]
    opts = ["--samples-per-shard", "3", "--workers", "2", "--chunk-size", "2", "--quiet", "--classes", "a,b,c"]
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    ref = subprocess.run([*cmd, str(tmp_path / "ref"), *opts], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert ref.returncode == EXIT_SKIPPED, ref.stderr

    out = tmp_path / "out"
    proc = subprocess.Popen([*cmd, str(out), *opts], env={**env, "SLOW": "0.03"}, cwd=tmp_path, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list((out / ".shardify-work" / "train").glob("0*.json"))) < 3:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 3 <= len(list(out.glob("train-*.tar"))) < 18, "the kill should land mid-run"
    assert not (out / "manifest.json").exists(), "a killed run must not look finished"

    rerun = subprocess.run([*cmd, str(out), *opts], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert rerun.returncode == EXIT_SKIPPED, rerun.stderr
    assert "reused" in rerun.stderr
    assert tree_bytes(out) == tree_bytes(tmp_path / "ref")
    assert Manifest.load(out).splits["train"].samples == 60 - 7


def test_ray_engine_gives_the_same_bytes(tmp_path: Path, tree_bytes) -> None:
    ray = pytest.importorskip("ray")

    def fn(i: int) -> dict[str, object] | None:  # defined here: Ray ships it by value
        import numpy

        return None if i % 5 == 1 else {"npy": numpy.full(i % 4 + 1, i), "cls": i % 3}

    local = convert_items(range(40), fn, tmp_path / "local", samples_per_shard=6, workers=1, **FAST)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        on_ray = convert_items(range(40), fn, tmp_path / "ray", samples_per_shard=6, engine="ray", chunk_size=5, **FAST)
    finally:
        ray.shutdown()
    assert on_ray.samples == local.samples == 32
    assert tree_bytes(tmp_path / "ray") == tree_bytes(tmp_path / "local")


def test_cli_python_reports_usage_and_import_errors(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "rowmod2.py").write_text(SAMPLE_MODULE)
    (tmp_path / "items.jsonl").write_text('{"i": 1, "text": "a"}\n\n{"i": 2, "text": "b"}\n')
    assert main(["convert", "python", "rowmod2:make", "items.jsonl", "out", "--quiet", "--workers", "1"]) == 0
    assert Manifest.load(tmp_path / "out").splits["train"].samples == 2
    assert main(["convert", "python", "rowmod2", "items.jsonl", "o2"]) == 2
    assert main(["convert", "python", "rowmod2:nope", "items.jsonl", "o2"]) == 1
    (tmp_path / "broken.jsonl").write_text('{"i": 1, "text": "a"}\nnot json\n')
    assert main(["convert", "python", "rowmod2:make", "broken.jsonl", "o3", "--quiet", "--workers", "1"]) == 1
    err = capsys.readouterr().err
    assert "should be MODULE:FUNCTION" in err and "has no 'nope'" in err and "broken.jsonl: line 2 is not JSON" in err


@pytest.mark.parametrize(
    ("content", "rows", "error"),
    [
        pytest.param(b'\xef\xbb\xbf{"a": 1}\n  [2] \n\n3\r\n', [{"a": 1}, [2], 3], None, id="bom-spaces-blank-crlf"),
        pytest.param(b"1\n \t\x0b\x0c\r\n\n2\n  ", [1, 2], None, id="whitespace-lines-and-tail"),
        pytest.param(b'{"a": 1}\n{"a": 1} x\n', None, "line 2 is not JSON: Extra data", id="extra-data"),
        pytest.param(b'{"a": 1}{"b": 2}\n', None, "line 1 is not JSON: Extra data", id="two-values"),
        pytest.param(b'1\n"\xff"\n', None, "line 2 is not JSON: 'utf-8' codec", id="not-utf8"),
        pytest.param(b'{"a":\n1}\n', None, "line 1 is not JSON: Expecting value", id="split-object"),
        pytest.param(b"1\n\xef\xbb\xbf2\n", None, "line 2 is not JSON", id="bom-not-first"),
    ],
)
def test_jsonl_rows_parse_one_value_per_line(
    tmp_path: Path, content: bytes, rows: list[object] | None, error: str | None
) -> None:
    from shardify.convert.pyapi.jsonlitems import JsonlItems
    from shardify.errors import InputError

    path = tmp_path / "rows.jsonl"
    path.write_bytes(content)
    if error is None:
        assert list(JsonlItems(path)) == rows and len(JsonlItems(path)) == len(rows)
    else:
        with pytest.raises(InputError, match=error):
            list(JsonlItems(path))
