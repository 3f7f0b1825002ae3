"""How ``convert_tokens`` hands documents to the writer: a chunked split takes each document's
``.npy`` as is (no tar member built per document and parsed back), with the same bytes as the
framed way; trusted ids are packed per document with the bytes numpy would store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shardify.convert import convert_tokens
from shardify.convert.pyapi import tokens as tokens_module
from shardify.convert.pyapi.itemchunks import ItemChunk
from shardify.convert.pyapi.pywriter import KeyRegistry
from shardify.convert.pyapi.tokens import TOKENS_FIELD, Tokenizer, TokenRunner
from shardify.convert.write import tarwrite
from shardify.npy import npy_header
from shardify.tarfmt import BLOCK

tokenizers = pytest.importorskip("tokenizers")

FAST = {"fsync": False, "progress": False}
WORDS = "the a cat dog sat on mat and ran far away".split()


def _texts(n: int) -> list[str]:
    rng = np.random.default_rng(3)
    return [" ".join(rng.choice([*WORDS, "zebra"], size=int(rng.integers(1, 120)))) for _ in range(n)]


@pytest.fixture
def tokenizer_json(tmp_path: Path) -> Path:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    tok = HFTokenizer(models.WordLevel({"[UNK]": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


def _framed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every TokenRunner frame its documents as tar members, as before the unframed way."""
    real = TokenRunner.__init__

    def init(self: TokenRunner, *args: object, **kwargs: object) -> None:
        real(self, *args, **kwargs)  # type: ignore[arg-type]
        self.unframed = None

    monkeypatch.setattr(TokenRunner, "__init__", init)


@pytest.mark.parametrize("workers", [1, 2])
def test_unframed_documents_make_the_same_shards_as_framed_ones(
    tmp_path: Path, tokenizer_json: Path, tree_bytes, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """Shards cut by a byte bound (which counts each document's per-sample tar bytes) and by
    count, chunks cut by shards, bad rows in between: the same bytes either way."""
    texts: list[object] = [*_texts(70), "", 5, *_texts(90)]
    opts = dict(tokenizer=tokenizer_json, eos=0, shard_size=20_000, chunk=8, chunk_size=16, workers=workers, **FAST)
    unframed = convert_tokens(texts, tmp_path / "unframed", **opts)
    with monkeypatch.context() as m:
        _framed(m)
        framed = convert_tokens(texts, tmp_path / "framed", **opts)
    assert unframed.samples == framed.samples == 160 and len(unframed.skipped) == 2
    assert len(list((tmp_path / "framed").glob("train-*.tar"))) >= 3  # the byte bound cut shards
    assert tree_bytes(tmp_path / "unframed") == tree_bytes(tmp_path / "framed")


def test_a_chunked_token_split_builds_no_tar_member_per_document(
    tmp_path: Path, tokenizer_json: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per document: no tar header, no parsing one back, no key kept to refuse duplicates
    (a key is its row's index, unique by construction)."""
    calls = {"header": 0, "split": 0, "keys": 0}
    real_header, real_split = tokens_module.ustar_header, tarwrite.split_members

    def header(name: str, size: int) -> bytes:
        calls["header"] += 1
        return real_header(name, size)

    def split(*args: object) -> object:
        calls["split"] += 1
        return real_split(*args)  # type: ignore[arg-type]

    def add(self: KeyRegistry, key: str, index: int) -> None:
        calls["keys"] += 1

    monkeypatch.setattr(tokens_module, "ustar_header", header)
    monkeypatch.setattr("shardify.convert.write.shardstream.split_members", split)
    monkeypatch.setattr(KeyRegistry, "add", add)
    convert_tokens(_texts(40), tmp_path / "chunked", tokenizer=tokenizer_json, chunk=16, workers=1, **FAST)
    assert calls == {"header": 0, "split": 0, "keys": 0}
    convert_tokens(_texts(40), tmp_path / "per-sample", tokenizer=tokenizer_json, chunk=None, workers=1, **FAST)
    assert calls["header"] == 40  # the per-sample layout frames each document here, once


@pytest.mark.parametrize("dtype, eos", [("uint16", None), ("uint16", 3), ("uint32", None), ("uint32", 70_000)])
@pytest.mark.parametrize("framed", [False, True])
def test_trusted_ids_are_packed_as_numpy_stores_them(dtype: str, eos: int | None, framed: bool) -> None:
    """Every length (the packers and headers are kept by length), both id widths, with and
    without EOS: each document's bytes are the ``.npy`` numpy's little-endian array makes."""
    wide = dtype == "uint32"
    docs = [[(7 * i + j) % 1000 + (66_000 if wide and j % 2 else 0) for j in range(1 + i % 37)] for i in range(90)]
    runner = TokenRunner(
        Tokenizer(fn=lambda text: docs[int(text)]), dtype=dtype, limit=1 << 32, eos=eos, check=False, framed=framed
    )
    runner.tokenizer.encode = lambda texts: [docs[int(t)] for t in texts]  # type: ignore[method-assign]
    outcomes, parts = runner.run(ItemChunk(start=0, indexes=tuple(range(90)), items=tuple(map(str, range(90)))))
    data, at = b"".join(parts), 0
    for i, got in enumerate(outcomes):
        ids = np.asarray(docs[i] + ([] if eos is None else [eos]), dtype=np.dtype(dtype).newbyteorder("<"))
        npy = npy_header(repr(ids.dtype.str), ids.shape) + ids.tobytes()
        assert (got.key, got.fields, got.tokens) == (f"{i:09d}", (TOKENS_FIELD,), ids.size)
        member = data[at : at + got.size]
        assert (member[BLOCK : BLOCK + len(npy)] if framed else member) == npy
        at += got.size
    assert at == len(data)
