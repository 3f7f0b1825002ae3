"""Audit of reader promises that no other test pinned (docs/audit.md).

README, "Exact epochs": each epoch the shard order is permuted and, with ``shuffle=True``,
the sequence is cut into blocks put in a seeded random order, "so that each rank's part is a
sample of the whole dataset"; ``.tar.gz`` shards are "read whole, in a shuffled shard order".
A rank must therefore not get the same samples every epoch: the existing epoch test
(``tests/reader/plan/test_assign.py::test_deterministic_and_new_order_each_epoch``) passes when
either of the two orders reuses epoch 0's seed, because the other still changes the order.

docs/format.md, "Chunked shards": a chunk whose keys member does not start with the chunk's
key is damage of its shard, also on the path that reads chunks whole (gzip shards, damaged
shards), not only through the index's offsets.
"""

from __future__ import annotations

import functools
import gzip
import os
import signal
import tarfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import get_worker_info

from shardify.convert import ShardWriter
from shardify.errors import ShardFormatError, WorkerError
from shardify.reader import BatchOptions, SamplingOptions, ShardedDataset, make_loader
from shardify.reader.io.sources import resolve_source
from shardify.reader.io.stream import ShardReader

TIME_LIMIT_S = 60


def _counting(root: Path, n: int, *, per_shard: int, chunk: int | None = None) -> list[Path]:
    """``n`` samples whose ``cls`` is their index, ``per_shard`` a shard; the shard paths in order."""
    with ShardWriter(root, samples_per_shard=per_shard, shard_size=None, fsync=False, chunk=chunk) as w:
        for i in range(n):
            w.write({"__key__": f"s{i:04d}", "cls": i, "npy": np.full((2,), i, dtype=np.int16)})
    return sorted(root.glob("train-*.tar"))


def _rank_samples(source: object, monkeypatch: pytest.MonkeyPatch, *, rank: int, world: int, epoch: int) -> list[int]:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    ds = ShardedDataset(
        source,
        batch_size=4,
        shuffle=True,
        seed=11,
        fields=("cls",),
        batching=BatchOptions(drop_last=True),
        sampling=SamplingOptions(shuffle_buffer=8, shuffle_block=4),
    )
    ds.set_epoch(epoch)
    return [int(x) for batch in ds for x in batch]


def _rank_sets_over_epochs(source: object, monkeypatch: pytest.MonkeyPatch, n: int) -> list[frozenset[int]]:
    """Rank 0's samples in each of 4 epochs (world 2), after checking each epoch is exactly once."""
    sets = []
    for epoch in range(4):
        ranks = [_rank_samples(source, monkeypatch, rank=r, world=2, epoch=epoch) for r in range(2)]
        every = ranks[0] + ranks[1]
        assert len(every) == len(set(every)) == n, f"epoch {epoch} is not exactly once"
        sets.append(frozenset(ranks[0]))
    return sets


def test_a_rank_gets_other_samples_each_epoch_from_a_single_shard(tmp_path: Path, monkeypatch) -> None:
    """One shard: only the block order can change a rank's share (catches a block order that
    reuses the epoch-0 seed: rank 0 would then read the same 32 samples every epoch)."""
    _counting(tmp_path / "one", 64, per_shard=64)
    sets = _rank_sets_over_epochs(tmp_path / "one", monkeypatch, 64)
    assert len(set(sets)) == 4, "rank 0 reads the same samples in two epochs"


def test_a_rank_gets_other_gzip_shards_each_epoch(tmp_path: Path, monkeypatch) -> None:
    """``.tar.gz`` shards are read whole in a shuffled shard order (no blocks): only the shard
    order can change a rank's share (catches a shard order that reuses the epoch-0 seed)."""
    gz = []
    for path in _counting(tmp_path / "tars", 48, per_shard=6):
        out = tmp_path / f"{path.stem}.tar.gz"
        out.write_bytes(gzip.compress(path.read_bytes(), mtime=0))
        gz.append(str(out))
    sets = _rank_sets_over_epochs(gz, monkeypatch, 48)
    assert len(set(sets)) >= 3, "rank 0 reads the same shards epoch after epoch"


def _tamper_first_key_of_chunk(path: Path, key: str) -> None:
    data = bytearray(path.read_bytes())
    with tarfile.open(path) as tar:
        member = tar.getmember(f"{key}.chunk-keys")
    at = data.find(key.encode(), member.offset_data, member.offset_data + member.size)
    assert at >= 0
    data[at : at + 1] = b"x"
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("skip", [False, True], ids=["raise", "skip"])
def test_a_gzip_chunk_whose_keys_are_not_its_own_is_damage(tmp_path: Path, skip: bool) -> None:
    root = tmp_path / "c"
    (shard,) = _counting(root, 15, per_shard=15, chunk=5)
    _tamper_first_key_of_chunk(shard, "s0005")
    src = resolve_source(root)
    gz = tmp_path / "shard.tar.gz"
    gz.write_bytes(gzip.compress(shard.read_bytes(), mtime=0))
    reader = ShardReader([str(gz)], [15], skip_damaged=skip, chunks=[src.shards[0].chunk])
    if not skip:
        with pytest.raises(ShardFormatError, match=r"key 's0005': damaged chunk: its first key is 'x0005'") as e:
            list(reader.read(0, 0, 15))
        assert e.value.shard == str(gz)
        return
    items = list(reader.read(0, 0, 15))
    keys = [i["__key__"] for i in items if isinstance(i, dict)]
    assert keys == [f"s{i:04d}" for i in (*range(5), *range(10, 15))], "the damaged chunk's samples are not lost"
    assert len(items) - len(keys) >= 1, "the loss is not reported"


def _die_once_on(sample: dict[str, Any], *, value: int, flag: Path) -> int:
    """``map=``: the worker that makes sample ``value`` kills itself (SIGKILL) the first time,
    after a pause long enough that the training loop is waiting for that worker's batch."""
    cls = int(sample["cls"])
    if cls == value and get_worker_info() is not None and not flag.exists():
        flag.write_text(str(os.getpid()))
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    return cls


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "per_epoch"])
def test_a_worker_that_dies_while_the_loop_waits_raises_worker_error_then_resumes(
    tmp_path: Path, persistent: bool
) -> None:
    """README "Faults": "a worker killed mid-epoch raises WorkerError (never a hang)", and
    docs/reliability.md: it "names the worker, its pid, the signal, the epoch and the batches
    received, and says how to go on". The existing kill test also accepts torch's own
    RuntimeError (the worker may die while the loop runs its own code), so it passed with the
    loader's wrapping removed; here the worker dies while the loop waits in ``next``."""
    _counting(tmp_path / "ds", 40, per_shard=10)
    flag = tmp_path / "died"
    ds = ShardedDataset(
        tmp_path / "ds", batch_size=4, shuffle=False, map=functools.partial(_die_once_on, value=22, flag=flag)
    )
    loader = make_loader(ds, num_workers=2, persistent_workers=persistent)
    got: list[list[int]] = []
    with pytest.raises(WorkerError) as caught:
        for batch in loader:
            got.append([int(x) for x in batch])
    message = str(caught.value)
    pid = flag.read_text()
    assert pid in message and "SIGKILL" in message and "epoch 0" in message, message
    assert f"after {len(got)} batches" in message and "load_state_dict" in message, message
    loader.load_state_dict(loader.state_dict())
    rest = [[int(x) for x in b] for b in loader]
    assert sorted(x for b in got + rest for x in b) == list(range(40))
    assert len(got) + len(rest) == len(ds) == 10
    loader.close()
