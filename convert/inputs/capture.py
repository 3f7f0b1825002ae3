"""Decoder messages captured as a sample's note instead of reaching the terminal.

Pillow reports odd but readable inputs with Python warnings (``Invalid APNG ...``,
palette transparency, EXIF troubles), and libtiff writes its own lines straight to file
descriptor 2 (``More samples per pixel than can be decoded: 65535``). Both would interleave
with the progress bar even under ``--quiet`` and name no file; here they are collected while
one input is checked or transcoded, and the writer records them in the split's report as a
``note`` on that input. The descriptor is redirected only for TIFF data (only libtiff
writes there), and only in the process doing the check.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["decoder_messages"]

_MAX_NOTE = 500
"""Characters kept per captured line."""
_MAX_LINES = 20
"""Captured lines kept per input."""
_NOT_NOTED = (DeprecationWarning, PendingDeprecationWarning)
"""Warnings about the libraries themselves, not about an input."""


@contextmanager
def decoder_messages(*, native: bool) -> Iterator[list[str]]:
    """Collect the warnings raised inside (and, with ``native``, what C code writes to fd 2)
    into the yielded list, one line each, after the block ends."""
    out: list[str] = []
    err = None
    saved = -1
    if native:
        err = tempfile.TemporaryFile()
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # deprecations are dropped below (one filter: cheaper per image)
            yield out
    finally:
        if err is not None:
            os.dup2(saved, 2)
            os.close(saved)
            err.seek(0)
            text = err.read(_MAX_NOTE * _MAX_LINES).decode("utf-8", "replace")
            err.close()
            out.extend(line.strip() for line in text.splitlines() if line.strip())
        out[:0] = [f"{w.category.__name__}: {w.message}" for w in caught if not issubclass(w.category, _NOT_NOTED)]
        out[:] = [line[:_MAX_NOTE] for line in out[:_MAX_LINES]]
