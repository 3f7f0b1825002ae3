"""ShardedDataset's grouped options: each group checks its own values; the keywords the groups
replaced before the first release are refused, naming the closest keyword.
"""

from __future__ import annotations

import dataclasses
import pickle
import re
import warnings

import pytest

from shardify.reader import (
    BatchOptions,
    CacheOptions,
    DecodeOptions,
    ReadOptions,
    SamplingOptions,
    ShardedDataset,
    Stream,
)
from shardify.reader.options import GROUPS


def _length(output: object) -> int:
    return int(output) % 3  # type: ignore[call-overload]


def _epoch(ds: ShardedDataset) -> list[list[int]]:
    ds.set_epoch(1)
    return [[int(x) for x in batch] for batch in ds]


@pytest.mark.parametrize(
    "name, value",
    [
        pytest.param("drop_last", True, id="drop_last"),
        pytest.param("shuffle_buffer", 5, id="shuffle_buffer"),
        pytest.param("on_error", "skip", id="on_error"),
        pytest.param("cache_dir", "c", id="cache_dir"),
        pytest.param("shuffling", None, id="shuffling"),
        pytest.param("errors", None, id="errors"),
    ],
)
def test_a_keyword_the_groups_replaced_is_refused(counting_dataset, name, value):
    """The keywords of the pre-release options are no keywords of ShardedDataset: a TypeError
    naming the keyword, with no warning and no folding into a group."""
    root = counting_dataset([4])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TypeError, match=rf"unexpected keyword argument '{name}'"):
            ShardedDataset(root, batch_size=2, **{name: value})


def test_batch_size_is_required(counting_dataset):
    root = counting_dataset([4])
    with pytest.raises(TypeError, match="batch_size"):
        ShardedDataset(root)  # type: ignore[call-arg]


def test_cache_keywords_reach_the_fetch_options(counting_dataset):
    root = counting_dataset([4])
    ds = ShardedDataset(root, batch_size=2, cache=CacheOptions(dir=str(root.parent / "c"), limit_bytes=123))
    assert (ds.source.fetch.cache_dir, ds.source.fetch.cache_limit_bytes) == (str(root.parent / "c"), 123)


def test_an_unknown_keyword_is_a_type_error(counting_dataset):
    root = counting_dataset([4])
    with pytest.raises(TypeError, match="unexpected keyword argument 'shuffle_size'"):
        ShardedDataset(root, batch_size=2, shuffle_size=3)


@pytest.mark.parametrize(
    "make, message",
    [
        pytest.param(lambda: SamplingOptions(shuffle_buffer=0), "shuffle_buffer=0", id="sampling-shuffle-buffer"),
        pytest.param(lambda: SamplingOptions(shuffle_block=0), "shuffle_block=0", id="sampling-shuffle-block"),
        pytest.param(lambda: DecodeOptions(on_error="warn"), "on_error='warn'", id="decode-on-error"),  # type: ignore[arg-type]
        pytest.param(lambda: BatchOptions(bucket_buffer=0), "bucket_buffer=0", id="bucket-buffer"),
        pytest.param(lambda: SamplingOptions(samples_per_epoch=-1), "samples_per_epoch=-1", id="samples"),
        pytest.param(lambda: DecodeOptions(max_member_bytes=-1), "max_member_bytes=-1", id="member-bytes"),
        pytest.param(lambda: CacheOptions(dir="c", limit_bytes=-1), "limit_bytes=-1", id="cache-limit"),
        pytest.param(lambda: CacheOptions(limit_bytes=10), "needs dir=", id="cache-limit-without-dir"),
    ],
)
def test_each_group_checks_its_values(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_a_group_of_the_wrong_type_is_named(counting_dataset):
    root = counting_dataset([4])
    with pytest.raises(TypeError, match=r"sampling= should be a SamplingOptions, got DecodeOptions"):
        ShardedDataset(root, batch_size=2, sampling=DecodeOptions())  # type: ignore[arg-type]


def test_groups_are_frozen():
    with pytest.raises(AttributeError):
        SamplingOptions().shuffle_buffer = 3  # type: ignore[misc]


def test_the_common_case_is_one_line_and_warns_nothing(counting_dataset):
    root = counting_dataset([7, 2, 13])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = ShardedDataset(root, split="train", batch_size=4, shuffle=True, fields=("cls",))
    assert ds.options.sampling == SamplingOptions()
    assert sorted(x for b in _epoch(ds) for x in b) == list(range(22))


def test_streams_take_the_per_sample_keywords_of_the_dataset(counting_dataset):
    """``Stream``'s options are the dataset's per-sample keywords, under the same names."""
    import inspect

    stream = set(inspect.signature(Stream).parameters) - {"source", "weight"}
    dataset = set(inspect.signature(ShardedDataset).parameters)
    assert stream <= dataset and not stream & set(GROUPS)


@pytest.mark.parametrize(
    "kw, message",
    [
        pytest.param({"batch_size": 0}, "batch_size=0 should be >= 1", id="batch-size"),
        pytest.param(
            {"batch_size": 2, "fields": ("cls",), "map": dict}, "fields=... or map=..., not both", id="fields-map"
        ),
    ],
)
def test_the_record_checks_the_dataset_keywords(kw, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ReadOptions(**kw)


def test_each_option_is_stored_once_in_its_group_and_the_record_pickles():
    """The record holds the direct keywords and the four groups as given: no field of a group is
    copied beside it, and what workers receive is the same record after pickling."""
    direct = {f.name for f in dataclasses.fields(ReadOptions)} - set(GROUPS)
    assert direct == {"batch_size", "shuffle", "seed", "transform", "fields", "map"}
    for cls in GROUPS.values():
        assert not direct & {f.name for f in dataclasses.fields(cls)}, cls
    sampling = SamplingOptions(shuffle_buffer=5, shuffle_block=2)
    opts = ReadOptions(batch_size=3, fields=("cls",), sampling=sampling, batching=BatchOptions(drop_last=True))
    assert opts.sampling is sampling and opts.decoding == DecodeOptions() and opts.cache == CacheOptions()
    assert pickle.loads(pickle.dumps(opts)) == opts
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.batch_size = 4  # type: ignore[misc]
    with pytest.raises(TypeError, match="decoding= should be a DecodeOptions, got SamplingOptions"):
        ReadOptions(batch_size=3, decoding=sampling)  # type: ignore[arg-type]
