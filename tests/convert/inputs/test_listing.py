"""The listing scan and its plan, made fast without changing what they give: one pass for
int labels gives what two passes give, each JSON line is read as ``json.loads`` reads it,
and a listing's shards and fingerprint are pinned to the bytes the slower code wrote."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from shardify.convert.inputs import listing_rows
from shardify.convert.inputs.labels import int_labels
from shardify.convert.inputs.listing import scan_listing
from shardify.convert.write import identity
from shardify.convert.write.plan import plan_split
from shardify.convert.write.run import convert_listing
from shardify.errors import InputError, ShardifyError


def _jsonl(*rows: dict[str, object]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


LISTINGS = [
    pytest.param(
        "l.jsonl", _jsonl(*({"id": f"k{i}", "label": i % 3, "text": f"t{i}"} for i in range(9))), id="int-labels"
    ),
    pytest.param(
        "l.jsonl", _jsonl({"id": "a"}, {"id": "b", "label": 1}, {"id": "c", "label": 2}), id="first-row-unlabelled"
    ),
    pytest.param(
        "l.jsonl",
        _jsonl({"id": "a", "label": 1}, {"id": "b"}, {"id": "c", "label": ""}),
        id="unlabelled-and-empty-label",
    ),
    pytest.param("l.jsonl", _jsonl({"id": "a", "text": "x"}, {"id": "b", "score": [1, 2]}), id="no-labels"),
    pytest.param("l.jsonl", _jsonl({"id": "a", "label": "dog"}, {"id": "b", "label": "cat"}), id="label-names"),
    pytest.param("l.jsonl", _jsonl({"id": "a", "label": 1}, {"id": "b", "label": "cat"}), id="ints-then-a-name"),
    pytest.param("l.jsonl", _jsonl({"id": "a", "label": 1}, {"id": "b", "label": 1.5}), id="float-label"),
    pytest.param("l.jsonl", _jsonl({"id": "a", "label": 1}, {"id": "b", "label": True}), id="bool-label"),
    pytest.param(
        "l.jsonl", _jsonl({"id": "a", "label": 1, "split": "b/ad"}, {"id": "b", "label": "x"}), id="bad-split-then-mix"
    ),
    pytest.param(
        "l.jsonl", _jsonl({"id": "a", "label": 1, "Bad": "v"}, {"id": "b", "label": "x"}), id="bad-column-then-name"
    ),
    pytest.param(
        "l.jsonl", _jsonl({"id": "a", "label": 1}, {"id": "b", "label": "x"}) + "{bad\n", id="name-then-bad-json"
    ),
    pytest.param(
        "l.jsonl", _jsonl(*({"id": f"k{i}", "label": i, "split": "ab"[i % 2]} for i in range(6))), id="two-splits"
    ),
    pytest.param("l.csv", "id,label,text\na, 1 ,x\nb,2,\nc,-1,z\n", id="csv-ints"),
    pytest.param("l.csv", "id,label\na,1\nb,cat\n", id="csv-mix"),
]


def _outcome(listing: Path, num_classes: int | None = 3) -> object:
    """Everything a scan gives (samples, classes, skipped rows), or the error it raises."""
    try:
        scans = scan_listing(listing, num_classes=num_classes)
    except ShardifyError as e:
        return type(e).__name__, str(e)
    return {
        split: ([tuple(s) for s in scan.samples], scan.classes, [(p.path, p.reason, p.kind) for p in scan.problems])
        for split, scan in scans.items()
    }


@pytest.mark.parametrize(("name", "text"), LISTINGS)
def test_one_pass_gives_what_two_passes_give(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str
) -> None:
    listing = tmp_path / name
    listing.write_text(text)
    fast = _outcome(listing)
    monkeypatch.setattr(listing_rows, "is_int_label", lambda value: False)  # the one pass gives up at its first label
    assert _outcome(listing) == fast


# Label names: the one pass gives up at the first name, then two passes.
@pytest.mark.parametrize(
    ("rows", "passes"),
    [
        pytest.param([{"id": "a", "label": 1}, {"id": "b", "label": "2"}], 1, id="int-labels"),
        pytest.param([{"id": "a"}, {"id": "b"}], 1, id="no-labels"),
        pytest.param([{"id": "a", "label": "cat"}], 3, id="label-names"),
        pytest.param([{"id": "a"}, {"id": "b", "label": 1}], 3, id="label-after-unlabelled"),
    ],
)
def test_int_labels_read_the_listing_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: list[dict[str, object]], passes: int
) -> None:
    listing = tmp_path / "l.jsonl"
    listing.write_text(_jsonl(*rows))
    opened: list[Path] = []
    rows_of = listing_rows._rows
    monkeypatch.setattr(listing_rows, "_rows", lambda path, fmt: (opened.append(path), rows_of(path, fmt))[1])
    scan_listing(listing)
    assert len(opened) == passes


def _rows_as_json_loads_reads_them(path: Path) -> object:
    """The listing's rows the plain way: ``json.loads`` on each non-blank line."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                return f"line {n}: not valid JSON: {e}"
            if not isinstance(row, dict):
                return f"line {n}: expected a JSON object"
            rows.append((n, {k: v for k, v in row.items() if v is not None}))
    return rows


@pytest.mark.parametrize(
    "line",
    [
        '{"id": "a", "n": [1, {"b": null}]}',
        '  {"id": "a"}  ',
        '\t{"id": "a"}',
        '{"id": "a"}\r',
        '\ufeff{"id": "a"}',
        '{"id": "a"} x',
        '{"id": "a"}{"id": "b"}',
        '{"id": "a",}',
        "[1]",
        "5",
        '"s"',
        '{"id": NaN, "x": -Infinity}',
        '{"id": "a", "id": "b"}',
        "",
        "   ",
        "\x0b",
        '{"id": "\\ud800"}',
        '{"id": "a\u2028b"}',
        '{"label": null, "id": "a"}',
    ],
)
@pytest.mark.parametrize("last", [False, True], ids=["then-a-row", "last-line"])
def test_json_lines_are_read_as_json_loads_reads_them(tmp_path: Path, line: str, last: bool) -> None:
    path = tmp_path / "l.jsonl"
    path.write_text('{"id": "first"}\n' + (line if last else line + '\n{"id": "z"}\n'), encoding="utf-8")
    expected = _rows_as_json_loads_reads_them(path)
    try:
        got: object = list(listing_rows._rows(path, "jsonl"))
    except InputError as e:
        got = str(e).split(": ", 1)[1]  # the message after the file's name
    assert got == expected


def _pinned_listing(tmp_path: Path) -> Path:
    """A listing with each kind of row: plain IDs, IDs rewritten or clashing into hashed keys,
    a path (its mtime fixed), names of every field kind, skipped rows."""
    (tmp_path / "img").mkdir()
    for i, name in enumerate(["a.dat", "b c.txt"]):
        (tmp_path / "img" / name).write_bytes(bytes([65 + i]) * (300 + 400 * i))
        os.utime(tmp_path / "img" / name, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    rows: list[dict[str, object]] = [
        {"id": f"img{i:05d}", "label": (i * 7) % 5, "text": "a photo " * (i % 4)} for i in range(40)
    ]
    rows += [
        {"id": "x/y", "label": 1},
        {"id": "x__y", "label": 2},
        {"id": "we!rd id", "label": 3, "meta": {"k": [1, 2]}},
        {"path": "img/a.dat", "label": 4},
        {"path": "img/b c.txt", "label": 0, "note": "n", "extra": None},
        {"id": "-lead", "label": 1, "score": 0.5},
        {"id": "y" * 100, "label": 2},
        {"id": "nolabel"},
        {"id": "neg", "label": -1},
        {"path": "img/missing.dat", "label": 1},
    ]
    listing = tmp_path / "rows.jsonl"
    listing.write_text(_jsonl(*rows))
    return listing


# Recorded from the converter before the scan and plan were made fast (commit f921fac).
PINNED_SHARDS = "44a9dd47d1d408b5acb81de32877327c136eebd3fbeea8aa3b6c47c4644573b0"
PINNED_FINGERPRINT = "f8debcf5747f952518747aa8f8df63dd566523d97aa7e77aa01e85865b647422"


def test_listing_output_bytes_are_pinned(tmp_path: Path, options, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(identity, "__version__", "pinned")  # the fingerprint, whatever the release
    listing = _pinned_listing(tmp_path)
    plan = plan_split(scan_listing(listing)["train"], options(samples_per_shard=8))
    out = tmp_path / "out"
    convert_listing(listing, out, options=options(samples_per_shard=8))
    index = json.loads((out / "train.json").read_text())
    shards = hashlib.sha256(b"".join((out / s["url"]).read_bytes() for s in index["shardlist"])).hexdigest()
    assert (shards, plan.fingerprint) == (PINNED_SHARDS, PINNED_FINGERPRINT)


@pytest.mark.parametrize(
    ("name", "text"),
    [p for p in LISTINGS if p.values[0].endswith(".jsonl")]
    + [
        pytest.param(
            "l.jsonl", _jsonl({"id": "a", "label": 1}) + "\n\n" + _jsonl({"id": "b", "label": "x"}), id="blank-lines"
        ),
        pytest.param("l.jsonl", '{"id": "a", "label": 1}\r\n{"id": "b"}\r{"id": "c", "label": 2}\n{bad', id="cr-lines"),
        pytest.param(
            "l.jsonl",
            _jsonl(*({"id": f"k{i}", "label": i % 2 if i % 4 else -1, "split": "ab"[i % 3 == 0]} for i in range(30))),
            id="skipped-rows-in-two-splits",
        ),
        pytest.param(
            "l.jsonl",
            _jsonl(*({"id": f"k{i}", "label": f"n{i % 3}"} for i in range(20))) + '{"id": "\xe9"}\n',
            id="names-many-parts",
        ),
    ],
)
@pytest.mark.parametrize("part_bytes", [1, 30, 200])
def test_listing_read_in_parts_by_workers_gives_the_one_process_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str, part_bytes: int
) -> None:
    from shardify.convert.inputs import listing_pool

    listing = tmp_path / name
    listing.write_text(text, encoding="utf-8")
    one = _outcome(listing)
    monkeypatch.setattr(listing_pool, "POOL_MIN_BYTES", 0)
    monkeypatch.setattr(listing_pool, "PART_BYTES", part_bytes)
    parts: list[list[tuple[int, int]]] = []
    part_bounds = listing_pool._part_bounds
    monkeypatch.setattr(listing_pool, "_part_bounds", lambda path: parts.append(part_bounds(path)) or parts[-1])
    assert listing_pool.pooled(listing, "jsonl", 2)
    try:
        scans = scan_listing(listing, num_classes=3, workers=2)
    except ShardifyError as e:
        pooled: object = type(e).__name__, str(e)
    else:
        pooled = {
            split: ([tuple(s) for s in scan.samples], scan.classes, [(p.path, p.reason, p.kind) for p in scan.problems])
            for split, scan in scans.items()
        }
        for scan in scans.values():  # the label counts, kept as the parts came, are the samples'
            assert int_labels(scan) == int_labels(replace(scan, samples=list(scan.samples)))
    assert pooled == one
    assert parts and (part_bytes > 1 or len(parts[0]) == text.count("\n") + (not text.endswith("\n")))  # a line a part
