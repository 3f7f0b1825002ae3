"""Packed token sequences for language-model training from token splits (``convert_tokens``)."""

from __future__ import annotations

from shardify.reader.tokens.dataset import TokenDataset, TokenLoader
from shardify.reader.tokens.pack import PackOptions, varlen_args

__all__ = ["TokenDataset", "TokenLoader", "PackOptions", "varlen_args"]
