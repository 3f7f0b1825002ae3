"""The decode strategy, chosen once per dataset: its stages, and the allocator its collate draws from."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from shardify.reader import BatchOptions, DecodeOptions, ShardedDataset
from shardify.reader import transforms as T
from shardify.reader.sample.codec_decode import CodecDecoder
from shardify.reader.sample.collate import pad_collate
from shardify.reader.sample.decoders import CpuDecoding, DeviceDecoding, NvImageCodecDecoding
from shardify.reader.sample.device_decode import DeviceDecoder, pil_decoder
from shardify.reader.sample.device_prep import PrepProcessor
from shardify.reader.sample.image_decoders import PillowDecoder
from shardify.reader.sample.processor import SampleProcessor


def _first_items(ds: ShardedDataset, n: int) -> list:
    reader = ds._readers.get(ds._setup, ds.options)
    try:
        return list(reader.read(0, 0, n))
    finally:
        reader.close()


def test_each_strategy_plugs_in_its_stages_and_draws_from_the_given_allocator(image_dataset: Path) -> None:
    made: list[tuple] = []

    def empty(shape, dtype):  # noqa: ANN001, ANN202 - a spying allocator
        made.append((tuple(shape), dtype))
        return torch.empty(tuple(shape), dtype=dtype)

    for kw, strategy, processor, device_stage, jpeg in (
        ({}, CpuDecoding, SampleProcessor, type(None), pil_decoder),
        ({"batching": BatchOptions(collate_fn=pad_collate)}, CpuDecoding, SampleProcessor, type(None), pil_decoder),
        ({"decoding": DecodeOptions(device="cpu")}, DeviceDecoding, PrepProcessor, DeviceDecoder, pil_decoder),
        (
            {"decoding": DecodeOptions(device="cpu", decoder="nvimgcodec")},
            NvImageCodecDecoding,
            PrepProcessor,
            CodecDecoder,
            PillowDecoder(),
        ),
    ):
        ds = ShardedDataset(image_dataset, batch_size=2, transform=T.imagenet_train(16), **kw)
        s = ds.decode_strategy
        assert type(s) is strategy
        (process,) = s.processors(ds.streams, ds._setup.stream_fields, ds.options, epoch=0)
        assert type(process) is processor
        assert type(s.device_stage(torch.device("cpu"), jpeg_decoder=jpeg)) is device_stage
        made.clear()
        s.collate(ds.options, empty=empty)([process(item) for item in _first_items(ds, 2)])
        assert made and made[0][1] == torch.uint8  # the image column (or its bytes) from the allocator


def test_a_custom_collate_allocates_for_itself(image_dataset: Path) -> None:
    own = BatchOptions(collate_fn=lambda samples: SimpleNamespace(n=len(samples)))
    ds = ShardedDataset(image_dataset, batch_size=2, transform=T.imagenet_train(16), batching=own)
    assert ds.decode_strategy.collate(ds.options, empty=None) is ds.options.batching.collate_fn  # type: ignore[arg-type]


def test_the_device_strategys_errors_name_shard_and_key() -> None:
    import pytest

    from shardify.errors import SampleError
    from shardify.reader.sample.device_prep import DevicePrep, pack_samples
    from shardify.reader.sample.prepared import ImagePrep, PreparedSample

    box = (0.0, 0.0, 8.0, 8.0)
    a = PreparedSample((ImagePrep(b"x", box, box, (8, 8), False), 1), "s0.tar", "k0")
    b = PreparedSample((ImagePrep(b"y", box, box, (8, 6), False), 2), "s1.tar", "k1")
    with pytest.raises(ValueError, match=r"sample 1, shard s1.tar, key 'k1'.*one output size"):
        pack_samples([a, b])
    process = PrepProcessor(
        prep=DevicePrep(T.imagenet_train(8)),
        fields=["image", "cls"],
        seed=0,
        epoch=0,
        allow_pickle=False,
        skip_errors=False,
        unique_keys=True,
    )
    with pytest.raises(SampleError, match=r"field 'jpg': DecodeError") as info:
        process({"__shard__": "s2.tar", "__key__": "k2", "jpg": b"\xff\xd8"})
    assert "s2.tar" in str(info.value) and "k2" in str(info.value)


def test_the_nvimgcodec_strategy_says_what_decoders_it_takes(image_dataset: Path) -> None:
    import pytest

    ds = ShardedDataset(
        image_dataset,
        batch_size=2,
        transform=T.imagenet_train(16),
        decoding=DecodeOptions(device="cpu", decoder="nvimgcodec"),
    )
    with pytest.raises(TypeError, match=r"takes image decoders .*PillowDecoder"):
        ds.decode_strategy.device_stage(torch.device("cpu"), jpeg_decoder=pil_decoder)
