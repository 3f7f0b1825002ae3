"""Reading a token split's bytes: damage named by shard and key, and ranged reads over HTTP."""

from __future__ import annotations

import json
import shutil
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rangeserver  # tools/rangeserver.py (pytest's pythonpath holds tools/)
import torch

from shardify.convert import convert_tokens
from shardify.errors import SampleChecksumError, ShardFormatError
from shardify.reader import CacheOptions, TokenDataset, TokenLoader
from shardify.reader.tokens.shards import TokenShards
from shardify.remote import RetryPolicy


def tokenize(text: str) -> list[int]:
    return [int(w) for w in text.split()]


def _split(tmp: Path, chunk: int | None) -> tuple[Path, list[int]]:
    rng = np.random.default_rng(3)
    docs = [rng.integers(2, 60000, size=int(rng.integers(1, 50))).tolist() for _ in range(120)]
    src = tmp / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": " ".join(map(str, d))}) + "\n" for d in docs))
    out = tmp / "ds"
    convert_tokens(
        src, out, tokenizer=tokenize, vocab_size=60000, eos=1, chunk=chunk, samples_per_shard=50,
        fsync=False, progress=False, workers=1,
    )  # fmt: skip
    return out, [t for d in docs for t in [*d, 1]]


def _real(ds: TokenDataset) -> list[int]:
    out: list[int] = []
    for b in ds:
        for row, n in zip(b["input_ids"], b["num_tokens"]):
            out += row[: int(n)].tolist()
    return out


def _member(shard: Path, name: str) -> int:
    """Where the data of member ``name`` of ``shard`` begins."""
    with tarfile.open(shard) as tar:
        return tar.getmember(name).offset_data


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_changed_token_of_a_per_sample_split_names_shard_and_key(tmp_path: Path) -> None:
    root, _ = _split(tmp_path, None)
    shard = sorted(root.glob("train-*.tar"))[1]
    _flip(shard, _member(shard, "000000060.tokens.npy") + 128 + 1)  # a token, not the header
    with pytest.raises(SampleChecksumError) as e:
        _real(TokenDataset(root, seq_len=16, batch_size=4))
    assert e.value.shard == str(shard) and e.value.key == "000000060"


@pytest.mark.parametrize(
    ("where", "message"),
    [(24 + 8, "damaged chunk"), (24 + 8 * 9 + 3, "header is not that of")],
    ids=["table", "document-header"],
)
def test_a_damaged_chunk_names_shard_and_key(tmp_path: Path, where: int, message: str) -> None:
    root, _ = _split(tmp_path, 8)
    shard = sorted(root.glob("train-*.tar"))[1]
    _flip(shard, _member(shard, "000000058.tokens.npy") + where)  # chunk 1 of shard 1: keys 58..65
    with pytest.raises(ShardFormatError, match=message) as e:
        _real(TokenDataset(root, seq_len=16, batch_size=4))
    assert e.value.shard == str(shard) and e.value.key == "000000058"


def test_a_truncated_shard_names_it(tmp_path: Path) -> None:
    root, _ = _split(tmp_path, 8)
    shard = sorted(root.glob("train-*.tar"))[2]
    shard.write_bytes(shard.read_bytes()[:2000])
    with pytest.raises(ShardFormatError) as e:
        _real(TokenDataset(root, seq_len=16, batch_size=4))
    assert e.value.shard == str(shard)


@pytest.mark.parametrize("chunk", [8, None], ids=["chunked", "per-sample"])
def test_over_http_every_token_once_by_ranges(tmp_path: Path, chunk: int | None) -> None:
    root, stream = _split(tmp_path, chunk)
    www = tmp_path / "www"
    shutil.copytree(root, www / "ds")
    shards = sum(p.stat().st_size for p in root.glob("train-*.tar"))
    fast = CacheOptions(retry=RetryPolicy(retries=1, backoff_s=0.01))
    with rangeserver.serve(www) as (base, behaviour):
        ds = TokenDataset(f"{base}/ds", seq_len=64, batch_size=4, cache=fast)
        behaviour.reset()
        batches = list(ds)
        sent = {Path(p).name: n for p, n in behaviour.sent_by_path.items() if p.endswith(".tar")}
        in_workers = list(TokenLoader(TokenDataset(f"{base}/ds", seq_len=64, batch_size=4, cache=fast), num_workers=2))
    got = [t for b in batches for row, n in zip(b["input_ids"], b["num_tokens"]) for t in row[: int(n)].tolist()]
    assert Counter(got) == Counter(stream)
    assert [b["input_ids"].tolist() for b in in_workers] == [b["input_ids"].tolist() for b in batches]
    assert all(b["input_ids"].dtype == torch.int64 for b in batches)
    if chunk is not None:  # tokens and the headers between them; never a whole shard
        assert sum(sent.values()) < shards
        assert all(sent[p.name] < p.stat().st_size for p in root.glob("train-*.tar"))


def test_verify_catches_a_token_changed_in_a_chunked_split(tmp_path: Path) -> None:
    root, stream = _split(tmp_path, 8)
    shard = sorted(root.glob("train-*.tar"))[1]
    # the first token of document 58, the first of chunk 1 of shard 1: past the member's table
    # (24 bytes and 9 ends) and the document's 128-byte .npy header
    at = _member(shard, "000000058.tokens.npy") + 24 + 8 * 9 + 128
    _flip(shard, at)
    got = _real(TokenDataset(root, seq_len=16, batch_size=4))
    assert Counter(got) != Counter(stream)  # the chunked layout keeps no checksum per document
    with pytest.raises(ShardFormatError, match="sha256") as e:
        _real(TokenDataset(root, seq_len=16, batch_size=4, verify=True))
    assert e.value.shard == str(shard)


def _long_split(tmp: Path) -> tuple[Path, list[int], list[int]]:
    """A per-sample split of long documents (up to 60 sequences of 64) between short ones."""
    rng = np.random.default_rng(8)
    lengths = [3000, 10, 2500, 40, 5, 3800, 20, 1]
    docs = [rng.integers(2, 60000, size=n).tolist() for n in lengths]
    src = tmp / "long.jsonl"
    src.write_text("".join(json.dumps({"text": " ".join(map(str, d))}) + "\n" for d in docs))
    out = tmp / "long"
    convert_tokens(
        src, out, tokenizer=tokenize, vocab_size=60000, eos=1, chunk=None, samples_per_shard=3,
        fsync=False, progress=False, workers=1,
    )  # fmt: skip
    return out, [t for d in docs for t in [*d, 1]], lengths


@pytest.mark.parametrize("where", ["local", "http"])
def test_a_long_document_is_read_whole_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    root, stream, lengths = _long_split(tmp_path)
    checked: Counter[tuple[int, int]] = Counter()  # documents read whole and checked, by (shard, document)
    check = TokenShards._check_sample

    def counted(self: TokenShards, shard: int, d: int, *args: Any) -> None:
        checked[(shard, d)] += 1
        check(self, shard, d, *args)

    monkeypatch.setattr(TokenShards, "_check_sample", counted)
    shards = sorted(root.glob("train-*.tar"))
    sample_bytes = 0  # every document's tar header, data and padding
    for shard in shards:
        with tarfile.open(shard) as tar:
            sample_bytes += sum(m.offset_data + -(-m.size // 512) * 512 - m.offset for m in tar.getmembers())
    if where == "local":
        got = _real(TokenDataset(root, seq_len=64, batch_size=4, seed=1))
    else:
        www = tmp_path / "www"
        shutil.copytree(root, www / "long")
        fast = CacheOptions(retry=RetryPolicy(retries=1, backoff_s=0.01))
        with rangeserver.serve(www) as (base, behaviour):
            ds = TokenDataset(f"{base}/long", seq_len=64, batch_size=4, seed=1, cache=fast)
            behaviour.reset()
            got = _real(ds)
            sent = sum(n for p, n in behaviour.sent_by_path.items() if p.endswith(".tar"))
        # each token about twice (its document checked whole, then its sequence), not once a sequence
        assert sent < 2.5 * sample_bytes
    assert Counter(got) == Counter(stream)
    assert sorted(checked) == [(d // 3, d % 3) for d in range(len(lengths))] and set(checked.values()) == {1}


def test_a_changed_token_of_a_long_document_is_caught_the_first_time(tmp_path: Path) -> None:
    root, stream, lengths = _long_split(tmp_path)
    at = sum(lengths[:5]) + 5  # document 5 in the stream (each document has its EOS)
    doc5 = stream[at : at + lengths[5]]
    shard = sorted(root.glob("train-*.tar"))[1]  # documents 3, 4, 5: 40, 5, 3800 tokens
    _flip(shard, _member(shard, "000000005.tokens.npy") + 128 + 2 * 3000)  # token 3000 of 3800
    grams = {tuple(doc5[i : i + 8]) for i in range(len(doc5) - 7)}
    ds = TokenDataset(root, seq_len=64, batch_size=4)
    for epoch in range(3):  # the same process again: a document that failed its check is not trusted
        ds.set_epoch(epoch)
        yielded: list[dict[str, torch.Tensor]] = []
        with pytest.raises(SampleChecksumError) as e:
            for b in ds:
                yielded.append(b)
        assert e.value.shard == str(shard) and e.value.key == "000000005"
        got = _real(yielded)  # the first row to touch the document found it changed: none of it was given
        assert not grams & {tuple(got[i : i + 8]) for i in range(len(got) - 7)}


_READ_TRUNCATE_READ = """
import os, sys
from shardify.errors import ShardFormatError
from shardify.reader import TokenDataset
root, shard = sys.argv[1], sys.argv[2]
ds = TokenDataset(root, seq_len=16, batch_size=4, shuffle=False)
assert sum(1 for _ in ds) > 0  # every shard mapped
os.truncate(shard, 2000)  # the same file, cut under its mapping
try:
    sum(1 for _ in ds)
except ShardFormatError as e:
    print("error", e.shard)
"""


@pytest.mark.parametrize("chunk", [8, None], ids=["chunked", "per-sample"])
def test_a_shard_truncated_while_mapped_is_an_error_not_a_fault(tmp_path: Path, chunk: int | None) -> None:
    """Read, cut a mapped shard, read again in the same process: an error naming the shard (a
    read of the old mapping past the new end would kill the process with SIGBUS)."""
    import subprocess
    import sys

    root, _ = _split(tmp_path, chunk)
    shard = sorted(root.glob("train-*.tar"))[1]
    done = subprocess.run(
        [sys.executable, "-c", _READ_TRUNCATE_READ, str(root), str(shard)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["error", str(shard)]
