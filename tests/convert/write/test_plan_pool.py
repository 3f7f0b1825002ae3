"""The plan: its shard bytes are the bytes written, and a big plan made by worker processes
(a chunk of the order each) is the plan made in one, fingerprint included."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from shardify import FORMAT_VERSION, __version__
from shardify.convert.inputs.imagefolder import scan_imagefolder
from shardify.convert.inputs.inputs import SampleSpec, Scan, payload_bytes
from shardify.convert.inputs.listing import scan_listing
from shardify.convert.options import ConvertOptions
from shardify.convert.write import plan as plan_mod
from shardify.convert.write.metadata import sample_meta
from shardify.convert.write.plan import SplitPlan, _sample_bytes, plan_split
from shardify.convert.write.run import convert_scans
from shardify.tarfmt import END_OF_ARCHIVE


def _listing(tmp_path: Path, make_image) -> Path:
    """Rows with files, inline text and JSON, int labels, names that need a hashed key."""
    (tmp_path / "img").mkdir()
    rows = []
    for i in range(23):
        (tmp_path / "img" / f"p{i}.jpg").write_bytes(make_image(seed=i))
        row: dict[str, object] = {"path": f"img/p{i}.jpg", "label": i % 4, "text": "w" * (i * 97)}
        if i % 3 == 0:
            row["id"] = f"odd name {i}.x"
        if i in (4, 5):  # the same candidate key: both get a hash suffix
            row["id"] = "dup/k" if i == 4 else "dup__k"
        if i % 5 == 0:
            row["extra"] = {"n": i}
        rows.append(row)
    listing = tmp_path / "rows.jsonl"
    listing.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return listing


def _scans(tmp_path: Path, make_image, imagefolder: Path) -> dict[str, Scan]:
    return {
        "tree": scan_imagefolder(imagefolder, workers=1),
        "rows": scan_listing(_listing(tmp_path, make_image))["train"],
    }


SHAPES = [
    dict(samples_per_shard=4, shard_size=None),
    dict(samples_per_shard=None, shard_size=4096, min_shards=1),
    dict(samples_per_shard=3, shard_size=8192, min_shards=1, metadata="always"),
    dict(samples_per_shard=1000, shard_size=None, shuffle=False),
]


def _reference(scan: Scan, options: ConvertOptions) -> tuple[str, list[int], list[int]]:
    """The fingerprint and shard sizes as the plan made them one sample at a time, each
    sample's fingerprint input prefixed by its shard's index (the definition)."""
    plan = plan_split(scan, replace(options, workers=1))  # its order and keys
    hasher = hashlib.sha256(
        json.dumps(
            {
                "format_version": FORMAT_VERSION,
                "converter": __version__,
                "source": scan.source,
                "classes": scan.classes,
                "options": options.shaping(),
            },
            sort_keys=True,
        ).encode()
    )
    limit = options.shard_bound(sum(payload_bytes(s) for s in scan.samples))
    sizes, nbytes, count, current = [], [], 0, len(END_OF_ARCHIVE)
    for i in plan.order:
        spec, key = scan.samples[i], plan.keys[i]
        meta = sample_meta(spec, key, options.metadata, tuple(scan.classes))
        size = _sample_bytes(spec, meta)
        if (options.samples_per_shard is not None and count >= options.samples_per_shard) or (
            limit is not None and count and current + size > limit
        ):
            sizes.append(count)
            nbytes.append(current)
            count, current = 0, len(END_OF_ARCHIVE)
        count += 1
        current += size
        hasher.update(f"{len(sizes)}\0{key}\0{spec.label}\0".encode())
        hasher.update(meta if meta is not None else b"\0")
        for f in spec.files:
            hasher.update(f"{f.ext}\0{f.path}\0{f.size}\0{f.mtime_ns}\0".encode("utf-8", "surrogateescape"))
        for ext, data in spec.inline:
            hasher.update(ext.encode() + b"\0" + hashlib.sha256(data).digest())
    sizes.append(count)
    nbytes.append(current)
    return hasher.hexdigest(), sizes, nbytes


def test_the_listing_has_clashing_keys(tmp_path, make_image) -> None:
    keys = plan_split(scan_listing(_listing(tmp_path, make_image))["train"], ConvertOptions(workers=1)).keys
    assert sorted(k for k in keys if k.startswith("dup"))[0].startswith("dup__k-")


def test_assign_keys_refuses_candidates_that_do_not_match_the_names() -> None:
    from shardify.keys import assign_keys, candidate_keys

    names = ["a/b", "a__b", "c d", "e"]
    assert list(
        assign_keys(names, candidates=[candidate_keys(names[:1], names[:1]), candidate_keys(names[1:], names[1:])])
    ) == list(assign_keys(names))
    with pytest.raises(ValueError, match="3 candidates for 4 names"):
        assign_keys(names, candidates=[candidate_keys(names[1:], names[1:])])


def _same(a: SplitPlan, b: SplitPlan) -> None:
    assert (a.fingerprint, a.shard_sizes, a.shard_bytes) == (b.fingerprint, b.shard_sizes, b.shard_bytes)
    assert (list(a.order), list(a.keys)) == (list(b.order), list(b.keys))


@pytest.mark.parametrize("shape", SHAPES)
def test_chunked_plan_equals_the_sample_by_sample_definition(
    tmp_path, make_image, imagefolder, monkeypatch, shape
) -> None:
    for scan in _scans(tmp_path, make_image, imagefolder).values():
        options = ConvertOptions(progress=False, workers=1, **shape)
        want = _reference(scan, options)
        assert want[1] and sum(want[1]) == len(scan.samples)
        for chunk in (1, 2, 3, 5, 1 << 13):  # shards that start inside, at and across chunk borders
            monkeypatch.setattr(plan_mod, "_CHUNK", chunk)
            plan = plan_split(scan, options)
            assert (plan.fingerprint, list(plan.shard_sizes), list(plan.shard_bytes)) == want


@pytest.mark.parametrize("shape", SHAPES)
def test_plan_made_by_worker_processes_equals_the_plan_made_in_one(
    tmp_path, make_image, imagefolder, monkeypatch, spy_pools, shape
) -> None:
    scans = _scans(tmp_path, make_image, imagefolder)
    started = spy_pools(plan_mod)
    monkeypatch.setattr(plan_mod, "_CHUNK", 2)
    for scan in scans.values():
        options = ConvertOptions(progress=False, **shape)
        alone = plan_split(scan, replace(options, workers=2))  # below POOL_MIN_SAMPLES: no pool
        assert started == []
        monkeypatch.setattr(plan_mod, "POOL_MIN_SAMPLES", 0)
        pooled = plan_split(scan, replace(options, workers=2))
        assert started == ["fork", "fork"]  # one pool for the keys, one for sizes and fingerprint
        _same(pooled, alone)
        _same(pooled, plan_split(scan, replace(options, workers=3)))
        started.clear()
        monkeypatch.setattr(plan_mod, "POOL_MIN_SAMPLES", 200_000)


@pytest.mark.parametrize("shape", SHAPES)
def test_planned_shard_bytes_are_the_bytes_written(tmp_path, make_image, imagefolder, options, shape) -> None:
    """Without transcoding or skipped inputs, each planned shard size is its tar file's size."""
    for name, scan in _scans(tmp_path, make_image, imagefolder).items():
        opts = options(**shape)
        plan = plan_split(scan, opts)
        out = tmp_path / f"out-{name}"
        convert_scans({"train": scan}, out, options=opts)
        index = json.loads((out / "train.json").read_text())
        assert [s["filesize"] for s in index["shardlist"]] == list(plan.shard_bytes)
        assert [s["nsamples"] for s in index["shardlist"]] == list(plan.shard_sizes)


def test_sample_column_reads_indices_and_slices():
    """The plan's lazy column of one sample attribute answers ints and slices, as a Sequence does."""
    specs = [SampleSpec(name=f"n{i}", identity=f"id{i}", label=None, label_name=None) for i in range(5)]
    column = plan_mod._Column(specs, "identity", 1, 4)
    assert len(column) == 3 and column[0] == "id1" and column[2] == "id3"
    assert column[1:] == ["id2", "id3"] and column[::2] == ["id1", "id3"]
    with pytest.raises(IndexError):
        column[3]
