"""Tokenization throughput on one core: the tokenizer's own batch call vs ``convert tokens``.

Generates a deterministic corpus (Zipf-distributed made-up words), trains a byte-level BPE
tokenizer on it offline, then times, on one core (``RAYON_NUM_THREADS=1``):

- the tokenizer alone: ``encode_batch_fast`` (else ``encode_batch``) over batches of ``--batch``
  texts already in memory, the tokenizer loaded from its file as the converter loads it (its
  BPE cache empty, as in the converter: a warm cache would flatter the baseline);
- ``convert_tokens`` with ``workers=1`` on the same texts in a JSONL file: reading, tokenizing,
  the resume digests, the chunked shards, the index.

Each is timed ``--repeat`` times, the two alternating (on a shared machine the load drifts:
timing one after the other would bias the ratio), and the best of each is kept. Prints both
rates (MB of text and tokens per second) and their ratio (the target: >= 0.9).
Usage: ``python tools/bench_tokens.py [--docs 6000] [--words 180] [--batch 256]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"  # one core for the tokenizer too (set before it is imported)
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import numpy as np  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

from shardify.convert.pyapi.tokens import convert_tokens  # noqa: E402


def corpus(docs: int, words: int, seed: int = 0) -> list[str]:
    """``docs`` texts of about ``words`` words, from a 20,000-word made-up vocabulary (Zipf)."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlucmfwypvbgkjqxz"))
    vocab = ["".join(rng.choice(letters, size=int(rng.integers(2, 10)))) for _ in range(20_000)]
    ranks = np.minimum(rng.zipf(1.2, size=docs * words), len(vocab)) - 1
    texts, at = [], 0
    for _ in range(docs):
        n = int(rng.integers(words // 2, words * 3 // 2))
        chunk = ranks[at : at + n]
        at += n
        texts.append(" ".join(vocab[i] for i in chunk) + ".")
    return texts


def train(texts: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False, special_tokens=["<|endoftext|>"])
    tok.train_from_iterator(texts[:2000], trainer=trainer)
    return tok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=6000)
    ap.add_argument("--words", type=int, default=180)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=16000)
    ap.add_argument("--repeat", type=int, default=5, help="best of this many runs each, the two alternating")
    args = ap.parse_args()

    texts = corpus(args.docs, args.words)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    tok = train(texts, args.vocab)
    tmp = tempfile.mkdtemp(prefix="bench_tokens-")
    try:
        tok.save(os.path.join(tmp, "tokenizer.json"))
        src = os.path.join(tmp, "texts.jsonl")
        with open(src, "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts)

        def alone() -> int:
            fresh = Tokenizer.from_file(os.path.join(tmp, "tokenizer.json"))  # as the converter loads it
            batch_call = getattr(fresh, "encode_batch_fast", fresh.encode_batch)
            return sum(
                len(e.ids) for i in range(0, len(texts), args.batch) for e in batch_call(texts[i : i + args.batch])
            )

        def converted() -> int:
            out = os.path.join(tmp, "out")
            shutil.rmtree(out, ignore_errors=True)
            s = convert_tokens(
                src, out, tokenizer=os.path.join(tmp, "tokenizer.json"), workers=1, chunk_size=args.batch,
                eos=0, fsync=False, progress=False,
            )  # fmt: skip
            return s.samples

        runs = (("tokenizer alone", alone), ("convert tokens", converted))
        results, counts = dict.fromkeys([name for name, _ in runs], float("inf")), {}
        for _ in range(args.repeat):  # the two alternate: a machine whose load drifts slows both alike
            for name, fn in runs:
                t0 = time.perf_counter()
                counts[name] = fn()
                results[name] = min(results[name], time.perf_counter() - t0)
        for name, best in results.items():
            print(
                f"{name:16s} {best:6.2f} s  {mb / best:6.2f} MB/s of text  "
                f"({counts[name]:,} {'tokens' if name[0] == 't' else 'documents'})"
            )
        ratio = results["tokenizer alone"] / results["convert tokens"]
        print(
            f"{args.docs} documents, {mb:.1f} MB; convert tokens runs at {ratio:.2f}x "
            "the tokenizer's own batch rate (one core)"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
