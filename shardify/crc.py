"""``crc32``: the CRC-32 of zlib (and of the split index's per-sample table), at memory speed.

Every sample read from a shard file is checked against its CRC-32 (``DecodeOptions(check_samples=True)``),
so the checksum is on the reader's hot path. CPython's ``zlib.crc32`` comes from the system zlib
(1.2 on most Linux distributions: about 5.5 GB/s, 0.84 us for a 5 KiB sample); zlib-ng's folds
with carry-less multiplication (about 40 GB/s, 0.12 us; the ``zlib-ng`` package, a dependency).
Both compute the same function, incremental form included (``crc32(b, crc32(a)) == crc32(a + b)``);
where zlib-ng cannot be imported, zlib's is used. :data:`IMPLEMENTATION` names the one in use.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

__all__ = ["crc32", "IMPLEMENTATION"]


def _fastest() -> tuple[Callable[..., int], str]:
    try:
        from zlib_ng import zlib_ng
    except ImportError:  # pragma: no cover - zlib-ng is a dependency; a platform without its wheel builds it
        return zlib.crc32, "zlib"
    return zlib_ng.crc32, "zlib-ng"


crc32, IMPLEMENTATION = _fastest()
"""``crc32(data, value=0)``: as ``zlib.crc32``."""
