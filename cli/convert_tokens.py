"""``shardify convert tokens SRC OUT``: tokenize a JSONL or Parquet text column into token documents.

Parses the options into :class:`~shardify.convert.pyapi.tokens.TokenOptions` and calls
:func:`~shardify.convert.pyapi.tokens.convert_tokens`. Importing this module does not import torch.
"""

from __future__ import annotations

import argparse
from typing import Any

from shardify.cli.common import FORMATTER, engine_args

__all__ = ["add_parser", "convert"]

EXAMPLE = """example:
  shardify convert tokens corpus.jsonl out/corpus --tokenizer tokenizer.json --eos 0
  shardify convert tokens corpus.parquet out/corpus --column content --tokenizer tokenizer.json
  shardify convert tokens corpus.jsonl out/corpus --tokenizer mymodule:encode --vocab-size 50304

Each row's text becomes one document: field "tokens.npy", its token ids (uint16 when the
vocabulary fits, else uint32), --eos appended. The index records every document's length.
Rows that are not text, are empty or make the tokenizer raise are listed in
OUT/<split>.report.jsonl (exit 3). A tokenizer.json needs pip install 'shardify[tokens]';
nothing is downloaded."""


def add_parser(kinds: Any) -> None:
    """Add ``tokens`` to the kinds of ``convert``."""
    p = kinds.add_parser(
        "tokens", help="tokenize a JSONL or Parquet text column", epilog=EXAMPLE, formatter_class=FORMATTER
    )
    p.add_argument("src", metavar="SRC", help="a .jsonl or .parquet file")
    p.add_argument("out", metavar="OUT")
    g = p.add_argument_group("tokens")
    g.add_argument(
        "--tokenizer",
        required=True,
        help="a Hugging Face tokenizer.json, or MODULE:FUNCTION (str -> list of ids, the current folder importable)",
    )
    g.add_argument("--column", default="text", help="the text column (default: text)")
    g.add_argument(
        "--format", dest="fmt", choices=("jsonl", "parquet"), default=None, help="default: from the extension"
    )
    g.add_argument("--eos", type=int, default=None, metavar="ID", help="token id appended to every document")
    g.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="ids are below this (default: the tokenizer.json's size; for a function: none, stored as uint32)",
    )
    g = p.add_argument_group("output")
    g.add_argument("--split", default="train", help="split name (default: train)")
    g.add_argument("--shard-size", default="256MB", help="bound on shard size, with units: 64MB, 1GiB (default: 256MB)")
    g.add_argument("--samples-per-shard", type=int, default=None, help="bound on documents per shard (default: none)")
    g.add_argument(
        "--chunk",
        type=int,
        default=256,
        metavar="N",
        help="documents per tar member (the chunked layout; default: 256; 0: one tar sample per document)",
    )
    g.add_argument("--overwrite", action="store_true", help="replace a split that is already finished in OUT")
    g.add_argument("--strict", action="store_true", help="stop at the first bad row")
    g = p.add_argument_group("run")
    g.add_argument("--workers", type=int, default=0, help="worker processes (default: one per core)")
    g.add_argument("--batch", type=int, default=256, help="texts per batch call of the tokenizer (default: 256)")
    engine_args(g)


def convert(args: argparse.Namespace) -> Any:
    """Run the conversion of ``convert tokens``'s arguments; a ``ConvertResult`` of its one split."""
    from shardify.convert.pyapi.tokens import TokenOptions, convert_tokens  # deferred: the writer loads numpy
    from shardify.convert.write.run import ConvertResult  # deferred: the writer loads Pillow and numpy

    options = TokenOptions(
        column=args.column,
        fmt=args.fmt,
        eos=args.eos,
        vocab_size=args.vocab_size,
        split=args.split,
        shard_size=args.shard_size,
        samples_per_shard=args.samples_per_shard,
        chunk=args.chunk or None,
        overwrite=args.overwrite,
        strict=args.strict,
        workers=args.workers,
        chunk_size=args.batch,
        engine=args.engine,
        ray_address=args.ray_address,
        progress=not args.quiet,
        fsync=not args.no_fsync,
    )
    summary = convert_tokens(args.src, args.out, tokenizer=args.tokenizer, options=options)
    return ConvertResult(out_dir=args.out, splits={summary.split: summary})
