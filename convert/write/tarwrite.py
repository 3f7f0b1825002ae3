"""The tar bytes of a shard: members of a sample (or a chunk of samples), written through a
writer that hashes them and feeds the shard's per-sample table as they go."""

from __future__ import annotations

import hashlib
from typing import BinaryIO

from shardify.chunk import encode_chunk
from shardify.keys import check_ext, check_key
from shardify.sampletable import TableBuilder
from shardify.tarfmt import BLOCK, ustar_header

__all__ = ["temp_name", "HashingWriter", "member_parts", "split_members", "write_chunk", "write_members"]


def temp_name(final: str) -> str:
    """The hidden name the shard ``final`` is written under until it is whole."""
    return f".{final}.tmp"


_BY_REFERENCE = 64 << 10
"""Member data of at least this many bytes is handed to the file as is (never copied here);
smaller pieces of a sample (headers, labels, padding) are joined into one write."""


class HashingWriter:
    """Writes to a file and feeds the same bytes to SHA-256 and to the shard's per-sample
    table (:mod:`shardify.sampletable`; :meth:`mark` where samples start and the last ends); counts them."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.hash = hashlib.sha256()
        self.size = 0
        self.table = TableBuilder()

    def write(self, data: bytes | memoryview) -> None:
        self.f.write(data)
        self.hash.update(data)
        self.table.feed(data)
        self.size += len(data)

    def mark(self, at: int) -> None:
        """A sample starts (or the last one ends) at byte ``at`` of the shard."""
        self.table.mark(at)


def member_parts(key: str, members: list[tuple[str, bytes]]) -> tuple[list[bytes], int]:
    """The tar bytes of one sample (sorted ``(ext, data)`` pairs), as parts, and their total length."""
    check_key(key)
    parts: list[bytes] = []
    total = 0
    for ext, data in members:
        n = len(data)
        pad = -n % BLOCK
        parts += (ustar_header(f"{key}.{check_ext(ext)}", n), data, bytes(pad))
        total += BLOCK + n + pad
    return parts, total


def split_members(data: bytes | memoryview, start: int, end: int) -> tuple[str, list[tuple[str, bytes]]]:
    """The key and ``(ext, data)`` members of one sample that :func:`member_parts` encoded as
    ``data[start:end]`` (the inverse, for a writer that chunks samples it got encoded)."""
    view = memoryview(data)
    members: list[tuple[str, bytes]] = []
    key = ""
    at = start
    while at < end:
        header = view[at : at + BLOCK]
        name = bytes(header[:100]).rstrip(b"\0").decode("ascii")
        size = int(bytes(header[124:135]), 8)
        key, _, ext = name.partition(".")
        members.append((ext, bytes(view[at + BLOCK : at + BLOCK + size])))
        at += BLOCK + size + (-size % BLOCK)
    return key, members


def write_chunk(out: HashingWriter, samples: list[tuple[str, list[tuple[str, bytes]]]]) -> int:
    """Append ``samples`` (``(key, members)`` each) as one chunk of the chunked layout: one tar
    sample keyed by the first sample's key (:func:`shardify.chunk.encode_chunk`); return the bytes."""
    return write_members(out, samples[0][0], encode_chunk([k for k, _ in samples], [m for _, m in samples]))


def write_members(out: HashingWriter, key: str, members: list[tuple[str, bytes]]) -> int:
    """Append the tar members of one sample (sorted ``(ext, data)`` pairs) to ``out``; return the bytes.

    Large member data goes to ``out`` as is (the local shard file gathers it into one
    ``writev``, so an image is copied once, into the page cache); the small pieces around it
    are joined, so a sample costs a few calls."""
    parts, total = member_parts(key, members)
    small: list[bytes] = []
    for part in parts:
        if len(part) < _BY_REFERENCE:
            small.append(part)
            continue
        if small:
            out.write(b"".join(small))
            small = []
        out.write(part)
    if small:
        out.write(b"".join(small))
    return total
