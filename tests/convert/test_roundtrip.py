"""Round trips for each input kind, and the shards read by other tools unmodified."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from shardify.convert.write.run import convert_ids, convert_imagefolder, convert_listing
from shardify.manifest import Manifest


def test_imagefolder_round_trip(imagefolder: Path, tmp_path: Path, options, read_split) -> None:
    out = tmp_path / "out"
    result = convert_imagefolder(imagefolder, out, options=options())
    assert result.num_skipped == 0
    samples = read_split(out, "train")
    assert len(samples) == 10
    index = json.loads((out / "train.json").read_text())
    assert index["shardify"]["classes"] == ["cat", "dog", "emu"]
    by_path = {json.loads(s["json"])["path"]: s for s in samples.values()}
    for rel, want_label in [("cat/c1.jpg", 0), ("cat/sub/c3.png", 0), ("dog/d3.jpeg", 1), ("emu/e2.webp", 2)]:
        s = by_path[rel]
        assert int(s["cls"]) == want_label
        assert json.loads(s["json"])["label"] == ["cat", "dog", "emu"][want_label]
        image = next(v for k, v in s.items() if k not in ("cls", "json"))
        assert image == (imagefolder / rel).read_bytes()
    exts = {k for s in samples.values() for k in s}
    assert exts == {"cls", "json", "jpg", "png", "webp", "bmp"}
    assert Manifest.load(out).splits["train"].samples == 10


def test_ids_round_trip(ids_dataset: dict[str, Path], tmp_path: Path, options, read_split) -> None:
    import io

    import numpy as np
    import torch

    out = tmp_path / "out"
    result = convert_ids(
        ids_dataset["src"], out, partition=ids_dataset["partition"], labels=ids_dataset["labels"], options=options()
    )
    assert set(result.splits) == {"train", "validation"}
    train = read_split(out, "train")
    by_id = {json.loads(s["json"])["path"]: s for s in train.values()}
    assert set(by_id) == {"id0", "id1", "id2", "id3"}
    assert torch.equal(torch.load(io.BytesIO(by_id["id0"]["pt"]), weights_only=True), torch.arange(1))
    assert np.load(io.BytesIO(by_id["id0"]["npy"])).shape == (2, 2)
    assert by_id["id1"]["jpg"] == (ids_dataset["src"] / "id1.jpg").read_bytes()
    assert by_id["id2"]["src.json"] == b'{"extra": 1}'
    assert by_id["id3"]["txt"] == b"hello"
    # string labels get indices by sorted name, the same in every split
    assert [int(by_id[i]["cls"]) for i in ("id0", "id1", "id2", "id3")] == [0, 1, 2, 0]
    assert json.loads(by_id["id1"]["json"])["label"] == "bee"
    assert json.loads(by_id["id2"]["json"])["files"] == {"pt": "id2.pt", "src.json": "id2.json"}
    val = read_split(out, "validation")
    assert sorted(int(s["cls"]) for s in val.values()) == [1, 2]
    assert Manifest.load(out).splits.keys() == {"train", "validation"}


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_listing_round_trip(tmp_path: Path, options, read_split, make_image, fmt: str) -> None:
    src = tmp_path / "src"
    (src / "img").mkdir(parents=True)
    (src / "img" / "a.jpg").write_bytes(make_image(seed=1))
    (src / "img" / "b.png").write_bytes(make_image("PNG", seed=2))
    rows = [
        {"path": "img/a.jpg", "label": "0", "text": "a cat", "split": "train"},
        {"path": "img/b.png", "label": "1", "text": "a dog", "split": "validation"},
        {"id": "only-text", "label": "1", "text": "no file at all", "split": "train"},
    ]
    if fmt == "jsonl":
        listing = src / "list.jsonl"
        listing.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        listing = src / "list.csv"
        lines = ["path,id,label,text,split"] + [
            f"{r.get('path', '')},{r.get('id', '')},{r['label']},{r['text']},{r['split']}" for r in rows
        ]
        listing.write_text("\n".join(lines) + "\n")
    convert_listing(listing, tmp_path / "out", options=options())
    train = read_split(tmp_path / "out", "train")
    by_path = {json.loads(s["json"])["path"] if "json" in s else key: s for key, s in train.items()}
    assert "json" not in train["only-text"], "an ID kept as the key needs no metadata member"
    assert by_path["img/a.jpg"]["jpg"] == (src / "img" / "a.jpg").read_bytes()
    assert by_path["img/a.jpg"]["txt"] == b"a cat"
    assert by_path["only-text"]["txt"] == b"no file at all"
    assert int(by_path["only-text"]["cls"]) == 1
    val = read_split(tmp_path / "out", "validation")
    assert [s["png"] for s in val.values()] == [(src / "img" / "b.png").read_bytes()]


def test_other_tools_read_the_shards(imagefolder: Path, tmp_path: Path, options) -> None:
    wids = pytest.importorskip("wids")
    import webdataset as wds

    out = tmp_path / "out"
    convert_imagefolder(imagefolder, out, options=options())
    index = json.loads((out / "train.json").read_text())
    urls = [str(out / s["url"]) for s in index["shardlist"]]

    names = []
    for url in urls:
        with tarfile.open(url) as tf:
            names += tf.getnames()
    assert len(names) == 30

    via_wds = {s["__key__"]: s for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False)}
    assert len(via_wds) == 10

    ds = wids.ShardListDataset(str(out / "train.json"), cache_dir=str(tmp_path / "cache"), transformations=[])
    assert len(ds) == 10
    via_wids = {ds[i]["__key__"]: ds[i] for i in range(len(ds))}
    assert via_wids.keys() == via_wds.keys()
    for key, s in via_wds.items():
        fields = {k for k in s if not k.startswith("__")}
        assert {f".{k}" for k in fields} == {k for k in via_wids[key] if not k.startswith("__")}
        for k in fields:
            assert via_wids[key][f".{k}"].read() == s[k]


def test_same_output_whatever_the_workers(imagefolder: Path, tmp_path: Path, options, tree_bytes) -> None:
    convert_imagefolder(imagefolder, tmp_path / "w1", options=options(workers=1))
    convert_imagefolder(imagefolder, tmp_path / "w2", options=options(workers=2))
    one, two = tree_bytes(tmp_path / "w1"), tree_bytes(tmp_path / "w2")
    assert one.keys() == two.keys() and one == two
    assert len([k for k in one if k.endswith(".tar")]) == 4


def test_same_output_when_scan_and_plan_run_in_worker_processes(
    imagefolder: Path, tmp_path: Path, options, tree_bytes, monkeypatch, spy_pools
) -> None:
    """The CLI's path with the scan's and the plan's pools (a big input's) writes the bytes
    of the path without them."""
    from shardify.convert.inputs import imagefolder as scan_mod
    from shardify.convert.write import plan as plan_mod

    convert_imagefolder(imagefolder, tmp_path / "w1", options=options(workers=1))
    monkeypatch.setattr(scan_mod, "POOL_MIN_FILES", 0)
    monkeypatch.setattr(plan_mod, "POOL_MIN_SAMPLES", 0)
    monkeypatch.setattr(plan_mod, "_CHUNK", 3)
    scans, plans = spy_pools(scan_mod), spy_pools(plan_mod)
    convert_imagefolder(imagefolder, tmp_path / "w2", options=options(workers=2))
    assert (len(scans), len(plans)) == (1, 2)  # the scan's pool, the plan's two
    assert tree_bytes(tmp_path / "w1") == tree_bytes(tmp_path / "w2")


def test_seed_changes_order_no_shuffle_keeps_it(imagefolder: Path, tmp_path: Path, options, read_split) -> None:
    def order(name: str, **kw) -> list[str]:
        convert_imagefolder(imagefolder, tmp_path / name, options=options(**kw))
        return [json.loads(s["json"])["path"] for s in read_split(tmp_path / name, "train").values()]

    a, b, plain = order("a", seed=0), order("b", seed=1), order("p", shuffle=False)
    assert sorted(a) == sorted(b) == sorted(plain) and a != b
    assert plain == [
        "cat/c1.jpg",
        "cat/c2.JPEG",
        "cat/sub/c3.png",
        "dog/d1.jpg",
        "dog/d2.jpg",
        "dog/d3.jpeg",
        "emu/e1.jpg",
        "emu/e2.webp",
        "emu/e3.bmp",
        "emu/e4.jpg",
    ]


def test_shard_size_bound(tmp_path: Path, imagefolder: Path, options) -> None:
    out = tmp_path / "out"
    convert_imagefolder(imagefolder, out, options=options(samples_per_shard=None, shard_size=16_000))
    index = json.loads((out / "train.json").read_text())
    sizes = [s["filesize"] for s in index["shardlist"]]
    biggest_sample = max(p.stat().st_size for p in imagefolder.rglob("*.*")) + 4 * 512 + 1024
    assert all(s <= 16_000 or s <= biggest_sample for s in sizes)
    assert [s["filesize"] for s in index["shardlist"]] == [(out / s["url"]).stat().st_size for s in index["shardlist"]]
    assert sum(s["nsamples"] for s in index["shardlist"]) == 10


def test_max_side_downscales_large_images_only(tmp_path: Path, options, read_split, make_image) -> None:
    import io

    from PIL import Image

    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    (src / "big.png").write_bytes(make_image("PNG", size=(400, 100), seed=1))
    (src / "small.png").write_bytes(make_image("PNG", size=(60, 40), seed=2))
    (src / "cmyk.jpg").write_bytes(make_image(mode="CMYK", size=(300, 300), seed=3))
    outs = []
    for name in ("a", "b"):
        convert_imagefolder(src.parent, tmp_path / name, options=options(max_side=128, quality=80))
        outs.append({json.loads(s["json"])["path"]: s for s in read_split(tmp_path / name, "train").values()})
    got = outs[0]
    big = Image.open(io.BytesIO(got["c/big.png"]["jpg"]))
    assert (big.format, big.size, big.mode) == ("JPEG", (128, 32), "RGB")
    cmyk = Image.open(io.BytesIO(got["c/cmyk.jpg"]["jpg"]))
    assert (cmyk.size, cmyk.mode) == ((128, 128), "RGB")
    assert got["c/small.png"]["png"] == (src / "small.png").read_bytes()
    assert outs[0] == outs[1]  # re-encoding is deterministic
    options_recorded = json.loads((tmp_path / "a" / "train.json").read_text())["shardify"]["converter"]["options"]
    assert (options_recorded["max_side"], options_recorded["quality"]) == (128, 80)
