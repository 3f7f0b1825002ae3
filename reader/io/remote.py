"""Deprecated alias of :mod:`shardify.remote` (the fetching both the converter and the reader use),
kept for one release: import from ``shardify.remote``."""

from __future__ import annotations

import warnings

from shardify.remote import *  # noqa: F403 - the alias re-exports every public name
from shardify.remote import __all__  # noqa: F401

warnings.warn("shardify.reader.io.remote is deprecated: import from shardify.remote", DeprecationWarning, stacklevel=2)
