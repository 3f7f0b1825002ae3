"""The writer side: plan, pack and verify shards (the ``shardify`` command line is :mod:`shardify.cli`).

From Python: :class:`ShardWriter` writes a split one sample at a time; :func:`convert_items`
runs a function over items in parallel; :func:`convert_tokens` tokenizes texts into token
documents. They are imported on first use, so that the command line starts without them.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ShardWriter",
    "WriteOptions",
    "ValueOptions",
    "convert_items",
    "ItemsOptions",
    "JsonlItems",
    "convert_tokens",
    "TokenOptions",
]

_LAZY = {
    "ShardWriter": "shardify.convert.pyapi.pywriter",
    "WriteOptions": "shardify.convert.pyapi.pywriter",
    "ValueOptions": "shardify.convert.pyapi.values",
    "convert_items": "shardify.convert.pyapi.fromitems",
    "ItemsOptions": "shardify.convert.pyapi.fromitems",
    "JsonlItems": "shardify.convert.pyapi.fromitems",
    "convert_tokens": "shardify.convert.pyapi.tokens",
    "TokenOptions": "shardify.convert.pyapi.tokens",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardify.convert' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
