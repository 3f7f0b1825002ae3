"""Recycled shared-memory batch slots: the protocol in one process, then through real workers.

The safety property: a worker never writes into a slot while the main process can still see
a tensor over it, whatever the training loop keeps.
"""

from __future__ import annotations

import gc
import pickle
from collections import namedtuple
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
import torch.multiprocessing  # noqa: F401 - registers the tensor reductions with ForkingPickler
from hypothesis import given
from hypothesis import strategies as st

import shardify.reader.delivery.batchpool as bp
from shardify.errors import ShardifyError
from shardify.reader import ShardedDataset, make_loader
from shardify.reader import transforms as T
from shardify.reader.sample.collate import default_collate, pad_collate

Pair = namedtuple("Pair", "image label")


@pytest.fixture()
def channel():
    ch = bp.BatchChannel(1, max_slots=3, inline_bytes=256)
    ch.register()
    yield ch
    ch.close()


def send(packed: bp.Packed) -> bp.Received:
    """What the DataLoader does between a worker and the main process (here in one process)."""
    return pickle.loads(ForkingPickler.dumps(packed))


def images(n: int, value: int, size: int = 16) -> list:
    return [(torch.full((3, size, size), value + i, dtype=torch.uint8), i) for i in range(n)]


def tokens(ch: bp.BatchChannel) -> list[int]:
    return ch.tokens[0].tolist()


def test_a_batch_arrives_intact_and_its_slot_is_freed_when_dropped(channel):
    pool = bp.SlotPool(channel, 0)
    packed = pool.send(default_collate(images(4, 10)))
    kinds = [type(x).__name__ for x in packed.payload]
    assert kinds == ["_SlotRef", "_Inline"]  # the 3 KiB image batch in a slot, labels by value
    x, y = send(packed).unpack()
    assert torch.equal(x, torch.stack([s[0] for s in images(4, 10)])) and y.tolist() == [0, 1, 2, 3]
    assert tokens(channel)[0] != 0
    part = x[2, 1]  # a view keeps the slot
    del x
    gc.collect()
    assert tokens(channel)[0] != 0 and int(part[0, 0]) == 12
    del part
    gc.collect()
    assert tokens(channel) == [0, 0, 0]


def test_a_freed_slot_is_reused_and_a_kept_one_is_never_written(channel):
    pool = bp.SlotPool(channel, 0)
    first, _ = send(pool.send(default_collate(images(4, 10)))).unpack()
    second, _ = send(pool.send(default_collate(images(4, 50)))).unpack()
    assert first.data_ptr() != second.data_ptr()
    pointer = second.untyped_storage().data_ptr()
    del second
    gc.collect()
    third, _ = send(pool.send(default_collate(images(4, 90)))).unpack()
    assert third.untyped_storage().data_ptr() == pointer  # the main process maps each slot once
    assert int(first[3, 0, 0, 0]) == 13 and int(third[0, 0, 0, 0]) == 90


def test_out_of_slots_falls_back_to_fresh_shared_memory(channel):
    pool = bp.SlotPool(channel, 0)
    kept = [send(pool.send(default_collate(images(2, 10 * i)))).unpack() for i in range(5)]
    assert all(t != 0 for t in tokens(channel))
    for i, (x, _) in enumerate(kept):
        assert x[:, 0, 0, 0].tolist() == [10 * i, 10 * i + 1]
    assert isinstance(pool.send(default_collate(images(2, 0))).payload[0], torch.Tensor)


def test_bigger_batches_get_a_bigger_slot(channel):
    pool = bp.SlotPool(channel, 0)
    for size in (8, 16, 32, 16, 64):
        x, _ = send(pool.send(default_collate(images(2, size, size=size)))).unpack()
        assert x.shape == (2, 3, size, size) and int(x[1, 2, size - 1, size - 1]) == size + 1
        del x
        gc.collect()
    assert tokens(channel) == [0, 0, 0]


def test_a_batch_dropped_unopened_gives_its_slot_back(channel):
    pool = bp.SlotPool(channel, 0)
    received = send(pool.send(default_collate(images(4, 0))))
    assert tokens(channel)[0] != 0
    del received
    gc.collect()
    assert tokens(channel) == [0, 0, 0]


def test_a_send_that_fails_midway_gives_its_slots_back(channel, monkeypatch):
    pool = bp.SlotPool(channel, 0)
    real = bp._SlotRef

    def failing(*args):
        raise RuntimeError("pack failed")

    monkeypatch.setattr(bp, "_SlotRef", failing)  # the first tensor is copied into a slot, then it fails
    with pytest.raises(RuntimeError, match="pack failed"):
        pool.send(default_collate(images(4, 0)))
    assert tokens(channel) == [0, 0, 0]
    monkeypatch.setattr(bp, "_SlotRef", real)
    x, _ = send(pool.send(default_collate(images(4, 5)))).unpack()
    assert int(x[3, 0, 0, 0]) == 8


def test_only_tensors_of_the_batch_take_slots(channel):
    pool = bp.SlotPool(channel, 0)
    packed = pool.send(default_collate(images(4, 0))[1])  # only the labels
    assert packed.refs == () and tokens(channel) == [0, 0, 0]


def test_a_new_worker_process_ignores_the_old_one_s_late_releases(channel):
    old = bp.SlotPool(channel, 0)
    kept, _ = send(old.send(default_collate(images(4, 0)))).unpack()
    new = bp.SlotPool(channel, 0)  # a restarted worker with the same id resets its row
    assert tokens(channel) == [0, 0, 0]
    fresh, _ = send(new.send(default_collate(images(4, 40)))).unpack()
    token = tokens(channel)[0]
    del kept  # the old batch's release must not free the new worker's slot
    gc.collect()
    assert tokens(channel)[0] == token and int(fresh[0, 0, 0, 0]) == 40


class Holder:
    """A batch type the packer does not open."""

    def __init__(self, images: torch.Tensor) -> None:
        self.images = images


def test_a_tensor_hidden_in_another_object_travels_as_torch_sends_it(channel):
    pool = bp.SlotPool(channel, 0)
    held = send(pool.send(Holder(default_collate(images(4, 10))[0]))).unpack()
    assert isinstance(held, Holder) and tokens(channel) == [0, 0, 0]
    for i in range(6):  # every slot is written meanwhile; the held batch is not among them
        send(pool.send(default_collate(images(4, 100 + i)))).unpack()
    assert held.images[:, 0, 0, 0].tolist() == [10, 11, 12, 13]


def test_a_batch_made_over_a_slot_is_sent_without_a_copy(channel):
    pool = bp.SlotPool(channel, 0)
    x, _ = batch = default_collate(images(4, 10), empty=pool.empty)
    packed = pool.send(batch)
    assert [type(v).__name__ for v in packed.payload] == ["_SlotRef", "_Inline"] and len(packed.refs) == 1
    assert packed.refs[0][3].data_ptr() == x.data_ptr()  # the slot the collate wrote into, as it is
    received, _ = send(packed).unpack()
    assert torch.equal(received, x)


def test_a_slot_made_by_a_failing_collate_is_given_up_at_the_next_send(channel):
    pool = bp.SlotPool(channel, 0)

    def broken(samples):
        default_collate(samples, empty=pool.empty)
        raise RuntimeError("user collate failed")

    with pytest.raises(RuntimeError, match="user collate failed"):
        broken(images(4, 0))
    assert tokens(channel)[0] != 0
    x, _ = send(pool.send(default_collate(images(4, 5), empty=pool.empty))).unpack()
    assert int(x[3, 0, 0, 0]) == 8 and tokens(channel).count(0) == 2  # only the new batch's slot is held


def test_a_slot_hidden_in_another_object_is_given_up_not_reused(channel):
    pool = bp.SlotPool(channel, 0)
    held = send(pool.send(Holder(default_collate(images(4, 10), empty=pool.empty)[0]))).unpack()
    assert isinstance(held, Holder) and tokens(channel) == [0, 0, 0]
    for i in range(6):  # every slot is written meanwhile; the held batch is not among them
        send(pool.send(default_collate(images(4, 100 + i), empty=pool.empty))).unpack()
    assert held.images[:, 0, 0, 0].tolist() == [10, 11, 12, 13]


def test_structure_and_small_tensors_of_every_kind(channel):
    pool = bp.SlotPool(channel, 0)
    big = torch.arange(3 * 32 * 32, dtype=torch.float32).reshape(3, 32, 32)

    def collate(samples):
        x = default_collate(samples)
        return {
            "pair": Pair(x[0][:, :, 1:], x[1]),  # a non-contiguous view: arrives contiguous
            "list": [
                torch.tensor(True),
                torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
                torch.empty(0, 3),
                torch.arange(6).reshape(2, 3).t(),
            ],
            "big": big * 2,  # large: copied into a slot too
            "text": "kept",
        }

    out = send(pool.send(collate([(big, 7), (big + 1, 8)]))).unpack()
    assert isinstance(out["pair"], Pair) and torch.equal(out["pair"].image, torch.stack([big, big + 1])[:, :, 1:])
    assert out["pair"].label.tolist() == [7, 8]
    flag, half, empty, transposed = out["list"]
    assert flag.item() is True and half.dtype == torch.bfloat16 and half.tolist() == [1.5, -2.0]
    assert empty.shape == (0, 3) and torch.equal(transposed, torch.arange(6).reshape(2, 3).t())
    assert torch.equal(out["big"], big * 2) and out["text"] == "kept"


def test_pad_collate_draws_padded_fields_and_masks_from_the_pool(channel):
    pool = bp.SlotPool(channel, 0)
    seqs = [torch.arange(n, dtype=torch.int64) for n in (100, 300)]
    packed = pool.send(pad_collate(seqs, empty=pool.empty))
    padded, lengths, mask = send(packed).unpack()
    assert [type(x).__name__ for x in packed.payload] == ["_SlotRef", "_Inline", "_SlotRef"]
    assert padded.shape == (2, 300) and lengths.tolist() == [100, 300]
    assert mask.sum().item() == 400 and padded[0, 99].item() == 99 and padded[0, 100].item() == 0


def test_pinning_copies_and_frees_the_slot_at_once(channel, monkeypatch):
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, device=None: self.clone())
    pool = bp.SlotPool(channel, 0)
    x, y = send(pool.send(default_collate(images(4, 10)))).pin_memory()
    gc.collect()
    assert tokens(channel) == [0, 0, 0] and int(x[3, 0, 0, 0]) == 13 and y.tolist() == [0, 1, 2, 3]


def test_a_batch_for_a_closed_loader_is_a_clear_error(channel):
    pool = bp.SlotPool(channel, 0)
    packed = pool.send(default_collate(images(2, 0)))
    channel.close()
    received = send(packed)
    with pytest.raises(ShardifyError, match=f"channel {channel.id}"):
        received.unpack()


@given(st.integers(1, 1 << 34))
def test_capacity_rounds_up_by_at_most_an_eighth(n):
    c = bp._capacity(n)
    assert c >= n and c % 4096 == 0 and c - n < max(4096, n / 8)


# -- through real worker processes ----------------------------------------------------------------


@pytest.fixture()
def small_slots(monkeypatch):
    """Few slots, and even tiny image batches go through them."""
    monkeypatch.setattr(bp, "MAX_SLOTS", 3)
    monkeypatch.setattr(bp, "INLINE_BYTES", 64)


def _epoch(loader, ds, epoch):
    ds.set_epoch(epoch)
    return [(x.clone(), y.clone()) for x, y in loader]


@pytest.mark.parametrize("context", [None, "spawn"])
def test_kept_batches_equal_fresh_memory_batches(image_dataset, small_slots, context):
    ds = ShardedDataset(image_dataset, batch_size=2, shuffle=True, seed=3, transform=T.imagenet_train(16))
    plain = make_loader(ds, num_workers=2, recycle_batches=False)
    want = _epoch(plain, ds, 1)
    plain.close()
    with make_loader(ds, num_workers=2, multiprocessing_context=context) as loader:
        ds.set_epoch(1)
        kept = list(loader)  # 11 batches held at once, 3 slots per worker: the rest fresh memory
        assert len(kept) == len(want) == 11
        for (x, y), (wx, wy) in zip(kept, want):
            assert torch.equal(x, wx) and torch.equal(y, wy)
        del kept, x, y
        gc.collect()
        for epoch in (1, 2):  # the usual loop: one batch at a time, slots reused
            again = _epoch(loader, ds, epoch)
            if epoch == 1:
                assert all(torch.equal(a, b) for (a, _), (b, _) in zip(again, want))
        assert len(again) == 11


def test_a_plain_dataloader_over_the_dataset_gets_plain_tensors(image_dataset):
    ds = ShardedDataset(image_dataset, batch_size=2, transform=T.imagenet_eval(16, resize=16))
    with make_loader(ds, num_workers=2) as loader:
        list(loader)
    plain = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    assert all(isinstance(x, torch.Tensor) for x, _ in plain)
