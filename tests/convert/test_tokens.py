"""convert_tokens: texts in, the tokenizer's ids out, one document per sample, lengths in the index."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shardify.cli import EXIT_OK, EXIT_SKIPPED, main
from shardify.convert import TokenOptions, convert_tokens
from shardify.convert.pyapi.tokens import token_dtype
from shardify.errors import InputError
from shardify.manifest import Manifest, SplitIndex

tokenizers = pytest.importorskip("tokenizers")

FAST = {"fsync": False, "progress": False}
WORDS = "the a cat dog sat on mat and ran far away".split()


def _texts(n: int) -> list[str]:
    """Deterministic texts of 1..40 words (some words outside the vocabulary)."""
    rng = np.random.default_rng(7)
    return [" ".join(rng.choice([*WORDS, "zebra"], size=int(rng.integers(1, 40)))) for _ in range(n)]


@pytest.fixture
def tokenizer_json(tmp_path: Path) -> Path:
    """A word-level tokenizer built offline: [UNK]=0, [EOS]=1, then the words."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "[EOS]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


def _encode(path: Path, texts: list[object]) -> list[list[int]]:
    tok = tokenizers.Tokenizer.from_file(str(path))
    return [tok.encode(t).ids for t in texts]


def _write(tmp_path: Path, rows: list[object], fmt: str, column: str = "text") -> Path:
    if fmt == "jsonl":
        path = tmp_path / "rows.jsonl"
        path.write_text("".join(json.dumps({column: r, "id": i}) + "\n" for i, r in enumerate(rows)))
        return path
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({column: rows, "id": list(range(len(rows)))}), str(path), row_group_size=37)
    return path


def _index(out: Path, split: str = "train") -> SplitIndex:
    return Manifest.load(out).load_split(out, split)


def _stored(out: Path, split: str = "train") -> dict[str, np.ndarray]:
    """Each document's token array by key, read back with ShardedDataset (one document per sample)."""
    from shardify.reader import BatchOptions, ShardedDataset

    ds = ShardedDataset(
        str(out),
        split=split,
        batch_size=16,
        map=lambda s: (s["__key__"], s["tokens.npy"]),
        batching=BatchOptions(collate_fn=list),
    )
    return dict(pair for batch in ds for pair in batch)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
@pytest.mark.parametrize("workers", [1, 2])
def test_stored_arrays_are_the_tokenizers_ids_in_order_with_lengths_in_the_index(
    tmp_path: Path, tokenizer_json: Path, fmt: str, workers: int
) -> None:
    texts = _texts(300)
    src = _write(tmp_path, texts, fmt, column="body")
    out = tmp_path / "out"
    summary = convert_tokens(
        src, out, tokenizer=tokenizer_json, column="body", workers=workers, samples_per_shard=70, chunk_size=16, **FAST
    )
    assert summary.samples == 300 and summary.shards == 5 and not summary.skipped
    expected = _encode(tokenizer_json, texts)
    stored = _stored(out)
    assert sorted(stored) == [f"{i:09d}" for i in range(300)]
    for i, ids in enumerate(expected):
        got = stored[f"{i:09d}"]
        assert got.dtype == np.uint16 and got.tolist() == ids
    index = _index(out)
    lengths = np.concatenate([np.frombuffer(s.tokens, "<u4") for s in index.shards])
    assert lengths.tolist() == [len(ids) for ids in expected]
    assert index.tokens is not None and index.tokens.to_json() == {
        "field": "tokens.npy",
        "dtype": "uint16",
        "vocab_size": len(WORDS) + 2,
        "eos": None,
    }
    assert index.chunk == 256  # the chunked layout by default
    assert main(["verify", str(out)]) == EXIT_OK


def test_eos_is_appended_and_counted(tmp_path: Path, tokenizer_json: Path) -> None:
    texts = _texts(40)
    out = tmp_path / "out"
    convert_tokens(texts, out, tokenizer=tokenizer_json, eos=1, workers=1, **FAST)
    stored = _stored(out)
    for i, ids in enumerate(_encode(tokenizer_json, texts)):
        assert stored[f"{i:09d}"].tolist() == [*ids, 1]
    index = _index(out)
    assert np.frombuffer(index.shards[0].tokens, "<u4").tolist() == [
        len(ids) + 1 for ids in _encode(tokenizer_json, texts)
    ]
    assert index.tokens is not None and index.tokens.eos == 1
    with pytest.raises(ValueError, match="eos=20 should be below the tokenizer's vocabulary size 13"):
        convert_tokens(texts, tmp_path / "bad", tokenizer=tokenizer_json, eos=20, **FAST)


def _wide(text: str) -> list[int]:
    """A callable tokenizer with ids above uint16: one id per word, from its letters."""
    return [69_000 + sum(map(ord, w)) % 1000 for w in text.split()]


def test_ids_above_uint16_are_stored_as_uint32(tmp_path: Path) -> None:
    texts = _texts(50)
    for name, vocab in (("sized", 70_000), ("unsized", None)):
        out = tmp_path / name
        convert_tokens(texts, out, tokenizer=_wide, vocab_size=vocab, workers=2, chunk_size=8, **FAST)
        stored = _stored(out)
        for i, text in enumerate(texts):
            got = stored[f"{i:09d}"]
            assert got.dtype == np.uint32 and got.tolist() == _wide(text)
        index = _index(out)
        assert index.tokens is not None and (index.tokens.dtype, index.tokens.vocab_size) == ("uint32", vocab)
    assert [token_dtype(v, e) for v, e in ((65_536, None), (65_537, None), (100, 65_536), (None, None))] == [
        "uint16",
        "uint32",
        "uint32",
        "uint32",
    ]


def _picky(text: str) -> list[int]:
    if "boom" in text:
        raise RuntimeError("cannot tokenize boom")
    if "huge" in text:
        return [5, 10**6]
    return [len(w) for w in text.split()]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_bad_rows_are_reported_and_counted_never_dropped(tmp_path: Path, fmt: str) -> None:
    good = ["a bb ccc", "dd e", "f"]
    rows: list[object] = [good[0], 7, "", good[1], "boom here", "   ", "a huge id", good[2]]
    if fmt == "parquet":
        rows[1] = None  # a Parquet column has one type: its nulls are the non-text rows
    src = _write(tmp_path, rows, fmt)
    out = tmp_path / "out"
    summary = convert_tokens(src, out, tokenizer=_picky, vocab_size=1000, workers=2, chunk_size=3, **FAST)
    assert summary.samples == 3
    report = [json.loads(line) for line in (out / "train.report.jsonl").read_text().splitlines()]
    reasons = {r["path"].split(":")[0]: r["reason"] for r in report}
    assert reasons == {
        "row 1": "not text: a int" if fmt == "jsonl" else "not text: a NoneType",
        "row 2": "empty text",
        "row 4": "tokenizer raised RuntimeError: cannot tokenize boom",
        "row 5": "no tokens",
        "row 6": "tokenizer returned token id 1000000, outside 0..999",
    }
    assert sum(_index(out).skipped.values()) == 5 == len(summary.skipped)
    stored = _stored(out)
    assert {k: v.tolist() for k, v in stored.items()} == {"000000000": [1, 2, 3], "000000003": [2, 1], "000000007": [1]}
    with pytest.raises(InputError, match="row 1"):
        convert_tokens(src, tmp_path / "strict", tokenizer=_picky, strict=True, **FAST)


def test_jsonl_rows_without_the_column_are_reported(tmp_path: Path, tokenizer_json: Path) -> None:
    src = tmp_path / "rows.jsonl"
    src.write_text('{"text": "the cat"}\n{"other": 1}\n[1, 2]\n{"text": "a dog"}\n')
    summary = convert_tokens(src, tmp_path / "out", tokenizer=tokenizer_json, **FAST)
    assert summary.samples == 2
    assert [(p.path, p.reason) for p in summary.skipped] == [
        ("row 1: <no text>", "row has no column 'text'"),
        ("row 2: <no text>", "row is a JSON list, not an object with a 'text' column"),
    ]


def test_two_conversions_are_byte_identical_whatever_the_workers(
    tmp_path: Path, tokenizer_json: Path, tree_bytes
) -> None:
    texts = _texts(200)
    opts = dict(tokenizer=tokenizer_json, eos=1, samples_per_shard=64, chunk=16, chunk_size=8, **FAST)
    for name, workers in (("a", 1), ("b", 1), ("c", 2)):
        convert_tokens(texts, tmp_path / name, workers=workers, **opts)
    assert tree_bytes(tmp_path / "a") == tree_bytes(tmp_path / "b") == tree_bytes(tmp_path / "c")


def _interrupt_at(n: int):
    def tokenize(text: str) -> list[int]:
        if text == f"text {n}":
            raise KeyboardInterrupt
        return [int(w) % 500 for w in text.split()[1:]] + [7] * (len(text) % 5)

    return tokenize


def test_resume_after_an_interruption_reuses_shards_and_ends_byte_identical(tmp_path: Path, tree_bytes) -> None:
    texts = [f"text {i}" for i in range(60)]
    opts = dict(vocab_size=1000, samples_per_shard=8, chunk=4, chunk_size=4, workers=1, **FAST)
    convert_tokens(texts, tmp_path / "ref", tokenizer=_interrupt_at(-1), **opts)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        convert_tokens(texts, out, tokenizer=_interrupt_at(45), **opts)
    assert not (out / "manifest.json").exists() and len(list(out.glob("train-*.tar"))) == 5
    summary = convert_tokens(texts, out, tokenizer=_interrupt_at(-1), **opts)
    assert summary.reused_shards == 5
    assert tree_bytes(out) == tree_bytes(tmp_path / "ref")
    lengths = np.concatenate([np.frombuffer(s.tokens, "<u4") for s in _index(out).shards])
    assert lengths.tolist() == [len(_interrupt_at(-1)(t)) for t in texts]


def test_cli_converts_verifies_and_shows_the_tokens(tmp_path: Path, tokenizer_json: Path, capsys) -> None:
    texts = [*_texts(30), ""]
    src = _write(tmp_path, texts, "jsonl")
    out = tmp_path / "out"
    argv = ["convert", "tokens", str(src), str(out), "--tokenizer", str(tokenizer_json), "--eos", "1", "--quiet"]
    assert main([*argv, "--workers", "1"]) == EXIT_SKIPPED  # the empty row
    assert "skipped row 30: '': empty text" in capsys.readouterr().err
    assert main(["verify", str(out)]) == EXIT_OK
    assert main(["info", str(out)]) == EXIT_OK
    total = sum(len(ids) + 1 for ids in _encode(tokenizer_json, texts[:30]))
    assert f"tokens: {total:,} in 30 documents (uint16, vocabulary 13, end-of-document id 1)" in capsys.readouterr().out


def test_options_check_their_values() -> None:
    with pytest.raises(ValueError, match="eos=-1"):
        TokenOptions(eos=-1)
    with pytest.raises(ValueError, match="eos=5 should be below vocab_size=5"):
        TokenOptions(eos=5, vocab_size=5)
    with pytest.raises(TypeError, match="tokenizer should be"):
        convert_tokens(["a"], "unused", tokenizer=3)


def test_cli_takes_a_function_as_tokenizer(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "mytok.py").write_text("def encode(text):\n    return [len(w) for w in text.split()]\n")
    monkeypatch.chdir(tmp_path)
    src = _write(tmp_path, ["a bb", "ccc"], "jsonl")
    argv = ["convert", "tokens", str(src), "out", "--tokenizer", "mytok:encode", "--vocab-size", "100", "--quiet"]
    assert main(argv) == EXIT_OK
    assert {k: v.tolist() for k, v in _stored(tmp_path / "out").items()} == {"000000000": [1, 2], "000000001": [3]}
    assert main(["convert", "tokens", str(src), "out2", "--tokenizer", "nosuchmodule:encode", "--quiet"]) != EXIT_OK


def test_item_limits_run_the_same_tokenizer_in_supervised_workers(tmp_path: Path, tokenizer_json: Path) -> None:
    texts = [*_texts(30), ""]
    plain = convert_tokens(texts, tmp_path / "plain", tokenizer=tokenizer_json, workers=1, **FAST)
    limited = convert_tokens(texts, tmp_path / "limited", tokenizer=tokenizer_json, item_timeout=60, workers=2, **FAST)
    assert (plain.samples, len(plain.skipped)) == (limited.samples, len(limited.skipped)) == (30, 1)
    a, b = _stored(tmp_path / "plain"), _stored(tmp_path / "limited")
    assert a.keys() == b.keys() and all(a[k].tolist() == b[k].tolist() for k in a)


def test_the_tokenizer_travels_by_pickle_without_its_loaded_state(tokenizer_json: Path) -> None:
    import pickle

    from shardify.convert.pyapi.tokens import Tokenizer

    tok = Tokenizer.of(tokenizer_json)
    assert tok.load() is not None  # loaded here (to check the file) ...
    copy = pickle.loads(pickle.dumps(tok))
    assert copy._hf is None  # ... but a worker (spawn, Ray) loads its own, once
    texts = _texts(5)
    assert copy.encode(texts) == tok.encode(texts) == _encode(tokenizer_json, texts)


def test_ray_engine_gives_the_same_bytes(tmp_path: Path, tokenizer_json: Path, tree_bytes) -> None:
    ray = pytest.importorskip("ray")
    texts = [*_texts(60), 3, ""]
    opts = dict(tokenizer=tokenizer_json, eos=1, samples_per_shard=16, chunk=4, chunk_size=8, **FAST)
    local = convert_tokens(texts, tmp_path / "local", workers=1, **opts)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        on_ray = convert_tokens(texts, tmp_path / "ray", engine="ray", workers=2, **opts)
    finally:
        ray.shutdown()
    assert on_ray.samples == local.samples == 60 and len(on_ray.skipped) == 2
    assert tree_bytes(tmp_path / "ray") == tree_bytes(tmp_path / "local")


def test_verify_checks_each_document_against_its_recorded_length(
    tmp_path: Path, tokenizer_json: Path, monkeypatch, capsys
) -> None:
    from shardify.convert.pyapi.tokens import TokenRunner

    real = TokenRunner._member

    def one_long(self, index, data, tokens, parts):  # noqa: ANN001, ANN202 - a converter that records a wrong length
        return real(self, index, data, tokens + (index == 7), parts)

    monkeypatch.setattr(TokenRunner, "_member", one_long)
    convert_tokens(_texts(20), tmp_path / "out", tokenizer=tokenizer_json, workers=1, **FAST)
    assert main(["verify", str(tmp_path / "out")]) == EXIT_SKIPPED
    out = capsys.readouterr().out
    assert "000000007" in out and "field 'tokens.npy': holds uint16" in out and out.count("the index says") == 1


def test_missing_optional_packages_are_named_with_the_install_line(
    tmp_path: Path, tokenizer_json: Path, monkeypatch
) -> None:
    src = _write(tmp_path, ["the cat"], "parquet")
    monkeypatch.setitem(__import__("sys").modules, "pyarrow.parquet", None)
    with pytest.raises(InputError, match=r"reading Parquet needs pyarrow: pip install pyarrow") as e:
        convert_tokens(src, tmp_path / "a", tokenizer=len, **FAST)
    assert e.value.__cause__ is not None and str(src) in str(e.value)
    monkeypatch.setitem(__import__("sys").modules, "tokenizers", None)
    with pytest.raises(InputError, match=r"pip install 'shardify\[tokens\]'"):
        convert_tokens(["the cat"], tmp_path / "b", tokenizer=tokenizer_json, **FAST)


def test_wids_opens_a_token_split_with_its_extra_index_fields(tmp_path: Path, tokenizer_json: Path) -> None:
    wids = pytest.importorskip("wids")
    out = tmp_path / "out"
    texts = _texts(20)
    convert_tokens(texts, out, tokenizer=tokenizer_json, chunk=None, workers=1, **FAST)  # one tar sample each
    ds = wids.ShardListDataset(str(out / "train.json"), cache_dir=str(tmp_path / "cache"), transformations=[])
    assert len(ds) == 20
    assert np.load(ds[3][".tokens.npy"]).tolist() == _encode(tokenizer_json, texts)[3]  # wids gives a file object


@pytest.mark.parametrize("eos", [None, 1])
def test_trusted_ids_make_the_same_bytes_as_checked_ids(
    tmp_path: Path, tokenizer_json: Path, tree_bytes, eos: int | None
) -> None:
    """A tokenizer's ids go through the chunk-wide conversion; ids given a vocabulary to check
    against go through the per-document one: the same shards, bad rows in the same places."""
    texts: list[object] = [*_texts(30), "", 5, "   ", *_texts(12)]
    opts = dict(tokenizer=tokenizer_json, eos=eos, samples_per_shard=16, chunk_size=8, workers=1, **FAST)
    trusted = convert_tokens(texts, tmp_path / "trusted", **opts)
    checked = convert_tokens(texts, tmp_path / "checked", vocab_size=len(WORDS) + 2, **opts)
    assert trusted.samples == checked.samples == 42 and len(trusted.skipped) == len(checked.skipped) == 3
    # the names and manifests differ (vocab_size is in the options' digest), the shards' bytes not
    shards = [
        sorted(b for n, b in tree_bytes(tmp_path / run).items() if n.endswith(".tar")) for run in ("trusted", "checked")
    ]
    assert shards[0] == shards[1] and len(shards[0]) == 3
