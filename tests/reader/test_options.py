"""ShardedDataset's grouped options, and the old keywords they replaced (deprecated for one release).

Each old keyword must give the same dataset as its group: the same flat ``ReadOptions`` the
workers read, the same fetch options and checksums, and the same batches for an epoch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import shardify.reader.dataset
from shardify.reader import (
    BatchOptions,
    CacheOptions,
    DecodeOptions,
    ErrorOptions,
    ReadOptions,
    SamplingOptions,
    ShardedDataset,
    ShuffleOptions,
    Stream,
)
from shardify.reader.deprecated import OLD_GROUPS, OLD_KEYWORDS
from shardify.reader.options import GROUPS


def _length(output: object) -> int:
    return int(output) % 3  # type: ignore[call-overload]


def _checksums(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.glob("*.tar"))}


# A value other than the default for each old keyword; a callable takes the dataset folder.
VALUES = {
    "shuffle_buffer": 5,
    "shuffle_block": 2,
    "collate_fn": list,
    "bucket_length": _length,
    "bucket_buffer": 6,
    "drop_last": True,
    "samples_per_epoch": 15,
    "mark_repeats": True,
    "allow_pickle": True,
    "max_member_bytes": 4096,
    "on_error": "skip",
    "verify": _checksums,
    "cache_dir": lambda root: str(root.parent / "cache"),
    "cache_limit_bytes": 10**9,
}


def _value(name: str, root: Path) -> object:
    v = VALUES[name]
    return v(root) if name in ("verify", "cache_dir") else v


def _others(name: str, root: Path) -> dict[str, object]:
    """Keywords of the same group that ``name`` needs beside it (a cache limit needs a cache folder)."""
    return {"cache_dir": _value("cache_dir", root)} if name == "cache_limit_bytes" else {}


def _epoch(ds: ShardedDataset) -> list[list[int]]:
    ds.set_epoch(1)
    return [[int(x) for x in batch] for batch in ds]


def test_every_old_keyword_is_covered():
    assert set(VALUES) == set(OLD_KEYWORDS)
    assert {g for g, _ in OLD_KEYWORDS.values()} == set(GROUPS)


@pytest.mark.parametrize("name", sorted(OLD_KEYWORDS))
def test_an_old_keyword_warns_and_reads_as_its_group(counting_dataset, name):
    root = counting_dataset([7, 2, 13])
    old_kw = {name: _value(name, root), **_others(name, root)}
    group, field = OLD_KEYWORDS[name]
    common = dict(batch_size=3, shuffle=True, seed=4, fields=("cls",))
    with pytest.warns(DeprecationWarning, match=rf"{name}= -> {group}={GROUPS[group].__name__}\({field}=\.\.\.\)"):
        old = ShardedDataset(root, **common, **old_kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        new = ShardedDataset(
            root, **common, **{group: GROUPS[group](**{OLD_KEYWORDS[k][1]: v for k, v in old_kw.items()})}
        )
    assert old.options == new.options
    if name.startswith("cache_"):  # the cache is the source's, not the workers' options
        assert getattr(new.source.fetch, name) == old_kw[name]
    else:  # the flat record keeps the old names
        assert getattr(new.options, name) == (True if name == "verify" else old_kw[name])
    assert old.source.fetch == new.source.fetch
    assert old._setup.checksums == new._setup.checksums
    assert _epoch(old) == _epoch(new)


def test_cache_keywords_reach_the_fetch_options(counting_dataset):
    root = counting_dataset([4])
    ds = ShardedDataset(root, batch_size=2, cache=CacheOptions(dir=str(root.parent / "c"), limit_bytes=123))
    assert (ds.source.fetch.cache_dir, ds.source.fetch.cache_limit_bytes) == (str(root.parent / "c"), 123)


def test_several_old_keywords_of_one_group_make_one_group(counting_dataset):
    root = counting_dataset([7, 2, 13])
    with pytest.warns(DeprecationWarning):
        old = ShardedDataset(
            root, batch_size=3, shuffle=True, fields=("cls",), shuffle_buffer=5, shuffle_block=2, on_error="skip"
        )
    new = ShardedDataset(
        root,
        batch_size=3,
        shuffle=True,
        fields=("cls",),
        sampling=SamplingOptions(shuffle_buffer=5, shuffle_block=2),
        decoding=DecodeOptions(on_error="skip"),
    )
    assert old.options == new.options


@pytest.mark.parametrize("name", sorted(OLD_KEYWORDS))
def test_an_old_keyword_with_its_group_setting_it_too_is_an_error(counting_dataset, name):
    root = counting_dataset([4])
    group, field = OLD_KEYWORDS[name]
    both = GROUPS[group](
        **{OLD_KEYWORDS[k][1]: v for k, v in {name: _value(name, root), **_others(name, root)}.items()}
    )
    with pytest.raises(TypeError, match=rf"pass {name}=\.\.\. or {group}={GROUPS[group].__name__}\(\.\.\.\), not both"):
        ShardedDataset(root, batch_size=2, **{name: _value(name, root), group: both})


def test_an_old_keyword_is_folded_into_its_group_given_without_it(counting_dataset):
    root = counting_dataset([7, 2, 13])
    with pytest.warns(DeprecationWarning, match=r"drop_last= -> batching=BatchOptions\(drop_last=\.\.\.\)"):
        old = ShardedDataset(
            root, batch_size=3, fields=("cls",), drop_last=True, batching=BatchOptions(collate_fn=list)
        )
    assert old.options.drop_last and old.options.collate_fn is list
    new = ShardedDataset(root, batch_size=3, fields=("cls",), batching=BatchOptions(collate_fn=list, drop_last=True))
    assert old.options == new.options and len(old) == len(new) == 7


OLD_GROUP_VALUES = {
    "shuffling": (ShuffleOptions(buffer=5, block=2), SamplingOptions(shuffle_buffer=5, shuffle_block=2)),
    "errors": (ErrorOptions(on_error="skip", verify=True), DecodeOptions(on_error="skip", verify=True)),
}


def test_every_old_group_is_covered():
    assert set(OLD_GROUP_VALUES) == set(OLD_GROUPS)


@pytest.mark.parametrize("name", sorted(OLD_GROUPS))
def test_an_old_group_warns_and_reads_as_the_group_it_was_folded_into(counting_dataset, name):
    root = counting_dataset([7, 2, 13])
    old_value, new_value = OLD_GROUP_VALUES[name]
    group = OLD_GROUPS[name][1]
    common = dict(batch_size=3, shuffle=True, seed=4, fields=("cls",))
    with pytest.warns(DeprecationWarning, match=rf"{name}={type(old_value).__name__}\(\.\.\.\) -> {group}="):
        old = ShardedDataset(root, **common, **{name: old_value})
    new = ShardedDataset(root, **common, **{group: new_value})
    assert old.options == new.options and _epoch(old) == _epoch(new)
    with pytest.warns(DeprecationWarning):  # beside its new group, folded into it
        both = ShardedDataset(
            root,
            **common,
            **{
                name: old_value,
                group: GROUPS[group](allow_pickle=True) if group == "decoding" else GROUPS[group](samples_per_epoch=9),
            },
        )
    assert {k: getattr(both.options, k) for k in ("shuffle_buffer", "shuffle_block", "on_error")} == {
        k: getattr(new.options, k) for k in ("shuffle_buffer", "shuffle_block", "on_error")
    }


def test_an_unknown_keyword_is_a_type_error(counting_dataset):
    root = counting_dataset([4])
    with pytest.raises(TypeError, match="unexpected keyword argument 'shuffle_size'"):
        ShardedDataset(root, batch_size=2, shuffle_size=3)


def test_a_group_of_the_wrong_type_is_named(counting_dataset):
    root = counting_dataset([4])
    with pytest.raises(TypeError, match=r"shuffling= should be a ShuffleOptions, got ErrorOptions"):
        ShardedDataset(root, batch_size=2, shuffling=ErrorOptions())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "make, message",
    [
        pytest.param(lambda: ShuffleOptions(buffer=0), "buffer=0", id="shuffle-buffer"),
        pytest.param(lambda: ShuffleOptions(block=0), "block=0", id="shuffle-block"),
        pytest.param(lambda: SamplingOptions(shuffle_buffer=0), "shuffle_buffer=0", id="sampling-shuffle-buffer"),
        pytest.param(lambda: SamplingOptions(shuffle_block=0), "shuffle_block=0", id="sampling-shuffle-block"),
        pytest.param(lambda: DecodeOptions(on_error="warn"), "on_error='warn'", id="decode-on-error"),  # type: ignore[arg-type]
        pytest.param(lambda: BatchOptions(bucket_buffer=0), "bucket_buffer=0", id="bucket-buffer"),
        pytest.param(lambda: SamplingOptions(samples_per_epoch=-1), "samples_per_epoch=-1", id="samples"),
        pytest.param(lambda: DecodeOptions(max_member_bytes=-1), "max_member_bytes=-1", id="member-bytes"),
        pytest.param(lambda: ErrorOptions(on_error="warn"), "on_error='warn'", id="on-error"),  # type: ignore[arg-type]
        pytest.param(lambda: CacheOptions(dir="c", limit_bytes=-1), "limit_bytes=-1", id="cache-limit"),
        pytest.param(lambda: CacheOptions(limit_bytes=10), "needs dir=", id="cache-limit-without-dir"),
    ],
)
def test_each_group_checks_its_values(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_groups_are_frozen():
    with pytest.raises(AttributeError):
        ShuffleOptions().buffer = 3  # type: ignore[misc]


def test_the_common_case_is_one_line_and_warns_nothing(counting_dataset):
    root = counting_dataset([7, 2, 13])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = ShardedDataset(root, split="train", batch_size=4, shuffle=True, fields=("cls",))
    assert ds.options.shuffle_buffer == SamplingOptions().shuffle_buffer
    assert sorted(x for b in _epoch(ds) for x in b) == list(range(22))


def test_streams_take_the_per_sample_keywords_of_the_dataset(counting_dataset):
    """``Stream``'s options are the dataset's per-sample keywords, under the same names."""
    import inspect

    stream = set(inspect.signature(Stream).parameters) - {"source", "weight"}
    dataset = set(inspect.signature(ShardedDataset).parameters)
    assert stream <= dataset and not stream & set(GROUPS)


def test_an_old_keyword_fails_the_test_suite_and_other_deprecations_do_not(counting_dataset):
    """pyproject.toml's ``filterwarnings``: an old keyword left in a test is an error there (the
    tests of the deprecation above expect it with ``pytest.warns``), while another package's
    ``DeprecationWarning`` stays a warning, even one attributed to shardify's call of it."""
    root = counting_dataset([4])
    with pytest.raises(
        DeprecationWarning, match=r"shuffle_buffer= -> sampling=SamplingOptions\(shuffle_buffer=\.\.\.\)"
    ):
        ShardedDataset(root, batch_size=2, shuffle_buffer=4)
    with warnings.catch_warnings(record=True) as seen:
        warnings.warn_explicit(
            "old_api() is deprecated", DeprecationWarning, "thirdparty/api.py", 1, module="thirdparty.api"
        )
        warnings.warn_explicit(
            "torch.old_api() is deprecated",
            DeprecationWarning,
            shardify.reader.dataset.__file__,
            1,
            module="shardify.reader.dataset",
        )
    assert [w.category for w in seen] == [DeprecationWarning, DeprecationWarning]


_CHILD = textwrap.dedent("""
    import sys, warnings
    from shardify.reader import SamplingOptions, ShardedDataset
    warnings.warn_explicit("old_api() is deprecated", DeprecationWarning, "thirdparty/api.py", 1)
    ShardedDataset(sys.argv[1], batch_size=2, sampling=SamplingOptions(shuffle_buffer=4))
    print("the groups and other deprecations pass")
    ShardedDataset(sys.argv[1], batch_size=2, shuffle_buffer=4)
    print("the old keyword passed")
""")


def test_an_old_keyword_fails_a_python_process_that_a_test_starts(counting_dataset):
    """tests/conftest.py: the scripts tests run in child processes are held to the same rule."""
    root = counting_dataset([4])
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(root)], capture_output=True, text=True, timeout=120)
    assert proc.stdout.splitlines() == ["the groups and other deprecations pass"], proc.stderr
    assert proc.returncode == 1 and "DeprecationWarning: ShardedDataset: these keywords are deprecated" in proc.stderr


# A flat ReadOptions field with a bad value, and the group (with the same bad value) that owns its check.
FLAT_CHECKS = [
    pytest.param({"shuffle_buffer": 0}, lambda: SamplingOptions(shuffle_buffer=0), id="shuffle-buffer"),
    pytest.param({"shuffle_block": 0}, lambda: SamplingOptions(shuffle_block=0), id="shuffle-block"),
    pytest.param({"bucket_buffer": 0}, lambda: BatchOptions(bucket_buffer=0), id="bucket-buffer"),
    pytest.param({"samples_per_epoch": -1}, lambda: SamplingOptions(samples_per_epoch=-1), id="samples"),
    pytest.param({"max_member_bytes": -1}, lambda: DecodeOptions(max_member_bytes=-1), id="member-bytes"),
    pytest.param({"on_error": "warn"}, lambda: DecodeOptions(on_error="warn"), id="on-error"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("flat, group", FLAT_CHECKS)
def test_a_flat_record_is_checked_by_its_group_with_the_group_message(flat, group):
    """Each check lives in its group: a ReadOptions made directly with a bad grouped value
    raises the group's own error, word for word (no second copy of the rule or its message)."""
    with pytest.raises(ValueError) as by_group:
        group()
    with pytest.raises(ValueError) as by_flat:
        ReadOptions(batch_size=2, **flat)
    assert str(by_flat.value) == str(by_group.value)
    assert "self." not in str(by_group.value)  # the value, not the code that holds it


@pytest.mark.parametrize(
    "flat, message",
    [
        pytest.param({"batch_size": 0}, "batch_size=0 should be >= 1", id="batch-size"),
        pytest.param(
            {"batch_size": 2, "fields": ("cls",), "map": dict}, "fields=... or map=..., not both", id="fields-map"
        ),
    ],
)
def test_the_flat_record_checks_the_dataset_keywords(flat, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ReadOptions(**flat)


def test_the_groups_of_a_flat_record_build_it_again():
    """``ReadOptions.groups`` is the inverse of ``from_groups``: no field is lost or crossed."""
    opts = ReadOptions(
        batch_size=3,
        shuffle=True,
        seed=9,
        drop_last=True,
        transform=None,
        fields=("cls",),
        collate_fn=list,
        shuffle_buffer=5,
        shuffle_block=2,
        bucket_length=_length,
        bucket_buffer=6,
        on_error="skip",
        allow_pickle=True,
        verify=True,
        check_samples=False,
        samples_per_epoch=15,
        mark_repeats=True,
        max_member_bytes=4096,
    )
    assert all(
        getattr(opts, f.name) != f.default
        for f in dataclasses.fields(ReadOptions)
        if f.name not in ("transform", "map", "batch_size")
    )  # every grouped field off its default
    again = ReadOptions.from_groups(
        batch_size=3, shuffle=True, seed=9, transform=None, fields=("cls",), map=None, **opts.groups()
    )
    assert again == opts
