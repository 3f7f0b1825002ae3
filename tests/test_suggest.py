"""A mistyped keyword of any public option object, or of ``make_loader``, is a TypeError naming
the keyword meant (one helper, ``shardify.suggest``), and the objects stay what they were."""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import pytest

from shardify.convert import ItemsOptions, ValueOptions, WriteOptions
from shardify.convert.options import ConvertOptions
from shardify.reader import make_loader
from shardify.reader import options as reader_options
from shardify.suggest import closest, unexpected_keyword

READER = [
    getattr(reader_options, name) for name in reader_options.__all__ if isinstance(getattr(reader_options, name), type)
]
OPTIONS = [*READER, ConvertOptions, WriteOptions, ItemsOptions, ValueOptions]


@pytest.mark.parametrize(
    "call, typo, meant",
    [
        pytest.param(reader_options.BatchOptions, "drop_lst", "drop_last", id="BatchOptions"),
        pytest.param(reader_options.SamplingOptions, "shuffle_bufer", "shuffle_buffer", id="SamplingOptions"),
        pytest.param(reader_options.DecodeOptions, "onerror", "on_error", id="DecodeOptions"),
        pytest.param(reader_options.CacheOptions, "limit_byte", "limit_bytes", id="CacheOptions"),
        pytest.param(ConvertOptions, "worker", "workers", id="ConvertOptions"),
        pytest.param(WriteOptions, "samples_per_shrd", "samples_per_shard", id="WriteOptions"),
        pytest.param(ItemsOptions, "item_timout", "item_timeout", id="ItemsOptions"),
        pytest.param(make_loader, "num_worker", "num_workers", id="make_loader"),
    ],
)
def test_a_mistyped_keyword_names_the_one_meant(call, typo: str, meant: str) -> None:
    with pytest.raises(
        TypeError, match=rf"^{call.__name__}\(\) got an unexpected keyword argument '{typo}'; did you mean {meant}=\?$"
    ):
        call(**{typo: 1})


@pytest.mark.parametrize("cls", OPTIONS, ids=lambda c: c.__name__)
def test_every_public_option_object_suggests_and_keeps_its_signature(cls) -> None:
    fields = [f.name for f in dataclasses.fields(cls) if f.init]
    assert list(inspect.signature(cls).parameters) == fields  # what help() and IDEs show
    for name in fields:
        typo = name[:-1] + "_" if len(name) > 3 else name + "x"
        with pytest.raises(
            TypeError, match=rf"^{cls.__name__}\(\) got an unexpected keyword argument '{typo}'; did you"
        ):
            cls(**{typo: 1})
    required = {
        f.name: 1 for f in dataclasses.fields(cls) if f.init and f.default is f.default_factory is dataclasses.MISSING
    }
    made = cls(**required)
    assert pickle.loads(pickle.dumps(made)) == made == dataclasses.replace(made)


def test_a_keyword_like_none_lists_every_one() -> None:
    assert unexpected_keyword("f", "zzz", ["alpha", "beta"]) == (
        "f() got an unexpected keyword argument 'zzz'; it takes alpha=, beta="
    )
    assert closest("zzz", ["alpha"]) is None


def test_make_loader_still_takes_its_keywords() -> None:
    with pytest.raises(TypeError, match="make_loader wants a ShardedDataset"):  # the body ran: keywords passed
        make_loader(None, num_workers=0, timeout=0, progress=False)  # type: ignore[arg-type]
