"""Format 2: the per-sample ``{key}.json`` only where it keeps something; format 1 still reads."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from shardify.convert.inputs.inputs import SampleSpec, SourceFile
from shardify.convert.write.metadata import _metadata_reference, metadata_json, metadata_needed
from shardify.convert.write.run import convert_listing
from shardify.reader import BatchOptions

CLASSES = ("cat", "dog")


@pytest.mark.parametrize(
    "spec,key,needed",
    [
        pytest.param(SampleSpec("img1", "img1", 3, 3, (), (("txt", b"x"),)), "img1", False, id="id-int-label"),
        pytest.param(SampleSpec("img1", "img1", None, None, (), (("txt", b"x"),)), "img1", False, id="id-no-label"),
        pytest.param(SampleSpec("img1", "img1", 1, "dog", (), ()), "img1", False, id="label-name-in-classes"),
        pytest.param(SampleSpec("img1", "img1", 1, "cow", (), ()), "img1", True, id="label-name-not-in-classes"),
        pytest.param(SampleSpec("a b", "a b", 0, 0, (), ()), "a_b-0123456789", True, id="rewritten-key"),
        pytest.param(
            SampleSpec("cat/x", "cat/x.jpg", 0, "cat", (SourceFile("jpg", "cat/x.jpg", 9, 0, True),), ()),
            "cat__x",
            True,
            id="image-path",
        ),
        pytest.param(
            SampleSpec("x", "x.jpg", 0, 0, (SourceFile("jpg", "x.jpg", 9, 0, True),), ()), "x", True, id="file-path"
        ),
    ],
)
def test_metadata_is_kept_exactly_when_something_would_be_lost(spec, key, needed) -> None:
    assert metadata_needed(spec, key, CLASSES) is needed


def _members(out: Path) -> list[str]:
    index = json.loads((out / "train.json").read_text())
    names: list[str] = []
    for shard in index["shardlist"]:
        with tarfile.open(out / shard["url"]) as tf:
            names += tf.getnames()
    return names


def _listing(tmp_path: Path) -> Path:
    listing = tmp_path / "rows.jsonl"
    listing.write_text(
        "".join(json.dumps({"id": f"s{i}", "label": ["cat", "dog"][i % 2], "text": f"t{i}"}) + "\n" for i in range(7))
    )
    return listing


def test_small_samples_have_no_json_member_and_2048_bytes(tmp_path: Path, options) -> None:
    result = convert_listing(_listing(tmp_path), tmp_path / "auto", options=options(samples_per_shard=100))
    names = _members(tmp_path / "auto")
    assert sorted(n.split(".", 1)[1] for n in names) == ["cls"] * 7 + ["txt"] * 7
    assert result.splits["train"].bytes == 7 * 2048 + 1024
    convert_listing(_listing(tmp_path), tmp_path / "always", options=options(samples_per_shard=100, metadata="always"))
    assert len(_members(tmp_path / "always")) == 21


def test_format_1_dataset_still_reads(tmp_path: Path, options) -> None:
    from shardify.convert.verify import verify_dataset
    from shardify.reader import ShardedDataset

    out = tmp_path / "v1"
    convert_listing(_listing(tmp_path), out, options=options(samples_per_shard=3, metadata="always"))
    for name in ("manifest.json", "train.json"):  # what shardify 0.1 wrote: version 1, a json member each
        text = (out / name).read_text()
        assert '"format_version": 2' in text
        (out / name).write_text(text.replace('"format_version": 2', '"format_version": 1'))
    assert verify_dataset(out).ok
    ds = ShardedDataset(out, batch_size=7, fields=("cls", "txt"), batching=BatchOptions(collate_fn=list))
    (batch,) = list(ds)
    assert sorted(t for _, t in batch) == sorted(f"t{i}" for i in range(7))
    assert ds.source.classes == CLASSES


_NAMES = [
    "a",
    "n01440764/n01440764_10026.JPEG",
    'quote"back\\slash',
    "tab\tnew\nline",
    "caf\u00e9/\u65e5\u672c",
    "emoji\U0001f600",
    "bad\udcffbyte",
    "\x00\x1f\x7f",
    "",
]


@pytest.mark.parametrize("identity", _NAMES)
@pytest.mark.parametrize("label_name", [None, 0, 7, -3, "dog", 'ch\u00e2t "x"', 2**70, 1.5, True])
@pytest.mark.parametrize(
    "files",
    [(), ("same",), (("jpg", "x/a.jpg"),), (("txt", "t\u00e9.txt"), ("jpg", "j.jpg"), ("cls", "c"))]
    + [(("npy", "first.npy"), ("npy", "second.npy"))],
)
def test_metadata_json_is_exactly_what_json_dumps_gives(identity: str, label_name: object, files: tuple) -> None:
    if files == ("same",):
        sources = (SourceFile(ext="jpg", path=identity, size=1, mtime_ns=0, is_image=True),)
    else:
        sources = tuple(SourceFile(ext=e, path=p, size=1, mtime_ns=0, is_image=False) for e, p in files)
    spec = SampleSpec(name="k", identity=identity, label=None, label_name=label_name, files=sources)  # type: ignore[arg-type]
    assert metadata_json(spec) == _metadata_reference(spec)
    assert json.loads(metadata_json(spec))["path"] == identity
