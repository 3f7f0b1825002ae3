"""Collation: one preallocated tensor per field, padding with lengths and mask, bucketing."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np
import pytest
import torch

from shardify.reader.sample import collate as C
from shardify.reader.sample.collate import bucket_batches, default_collate, pad_collate


class Pair(NamedTuple):
    image: torch.Tensor
    label: int


def images(n: int, shape: tuple[int, ...] = (3, 4, 5)) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    return [torch.randint(0, 256, shape, dtype=torch.uint8, generator=g) for _ in range(n)]


# default_collate


def test_tuples_become_columns() -> None:
    imgs = images(4)
    batch = default_collate([(img, i, f"k{i}", i / 2, b"x", i % 2 == 0) for i, img in enumerate(imgs)])
    assert isinstance(batch, tuple) and len(batch) == 6
    stacked, labels, keys, floats, raw, flags = batch
    assert stacked.shape == (4, 3, 4, 5) and stacked.dtype == torch.uint8 and stacked.is_contiguous()
    assert torch.equal(stacked, torch.stack(imgs))
    assert labels.dtype == torch.int64 and labels.tolist() == [0, 1, 2, 3]
    assert keys == ["k0", "k1", "k2", "k3"] and raw == [b"x"] * 4
    assert floats.dtype == torch.float32 and floats.tolist() == [0.0, 0.5, 1.0, 1.5]
    assert flags.dtype == torch.bool and flags.tolist() == [True, False, True, False]


def test_dicts_namedtuples_and_numpy() -> None:
    imgs = images(3)
    batch = default_collate([{"img": img, "arr": np.full((2,), i, np.int16), "n": np.int64(i), "m": [i, "a"]}
                             for i, img in enumerate(imgs)])  # fmt: skip
    assert set(batch) == {"img", "arr", "n", "m"}
    assert torch.equal(batch["img"], torch.stack(imgs))
    assert batch["arr"].dtype == torch.int16 and batch["arr"].tolist() == [[0, 0], [1, 1], [2, 2]]
    assert batch["n"].dtype == torch.int64 and batch["n"].tolist() == [0, 1, 2]
    assert batch["m"][0].tolist() == [0, 1, 2] and batch["m"][1] == ["a", "a", "a"]
    pairs = default_collate([Pair(img, i) for i, img in enumerate(imgs)])
    assert isinstance(pairs, Pair) and pairs.label.tolist() == [0, 1, 2]


def test_mixed_ints_and_floats_and_dtypes_are_promoted() -> None:
    assert default_collate([1, 2.5]).dtype == torch.float32
    out = default_collate([torch.ones(2, dtype=torch.uint8), torch.full((2,), 300, dtype=torch.int32)])
    assert out.dtype == torch.int32 and out.tolist() == [[1, 1], [300, 300]]


def test_unequal_shapes_suggest_pad_collate() -> None:
    with pytest.raises(ValueError, match=r"batch\[0\].*pad_collate"):
        default_collate([(torch.zeros(3), 1), (torch.zeros(4), 2)])
    with pytest.raises(ValueError, match="keys"):
        default_collate([{"a": 1}, {"b": 1}])
    with pytest.raises(ValueError, match="non-empty"):
        default_collate([])


def test_batch_is_one_preallocated_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict] = []
    real_stack = torch.stack

    def spy(tensors: list, *args: object, **kwargs: object) -> torch.Tensor:
        calls.append(kwargs)
        return real_stack(tensors, *args, **kwargs)

    monkeypatch.setattr(C.torch, "stack", spy)
    imgs = images(5)
    out = default_collate(imgs)
    assert len(calls) == 1 and calls[0]["out"] is out  # stacked straight into the batch tensor
    assert torch.equal(out, real_stack(imgs))


def test_collate_is_pure_even_in_a_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """No shared memory, no pool, whatever process it runs in: the ToSharedMemory stage moves the batch."""
    import torch.utils.data

    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: SimpleNamespace(id=0, num_workers=1))
    imgs = images(3)
    out = default_collate([(img, i) for i, img in enumerate(imgs)])
    assert not out[0].is_shared() and torch.equal(out[0], torch.stack(imgs))
    padded, _, _ = pad_collate([torch.arange(3), torch.arange(5)])
    assert not padded.is_shared()


def test_with_allocator_gives_shardifys_collates_the_allocator_and_leaves_others_alone() -> None:
    import functools

    made: list[tuple] = []

    def empty(shape, dtype):  # noqa: ANN001, ANN202 - a test allocator
        made.append((tuple(shape), dtype))
        return torch.empty(tuple(shape), dtype=dtype)

    C.with_allocator(C.default_collate, empty)(images(2))
    C.with_allocator(functools.partial(pad_collate, multiple_of=4), empty)([torch.arange(3), torch.arange(5)])
    assert made == [((2, 3, 4, 5), torch.uint8), ((2, 8), torch.int64), ((2, 8), torch.bool)]
    own = lambda samples: samples  # noqa: E731
    assert C.with_allocator(own, empty) is own


# pad_collate


def test_pad_sequences() -> None:
    seqs = [torch.arange(1, 4), torch.arange(1, 6), torch.arange(1, 2)]
    padded, lengths, mask = pad_collate(seqs, pad_value=-1)
    assert padded.tolist() == [[1, 2, 3, -1, -1], [1, 2, 3, 4, 5], [1, -1, -1, -1, -1]]
    assert lengths.dtype == torch.int64 and lengths.tolist() == [3, 5, 1]
    assert mask.dtype == torch.bool and mask.tolist() == [[True] * 3 + [False] * 2, [True] * 5, [True] + [False] * 4]
    padded8, lengths8, mask8 = pad_collate(seqs, multiple_of=4)
    assert padded8.shape == (3, 8) and lengths8.tolist() == [3, 5, 1] and mask8.sum(1).tolist() == [3, 5, 1]
    assert padded8[:, 5:].eq(0).all()


def test_pad_feature_sequences_pads_time_only() -> None:
    feats = [torch.ones(2, 3), torch.ones(4, 3)]
    padded, lengths, mask = pad_collate(feats)
    assert padded.shape == (2, 4, 3) and lengths.tolist() == [2, 4] and mask.shape == (2, 4)
    with pytest.raises(ValueError, match=r"only dims \(0,\)"):
        pad_collate([torch.ones(2, 3), torch.ones(2, 4)])


def test_pad_images_of_different_height_and_width() -> None:
    a = torch.full((3, 2, 5), 7, dtype=torch.uint8)
    b = torch.full((3, 4, 3), 9, dtype=torch.uint8)
    padded, lengths, mask = pad_collate([(a, 0), (b, 1)], multiple_of=4)[0]
    assert padded.shape == (2, 3, 4, 8) and padded.dtype == torch.uint8
    assert lengths.shape == (2, 2) and lengths.tolist() == [[2, 5], [4, 3]]
    assert mask.shape == (2, 4, 8) and mask.dtype == torch.bool
    assert mask[0, :2, :5].all() and mask[0].sum() == 10 and mask[1, :4, :3].all() and mask[1].sum() == 12
    assert padded[0, :, :2, :5].eq(7).all() and padded[1, :, :4, :3].eq(9).all()
    assert padded[0][:, ~mask[0]].eq(0).all() and padded[1][:, ~mask[1]].eq(0).all()


def test_pad_keeps_the_structure_when_shapes_happen_to_be_equal() -> None:
    batch = pad_collate([{"tok": np.arange(3), "label": 1}, {"tok": np.arange(3), "label": 2}])
    padded, lengths, mask = batch["tok"]
    assert padded.shape == (2, 3) and lengths.tolist() == [3, 3] and mask.all()
    assert batch["label"].tolist() == [1, 2]


def test_pad_only_the_named_fields() -> None:
    batch = pad_collate([{"tok": torch.arange(2), "img": torch.zeros(3, 2, 2)},
                         {"tok": torch.arange(4), "img": torch.zeros(3, 2, 2)}], fields={"tok"})  # fmt: skip
    assert isinstance(batch["tok"], tuple) and batch["img"].shape == (2, 3, 2, 2)
    with pytest.raises(ValueError, match="multiple_of=0"):
        pad_collate([torch.arange(2)], multiple_of=0)


# bucket_batches


def run_buckets(n: int, batch_size: int, buffer_size: int, seed: int, drop_last: bool) -> list[list[int]]:
    lengths = random.Random(seed + 1000).choices(range(1, 200), k=n)
    samples = [(i, lengths[i]) for i in range(n)]
    batches = bucket_batches(samples, batch_size=batch_size, length=lambda s: s[1], buffer_size=buffer_size,
                             rng=random.Random(seed), drop_last=drop_last)  # fmt: skip
    return [[i for i, _ in b] for b in batches]


@pytest.mark.parametrize("drop_last", [False, True])
def test_bucketing_yields_every_sample_exactly_once(drop_last: bool) -> None:
    for seed in range(6):
        for n in (0, 1, 7, 64, 250):
            for batch_size in (1, 3, 8):
                for buffer_size in (batch_size, 20, 101):
                    if buffer_size < batch_size:
                        continue
                    batches = run_buckets(n, batch_size, buffer_size, seed, drop_last)
                    seen = Counter(i for b in batches for i in b)
                    assert all(c == 1 for c in seen.values())
                    assert all(len(b) == batch_size for b in batches[:-1])
                    if drop_last:
                        assert len(seen) == n - n % batch_size and all(len(b) == batch_size for b in batches)
                    else:
                        assert len(seen) == n
                    assert batches == run_buckets(n, batch_size, buffer_size, seed, drop_last)


def test_bucketing_cuts_padding() -> None:
    def padding(batches: list[list[int]], lengths: list[int]) -> int:
        return sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in batches)

    lengths = random.Random(1000).choices(range(1, 200), k=2000)
    bucketed = run_buckets(2000, 16, 256, 0, False)
    order = list(range(2000))
    random.Random(0).shuffle(order)
    plain = [order[i : i + 16] for i in range(0, 2000, 16)]
    assert padding(bucketed, lengths) < 0.15 * padding(plain, lengths)


def test_bucketing_order_depends_on_the_rng() -> None:
    assert run_buckets(500, 8, 128, 0, True) != run_buckets(500, 8, 128, 1, True)


@pytest.mark.parametrize(
    ("kwargs", "match"), [({"batch_size": 0}, "batch_size=0"), ({"buffer_size": 4}, "buffer_size=4")]
)
def test_bucketing_checks_arguments(kwargs: dict, match: str) -> None:
    args: dict[str, object] = {"batch_size": 8, "length": len, "buffer_size": 64, "rng": random.Random(0),
                               "drop_last": False, **kwargs}  # fmt: skip
    make: Callable = lambda: list(bucket_batches([], **args))  # noqa: E731
    with pytest.raises(ValueError, match=match):
        make()
