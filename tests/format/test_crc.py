"""shardify.crc: the fast CRC-32 is zlib's function, whole and incremental, and is the one in use."""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest

from shardify import crc


@pytest.mark.parametrize("size", [0, 1, 7, 64, 511, 512, 5120, 1 << 20])
def test_crc32_is_zlibs(size: int) -> None:
    data = os.urandom(size)
    assert crc.crc32(data) == zlib.crc32(data)
    assert crc.crc32(memoryview(data)) == zlib.crc32(data)
    assert crc.crc32(np.frombuffer(data, np.uint8)) == zlib.crc32(data)
    cut = size // 3
    assert crc.crc32(data[cut:], crc.crc32(data[:cut])) == zlib.crc32(data)
    assert crc.crc32(data, 12345) == zlib.crc32(data, 12345)


def test_the_declared_fast_implementation_is_the_one_imported() -> None:
    """zlib-ng is a dependency: a reader on the system zlib checks samples seven times slower."""
    assert crc.IMPLEMENTATION == "zlib-ng"
