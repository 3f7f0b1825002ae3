"""Multi-rank training under torchrun: 2 ranks x 2 workers, fewer shards than that, DDP on gloo.

Runs examples/train_imagenet.py (the example users copy) for real: both ranks take the same
number of steps, together they see exactly the dataset, nothing hangs, and a run stopped
after a checkpoint resumes with exactly the batches the uninterrupted run had left.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shardify.convert.options import ConvertOptions
from shardify.convert.synth import make_imagefolder
from shardify.convert.write.run import convert_imagefolder

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 240


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("torchrun")
    make_imagefolder(base / "src", classes=3, per_class=8, sizes=((80, 64), (64, 80)))
    convert_imagefolder(
        base / "src", base / "ds", options=ConvertOptions(samples_per_shard=10, workers=1, progress=False)
    )
    return base / "ds"


def _train(dataset: Path, tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(ROOT / "examples" / "train_imagenet.py"),
        "--data",
        str(dataset),
        "--batch-size",
        "4",
        "--workers",
        "2",
        "--size",
        "32",
        "--log-keys",
        str(tmp / "keys"),
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _log(tmp: Path, rank: int) -> list[dict]:
    path = tmp / f"keys.rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_two_ranks_same_steps_union_is_the_dataset(dataset: Path, tmp_path: Path) -> None:
    index = json.loads((dataset / "train.json").read_text())
    assert [s["nsamples"] for s in index["shardlist"]] == [10, 10, 4]  # 3 shards < 2 ranks x 2 workers
    proc = _train(dataset, tmp_path, "--epochs", "1")
    assert "rank 0: epoch 0: 3 steps" in proc.stdout and "rank 1: epoch 0: 3 steps" in proc.stdout
    keys = [k for rank in (0, 1) for entry in _log(tmp_path, rank) for k in entry["keys"]]
    assert len(keys) == 24 and len(set(keys)) == 24
    with_tar = subprocess.run(
        ["tar", "tf", str(dataset / index["shardlist"][0]["url"])], capture_output=True, text=True
    )
    assert with_tar.returncode == 0


def test_checkpoint_and_resume_continue_batch_for_batch(dataset: Path, tmp_path: Path) -> None:
    full, parts = tmp_path / "full", tmp_path / "parts"
    full.mkdir()
    parts.mkdir()
    _train(dataset, full, "--epochs", "2")
    ckpt = str(parts / "ckpt.pt")
    stopped = _train(
        dataset, parts, "--epochs", "2", "--checkpoint", ckpt, "--checkpoint-every", "2", "--max-steps", "4"
    )
    assert "stopping at step 4" in stopped.stdout
    resumed = _train(dataset, parts, "--epochs", "2", "--checkpoint", ckpt, "--checkpoint-every", "100")
    assert "resumed at epoch 1, batch 1, step 4" in resumed.stdout
    for rank in (0, 1):
        assert [e["keys"] for e in _log(parts, rank)] == [e["keys"] for e in _log(full, rank)]


MIX_SCRIPT = """
import json, sys
import torch.distributed as dist
from shardify.reader import BatchOptions, SamplingOptions, ShardedDataset, Stream, make_loader

dist.init_process_group("gloo")
rank = dist.get_rank()
web, extra, out, workers, stop, state_in = sys.argv[1:7]

def row(sample):
    return sample["__key__"], sample["__stream__"], sample["__valid__"]

ds = ShardedDataset([Stream(web, weight=3), Stream(extra.split(","), weight=1)], map=row,
                    batching=BatchOptions(collate_fn=list), batch_size=4, shuffle=True, seed=0,
                    sampling=SamplingOptions(samples_per_epoch=40, mark_repeats=True))
loader = make_loader(ds, num_workers=int(workers))
if state_in != "-":
    loader.load_state_dict(json.load(open(state_in)))
else:
    ds.set_epoch(1)
rows, steps = [], 0
for batch in loader:
    rows += batch
    steps += 1
    if steps == int(stop):
        if rank == 0:
            json.dump(loader.state_dict(), open(out + ".state.json", "w"))
        break
json.dump({"rows": rows, "steps": steps}, open(f"{out}.rank{rank}.json", "w"))
dist.barrier()
dist.destroy_process_group()
"""


def _tar_shard(path: Path, keys: list[str]) -> str:
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for key in keys:
            data = key.encode()
            info = tarfile.TarInfo(f"{key}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


def _mix(
    tmp: Path, web: Path, extra: str, tag: str, *, procs: int, workers: int, stop: int = 0, state: str = "-"
) -> list[dict]:
    script = tmp / "mix.py"
    script.write_text(MIX_SCRIPT)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={procs}",
        str(script),
        str(web),
        extra,
        str(tmp / tag),
        str(workers),
        str(stop),
        state,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((tmp / f"{tag}.rank{r}.json").read_text()) for r in range(procs)]


def test_two_ranks_mix_streams_exactly_and_resume_on_one_rank(dataset: Path, tmp_path: Path) -> None:
    """Weighted mixing under a real 2-process job, then the epoch finished by 1 process."""
    from collections import Counter

    extra = ",".join(_tar_shard(tmp_path / f"extra-{i}.tar", [f"x{i}_{j}" for j in range(3)]) for i in range(2))
    full = _mix(tmp_path, dataset, extra, "full", procs=2, workers=2)
    assert full[0]["steps"] == full[1]["steps"] == 5  # 40 samples / 2 ranks / batches of 4
    valid = Counter((k, s) for r in full for k, s, ok in r["rows"] if ok)
    assert Counter(s for _, s in valid.elements()) == {0: 30, 1: 10}  # 3:1 of 40
    assert {k for k, s in valid if s == 1} == {f"x{i}_{j}" for i in range(2) for j in range(3)}  # all 6 before repeats
    web = Counter(k for k, s in valid.elements() if s == 0)
    assert len(web) == 24 and set(web.values()) == {1, 2}  # 30 of 24 images: all once, 6 twice
    head = _mix(tmp_path, dataset, extra, "head", procs=2, workers=2, stop=2)
    state = json.loads((tmp_path / "head.state.json").read_text())
    assert state["world"] == 2 and state["workers"] == 2 and state["batches"] == 2
    rest = _mix(tmp_path, dataset, extra, "rest", procs=1, workers=0, state=str(tmp_path / "head.state.json"))
    resumed = Counter((k, s) for r in head + rest for k, s, ok in r["rows"] if ok)
    assert resumed == valid
