"""Class mapping on a tricky tree, and every kind of bad input: reported, never silently lost."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from PIL import Image

from shardify.convert.inputs.imagefolder import scan_imagefolder
from shardify.convert.inputs.labels import LabelSpace
from shardify.convert.write.run import convert_ids, convert_imagefolder, convert_listing
from shardify.errors import InputError


def _write(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def _report(out: Path, split: str = "train") -> dict[str, tuple[str, str]]:
    lines = (out / f"{split}.report.jsonl").read_text().splitlines()
    return {(r := json.loads(line))["path"]: (r["kind"], r["reason"]) for line in lines}


def test_tricky_tree_class_mapping(tmp_path: Path, make_image) -> None:
    root = _write(
        tmp_path / "src",
        {
            ".ipynb_checkpoints/x.jpg": make_image(),
            "b_class/deep/er/x.JPG": make_image(seed=1),
            "b_class/y.PNG": make_image("PNG", seed=2),
            "b_class/.hidden.jpg": make_image(seed=3),
            "b_class/.cache/z.jpg": make_image(seed=4),
            "b_class/notes.txt": b"not an image",
            "a_class/UPPER.JPEG": make_image(seed=5),
            "a_class/file.Tiff": make_image("TIFF", seed=6),
            "top_level_file.jpg": make_image(seed=7),
        },
    )
    (root / "c_empty").mkdir()
    scan = scan_imagefolder(root)
    # sorted non-hidden folders, like ImageFolder; the empty class keeps its index
    assert scan.classes == ["a_class", "b_class", "c_empty"]
    assert [(s.identity, s.label) for s in scan.samples] == [
        ("a_class/UPPER.JPEG", 0),
        ("a_class/file.Tiff", 0),
        ("b_class/y.PNG", 1),
        ("b_class/deep/er/x.JPG", 1),
    ]
    problems = {p.path: (p.kind, p.reason) for p in scan.problems}
    assert problems[".ipynb_checkpoints"] == ("ignored", "hidden")
    assert problems["b_class/.hidden.jpg"] == ("ignored", "hidden")
    assert problems["b_class/.cache"] == ("ignored", "hidden")
    assert problems["b_class/notes.txt"] == ("ignored", "not an image file (extension)")
    assert problems["top_level_file.jpg"] == ("ignored", "not inside a class folder")
    assert any("c_empty" in n for n in scan.notes)


def test_walk_order_matches_sorted_os_walk(tmp_path: Path, make_image) -> None:
    import os

    root = _write(
        tmp_path / "src",
        {
            f"k/{d}/{f}.jpg": make_image(seed=i)
            for i, (d, f) in enumerate([("a", "2"), ("a", "1"), ("a-b", "0"), ("a/b", "0"), ("b", "9")])
        },
    )
    (root / "k" / "0.jpg").write_bytes(make_image())
    want = [os.path.relpath(os.path.join(r, f), root) for r, _, fs in sorted(os.walk(root / "k")) for f in sorted(fs)]
    assert [s.identity for s in scan_imagefolder(root).samples] == want


def _cmyk_jpeg() -> bytes:
    buf = io.BytesIO()
    Image.new("CMYK", (20, 20), (10, 200, 30, 40)).save(buf, format="JPEG")
    return buf.getvalue()


def test_bad_images_are_skipped_and_reported(tmp_path: Path, make_image, options, read_split) -> None:
    good = make_image(size=(64, 48))
    root = _write(
        tmp_path / "src",
        {
            "c/ok.jpg": good,
            "c/truncated.jpg": good[: len(good) // 2],
            "c/zero.jpg": b"",
            "c/text.jpg": b"this is text, not a jpeg",
            "c/png_named.JPEG": make_image("PNG", seed=1),
            "c/cmyk.jpg": _cmyk_jpeg(),
            "c/gray.jpg": make_image(mode="L", seed=2),
            "c/palette.png": make_image("PNG", mode="P", seed=3),
        },
    )
    out = tmp_path / "out"
    result = convert_imagefolder(root, out, options=options())
    report = _report(out)
    assert report["c/truncated.jpg"] == ("skipped", "truncated jpg (no end marker)")
    assert report["c/zero.jpg"] == ("skipped", "empty file")
    assert report["c/text.jpg"] == ("skipped", "not an image (unknown format)")
    assert result.num_skipped == 3
    samples = {json.loads(s["json"])["path"]: s for s in read_split(out, "train").values()}
    assert set(samples) == {"c/ok.jpg", "c/png_named.JPEG", "c/cmyk.jpg", "c/gray.jpg", "c/palette.png"}
    assert samples["c/png_named.JPEG"]["png"] == (root / "c/png_named.JPEG").read_bytes()
    assert samples["c/cmyk.jpg"]["jpg"] == (root / "c/cmyk.jpg").read_bytes()
    index = json.loads((out / "train.json").read_text())["shardify"]
    assert index["skipped"] == {"empty file": 1, "not an image (unknown format)": 1, "truncated jpg (no end marker)": 1}


def test_full_check_catches_what_the_header_check_cannot(tmp_path: Path, options, make_image) -> None:
    good = make_image(size=(64, 48))
    sos = good.find(b"\xff\xda")
    corrupt = good[: sos + 200] + b"\xff\xc0\x00\x02" + good[sos + 204 :]  # a bogus marker inside the scan
    root = _write(tmp_path / "src", {"c/corrupt.jpg": corrupt, "c/fine.jpg": make_image(seed=3)})
    assert convert_imagefolder(root, tmp_path / "h", options=options()).num_skipped == 0
    full = convert_imagefolder(root, tmp_path / "f", options=options(check="full"))
    assert [(p.path, p.reason.split(":")[0]) for p in full.splits["train"].skipped] == [
        ("c/corrupt.jpg", "cannot decode jpg")
    ]


def test_strict_stops_at_the_first_bad_input(tmp_path: Path, make_image, options) -> None:
    root = _write(tmp_path / "src", {"c/ok.jpg": make_image(), "c/zero.jpg": b""})
    with pytest.raises(InputError, match="zero.jpg.*empty file"):
        convert_imagefolder(root, tmp_path / "out", options=options(strict=True))
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize(
    "name", ["dotted.name.v2.jpg", "with space.jpg", "ünïcødé-名前.jpg", "x" * 200 + ".jpg", "-leading-dash.jpg"]
)
def test_awkward_names_get_valid_unique_keys(tmp_path: Path, make_image, options, read_split, name: str) -> None:
    root = _write(tmp_path / "src", {f"c/{name}": make_image(), "c/plain.jpg": make_image(seed=1)})
    out = tmp_path / "out"
    convert_imagefolder(root, out, options=options())
    samples = read_split(out, "train")
    assert len(samples) == 2
    for key, s in samples.items():
        assert "." not in key and key.isascii() and len(key) <= 80
        for ext in s:
            assert len(f"{key}.{ext}".encode()) <= 100
    assert {json.loads(s["json"])["path"] for s in samples.values()} == {f"c/{name}", "c/plain.jpg"}


def test_same_stem_different_extension_stays_two_samples(tmp_path: Path, make_image, options, read_split) -> None:
    root = _write(tmp_path / "src", {"c/a.jpg": make_image(), "c/a.png": make_image("PNG")})
    convert_imagefolder(root, tmp_path / "out", options=options())
    assert len(read_split(tmp_path / "out", "train")) == 2


def test_ids_missing_label_unknown_id_and_out_of_range(tmp_path: Path, options, read_split) -> None:
    src = tmp_path / "data"
    src.mkdir()
    for i in ("a", "b", "c", "d", "stray"):
        (src / f"{i}.txt").write_text(i)
    (tmp_path / "p.json").write_text(json.dumps({"train": ["a", "b", "c", "nofile"]}))
    (tmp_path / "l.json").write_text(json.dumps({"a": 0, "c": 7, "nofile": 1, "d": 1}))
    out = tmp_path / "out"
    result = convert_ids(
        src, out, partition=tmp_path / "p.json", labels=tmp_path / "l.json", options=options(num_classes=5)
    )
    report = _report(out)
    assert report["b"] == ("skipped", "no label for this ID")
    assert report["c"] == ("skipped", "label 7 out of range (0..4)")
    assert report["nofile"] == ("skipped", "no file nofile.* in the source folder")
    assert report["stray.txt"] == ("ignored", "file of an ID that is in no split")
    assert result.num_skipped == 3
    assert [json.loads(s["json"])["path"] for s in read_split(out, "train").values()] == ["a"]


def test_ids_bad_partition_file_names_the_file(tmp_path: Path, options) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "p.json").write_text("{not json")
    (tmp_path / "l.json").write_text("{}")
    with pytest.raises(InputError, match=r"p\.json.*partition is not valid JSON"):
        convert_ids(
            tmp_path / "data",
            tmp_path / "out",
            partition=tmp_path / "p.json",
            labels=tmp_path / "l.json",
            options=options(),
        )


def test_listing_rows_without_file_or_label(tmp_path: Path, options) -> None:
    (tmp_path / "x.txt").write_text("x")
    listing = tmp_path / "l.jsonl"
    listing.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"path": "x.txt", "label": 1},
                {"path": "missing.txt", "label": 1},
                {"path": "x.txt"},
                {"label": 2},
            ]
        )
        + "\n"
    )
    result = convert_listing(listing, tmp_path / "out", options=options())
    reasons = sorted(p.reason for p in result.splits["train"].skipped)
    assert reasons == [
        "missing.txt: cannot stat: No such file or directory",
        "no label",
        "row has neither 'path' nor 'id'",
    ]


def _tricky_tree(root: Path, make_image) -> Path:
    """Classes with nested folders, hidden and non-image files, links in and out of the
    root, a link loop, a dangling link and an empty class."""
    jpeg = make_image()
    files = {
        f"c{c}/{d}{i}.{ext}": jpeg
        for c in range(5)
        for i in range(3)
        for d, ext in (("", "jpg"), ("sub/", "PNG"), ("sub/deeper/", "JPEG"))
    }
    files |= {
        "c1/.hidden.jpg": jpeg,
        "c2/notes.txt": b"x",
        "c3/.cache/x.jpg": jpeg,
        "top.jpg": jpeg,
        "../outside/o.jpg": jpeg,
    }
    _write(root, files)
    (root / "c0" / "in_link.jpg").symlink_to(root / "c1" / "0.jpg")
    (root / "c0" / "out_link.jpg").symlink_to(root.parent / "outside" / "o.jpg")
    (root / "c2" / "loop").symlink_to(root / "c2")
    (root / "c4" / "dangling.jpg").symlink_to(root / "nothing.jpg")
    (root / "c9_empty").mkdir()
    return root


def test_scan_with_worker_processes_equals_the_scan_in_one(tmp_path: Path, make_image, monkeypatch, spy_pools) -> None:
    """The scan of a big tree runs its class folders in a pool; the result is the same
    samples, payload, problems and notes, in the same order, as in one process."""
    from shardify.convert.inputs import imagefolder
    from shardify.convert.inputs.inputs import SpecTable

    root = _tricky_tree(tmp_path / "src", make_image)
    contexts = spy_pools(imagefolder)
    one = scan_imagefolder(root, workers=1)
    assert contexts == []
    monkeypatch.setattr(imagefolder, "POOL_MIN_FILES", 0)
    pooled = scan_imagefolder(root, workers=2)
    assert len(contexts) == 1  # the pool ran
    assert list(pooled.samples) == list(one.samples) and len(one.samples) == 5 * 9 + 1
    assert (pooled.classes, pooled.problems, pooled.notes) == (one.classes, one.problems, one.notes)
    assert pooled.samples.payload_bytes == one.samples.payload_bytes == SpecTable(one.samples).payload_bytes
    assert {p.reason for p in one.problems} >= {
        "hidden",
        "not an image file (extension)",
        "symbolic link points outside the source root",
        "folder reached twice through symbolic links",
    }
    assert one.notes == ["class 'c9_empty' (label 5) has no images"]
    # the records are what SpecTable.append makes of the same samples
    assert list(SpecTable(one.samples)) == list(one.samples)
    assert [s.identity for s in one.samples][:4] == ["c0/0.jpg", "c0/1.jpg", "c0/2.jpg", "c0/in_link.jpg"]
    spec = one.samples[0]
    assert (spec.name, spec.label, spec.label_name, spec.files[0].ext, spec.files[0].is_image) == (
        "c0/0",
        0,
        "c0",
        "jpg",
        True,
    )


def test_small_trees_are_scanned_without_a_pool(tmp_path: Path, make_image, spy_pools) -> None:
    from shardify.convert.inputs import imagefolder

    root = _tricky_tree(tmp_path / "src", make_image)
    started = spy_pools(imagefolder)
    assert len(scan_imagefolder(root, workers=4).samples) == 46
    assert started == []  # 9 images a class, 6 classes: far below POOL_MIN_FILES


def test_int_label_space_refuses_other_kinds():
    """An int label space resolves ints and decimal strings, and names any other value's kind as a
    ValueError (the reason a scan records) instead of truncating it."""
    space = LabelSpace(classes=(), by_int=True, num_classes=10)
    assert space.resolve(3) == (3, 3) and space.resolve("7") == (7, 7)
    for raw in (2.5, b"3", None):
        with pytest.raises(ValueError, match="should be an int"):
            space.resolve(raw)
