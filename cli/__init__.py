"""The ``shardify`` command line: a thin layer over both sides of the library.

``main(argv) -> int`` (in :mod:`shardify.cli.__main__`) parses, calls :mod:`shardify.convert`
or :mod:`shardify.reader`, and maps errors to exit codes in one place; ``entrypoint`` is the
console script; ``python -m shardify.cli`` runs it too. Importing this package does not
import torch, nor the commands until they are used.
"""

from __future__ import annotations

from typing import Any

from shardify.cli.common import EXIT_ERROR, EXIT_OK, EXIT_SKIPPED, EXIT_USAGE

__all__ = ["main", "entrypoint", "build_parser", "EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_SKIPPED"]


def __getattr__(name: str) -> Any:
    # Lazy, so that ``python -m shardify.cli`` does not find its __main__ imported already.
    if name in ("main", "entrypoint", "build_parser"):
        from shardify.cli import (
            __main__ as cli_main,
        )  # deferred: python -m shardify.cli must not find __main__ imported

        return getattr(cli_main, name)
    raise AttributeError(f"module 'shardify.cli' has no attribute {name!r}")
