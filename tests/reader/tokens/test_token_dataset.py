"""TokenDataset end to end on splits made by convert_tokens: every token once, padding, masks, resume."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shardify.convert import convert_tokens
from shardify.errors import ResumeError
from shardify.reader import PackOptions, Stream, TokenDataset, TokenLoader, varlen_args
from shardify.reader.plan.world import World

EOS = 1
FAST = {"fsync": False, "progress": False, "workers": 1}


def tokenize(text: str) -> list[int]:
    """The test's tokenizer: a text is its ids written out."""
    return [int(w) for w in text.split()]


def _docs(n: int, seed: int, low: int, high: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    docs = [[7] * 5 for _ in range(8)]  # equal lengths: stacked chunks
    docs += [rng.integers(low, high, size=int(rng.integers(1, 40))).tolist() for _ in range(n - 9)]
    docs.append(rng.integers(low, high, size=90).tolist())  # longer than a sequence
    return docs


def _convert(tmp: Path, name: str, docs: list[list[int]], chunk: int | None) -> tuple[Path, list[int]]:
    src = tmp / f"{name}.jsonl"
    src.write_text("".join(json.dumps({"text": " ".join(map(str, d))}) + "\n" for d in docs))
    out = tmp / name
    convert_tokens(src, out, tokenizer=tokenize, vocab_size=1000, eos=EOS, chunk=chunk, samples_per_shard=150, **FAST)
    return out, [t for d in docs for t in [*d, EOS]]


@pytest.fixture(scope="module", params=[4, None], ids=["chunked", "per-sample"])
def split(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    return _convert(tmp_path_factory.mktemp("tok"), "web", _docs(400, 0, 2, 500), request.param)


def _real(batches: Iterable[dict[str, torch.Tensor]]) -> list[int]:
    """The real input tokens of ``batches``, row by row (labels checked against them)."""
    out: list[int] = []
    for b in batches:
        ids, labels, n = b["input_ids"], b["labels"], b["num_tokens"]
        assert ids.dtype == labels.dtype == torch.int64
        for r in range(ids.shape[0]):
            k = int(n[r])
            out += ids[r, :k].tolist()
            assert (labels[r, : max(k - 1, 0)] == ids[r, 1:k]).all()
            assert (labels[r, k:] == -100).all() and (ids[r, k:] == 0).all()
    return out


def _rank(ds_args: dict[str, Any], world: int, rank: int, workers: int, state: Any = None) -> list[int]:
    """What rank ``rank`` yields over its workers (each a fresh dataset, as a worker process is)."""
    got: list[int] = []
    per_worker = []
    for w in range(workers):
        ds = TokenDataset(**ds_args)
        if state is not None:
            ds.load_state_dict(state)
        per_worker.append(list(ds.read_as(World(rank=rank, world=world, worker=w, workers=workers))))
    for i in range(max(len(x) for x in per_worker)):  # the DataLoader's round-robin
        for x in per_worker:
            if i < len(x):
                got += _real([x[i]])
    return got


@pytest.mark.parametrize("seq_len", [3, 16, 100])
@pytest.mark.parametrize(("world", "workers"), [(1, 1), (3, 2)])
@pytest.mark.parametrize(("stop", "world2", "workers2"), [(None, 0, 0), (2, 2, 3), (1, 1, 1)])
def test_every_token_once_over_ranks_workers_and_a_resume(
    split: tuple[Path, list[int]], seq_len: int, world: int, workers: int, stop: int | None, world2: int, workers2: int
) -> None:
    root, stream = split
    args = {"source": root, "seq_len": seq_len, "batch_size": 4, "seed": 5}
    if stop is None:
        got = [t for r in range(world) for t in _rank(args, world, r, workers)]
        assert Counter(got) == Counter(stream)
        return
    got = []
    for r in range(world):  # every rank takes `stop` batches, then the job stops
        ds = TokenDataset(**args)
        it = ds.read_as(World(rank=r, world=world))
        got += _real(b for _, b in zip(range(stop), it))
        state = ds.state_dict()
    assert len(json.dumps(state)) < 1000
    got += [t for r in range(world2) for t in _rank(args, world2, r, workers2, state)]
    assert Counter(got) == Counter(stream)


def test_same_topology_resume_yields_exactly_the_batches_left(split: tuple[Path, list[int]]) -> None:
    root, _ = split
    ds = TokenDataset(root, seq_len=16, batch_size=2, seed=1)
    ds.set_epoch(2)
    whole = list(ds)
    ds2 = TokenDataset(root, seq_len=16, batch_size=2, seed=1)
    ds2.set_epoch(2)
    it = iter(ds2)
    for _ in range(5):
        next(it)
    state = ds2.state_dict()
    ds3 = TokenDataset(root, seq_len=16, batch_size=2, seed=1)
    ds3.load_state_dict(state)
    assert len(ds3) == len(whole) - 5
    rest = list(ds3)
    assert len(rest) == len(whole) - 5
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(rest, whole[5:]))


def test_padding_the_last_sequence_and_the_last_batch(tmp_path: Path) -> None:
    root, stream = _convert(tmp_path, "tiny", [[5, 6, 7], [8, 9]], None)  # 7 tokens with EOS
    ds = TokenDataset(root, seq_len=3, batch_size=2, shuffle=False, packing=PackOptions(pad_id=99))
    (a, b) = list(ds)
    assert a["input_ids"].tolist() == [[5, 6, 7], [1, 8, 9]]
    assert a["labels"].tolist() == [[6, 7, 1], [8, 9, 1]]
    assert b["input_ids"].tolist() == [[1, 99, 99], [99, 99, 99]]  # the last token, then a padding row
    assert b["labels"].tolist() == [[-100, -100, -100], [-100, -100, -100]]
    assert b["num_tokens"].tolist() == [1, 0]
    ranks = [list(TokenDataset(root, seq_len=3, batch_size=2).read_as(World(rank=r, world=4))) for r in range(4)]
    assert [len(x) for x in ranks] == [1, 1, 1, 1]  # 3 sequences over 4 ranks: the same batches everywhere
    sizes = TokenDataset(root, seq_len=3, batch_size=2, rank_world=(0, 4)).epoch_sizes()
    assert sizes == {"tokens": 7, "sequences": 3, "batches": 1, "padding_rows": 5}  # 8 rows, 3 real
    assert sorted(_real(b for x in ranks for b in x)) == sorted(stream)


def test_position_ids_and_document_masks_at_boundaries(tmp_path: Path) -> None:
    root, _ = _convert(tmp_path, "docs", [[5, 6], [7, 8, 9, 10, 11], [12]], 2)  # lengths 3, 6, 2
    ds = TokenDataset(
        root, seq_len=4, batch_size=3, shuffle=False, packing=PackOptions(position_ids=True, documents=True)
    )
    (b,) = list(ds)
    assert b["input_ids"].tolist() == [[5, 6, 1, 7], [8, 9, 10, 11], [1, 12, 1, 0]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 0], [0, 1, 2, 3], [0, 0, 1, 0]]
    assert b["segment_ids"].tolist() == [[0, 0, 0, 1], [0, 0, 0, 0], [0, 1, 1, 2]]
    assert b["cu_seqlens"].tolist() == [[0, 3, 4, 4, 4], [0, 4, 4, 4, 4], [0, 1, 3, 4, 4]]
    assert b["cu_seqlens"].dtype == b["segment_ids"].dtype == torch.int32
    cu, longest = varlen_args(b)
    assert cu.tolist() == [0, 3, 4, 8, 9, 11, 12] and longest == 4 and cu.dtype == torch.int32


def test_order_is_deterministic_per_seed_and_epoch(split: tuple[Path, list[int]]) -> None:
    root, _ = split

    def epoch(seed: int, e: int) -> list[list[int]]:
        ds = TokenDataset(root, seq_len=8, batch_size=4, seed=seed)
        ds.set_epoch(e)
        return [b["input_ids"].tolist() for b in ds]

    assert epoch(0, 1) == epoch(0, 1)
    assert epoch(0, 1) != epoch(0, 2)
    assert epoch(0, 1) != epoch(1, 1)


def test_mixing_by_tokens_walks_through_each_stream(tmp_path: Path) -> None:
    web, web_tokens = _convert(tmp_path, "web", _docs(60, 1, 2, 500), 4)
    books, books_tokens = _convert(tmp_path, "books", _docs(30, 2, 500, 1000), None)
    mix = [Stream(web, weight=3), Stream(books, weight=1)]
    got: list[int] = []
    for e in range(3):
        ds = TokenDataset(mix, seq_len=10, batch_size=4, epoch_tokens=800, seed=2)
        ds.set_epoch(e)
        real = _real(ds)
        assert len(real) == 800
        got += real
    assert ds.counts == (600, 200)
    assert len(web_tokens) < 1800 < 2 * len(web_tokens) and len(books_tokens) < 600 < 2 * len(books_tokens)
    # three epochs take positions 0..1799 of web read round and round, 0..599 of books: every
    # token once before any twice
    web_walk = [web_tokens[p % len(web_tokens)] for p in range(1800)]
    books_walk = [books_tokens[p % len(books_tokens)] for p in range(600)]
    assert Counter(got) == Counter(web_walk) + Counter(books_walk)
    assert sum(t >= 500 for t in got) == sum(t >= 500 for t in books_walk)


def test_dataloader_with_0_and_2_workers_and_a_loader_state(split: tuple[Path, list[int]]) -> None:
    root, stream = split
    for workers in (0, 2):
        loader = TokenLoader(TokenDataset(root, seq_len=32, batch_size=4), num_workers=workers)
        batches = list(loader)
        assert len(batches) == len(loader)
        assert Counter(_real(batches)) == Counter(stream)
    loader = TokenLoader(TokenDataset(root, seq_len=32, batch_size=4, seed=9), num_workers=2)
    first = []
    for i, b in enumerate(loader):
        first.append(b)
        if i == 2:
            break
    state = loader.state_dict()
    assert state["batches"] == 3
    again = TokenLoader(TokenDataset(root, seq_len=32, batch_size=4, seed=9), num_workers=0)
    again.load_state_dict(state)
    assert Counter(_real(first) + _real(again)) == Counter(stream)
    whole = list(TokenDataset(root, seq_len=32, batch_size=4, seed=9))
    two = TokenLoader(TokenDataset(root, seq_len=32, batch_size=4, seed=9), num_workers=2)
    two.load_state_dict(state)
    rest = list(two)  # the same world: exactly the batches left, in order, dealt from worker 0
    assert len(rest) == len(whole) - 3 and all(torch.equal(a["labels"], b["labels"]) for a, b in zip(rest, whole[3:]))
    assert two.state_dict()["batches"] == len(whole)


def test_a_mixed_epoch_resumed_on_another_world_holds_its_takes_once(tmp_path: Path) -> None:
    web, web_tokens = _convert(tmp_path, "web", _docs(60, 1, 2, 500), 4)
    books, books_tokens = _convert(tmp_path, "books", _docs(30, 2, 500, 1000), None)
    args = {
        "source": [Stream(web, weight=3), Stream(books, weight=1)],
        "seq_len": 10,
        "batch_size": 4,
        "epoch_tokens": 800,
        "seed": 4,
    }
    got: list[int] = []
    for r in range(2):
        ds = TokenDataset(**args)
        ds.set_epoch(1)
        got += _real(b for _, b in zip(range(3), ds.read_as(World(rank=r, world=2))))
        state = ds.state_dict()
    assert state["epoch"] == 1 and state["world"] == 2 and state["batches"] == 3
    got += [t for r in range(3) for t in _rank(args, 3, r, 2, state)]
    web_take = [web_tokens[p % len(web_tokens)] for p in range(600, 1200)]  # epoch 1's windows
    books_take = [books_tokens[p % len(books_tokens)] for p in range(200, 400)]
    assert Counter(got) == Counter(web_take) + Counter(books_take)
    with pytest.raises(ResumeError, match="seq_len"):
        TokenDataset(**{**args, "seq_len": 11}).load_state_dict(state)
    with pytest.raises(ResumeError, match="check"):
        TokenDataset(**args).load_state_dict({**state, "batches": 2})


def test_a_loaded_state_is_given_back_as_it_was_until_the_epoch_is_read(split: tuple[Path, list[int]]) -> None:
    root, _ = split
    ds = TokenDataset(root, seq_len=16, batch_size=2, rank_world=(1, 4))
    assert ds.state_dict()["world"] == 4 and ds.state_dict()["batches"] == 0  # not read yet: this world
    ds = TokenDataset(root, seq_len=16, batch_size=2, rank_world=(0, 2))
    ds.set_epoch(3)
    for _, _b in zip(range(2), ds):
        pass
    state = ds.state_dict()
    assert (state["epoch"], state["world"], state["batches"]) == (3, 2, 2)
    ds2 = TokenDataset(root, seq_len=16, batch_size=2, rank_world=(0, 3))
    ds2.load_state_dict(state)
    assert ds2.state_dict() == state  # saved again before reading: the same place, not this world's
