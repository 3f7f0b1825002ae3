"""Many byte ranges of one file in one HTTP request: the ``Range`` header that asks for them and
the ``206 multipart/byteranges`` body that answers (RFC 9110 section 14.6), as pure functions.

A span is a half-open ``(start, stop)`` byte range. :func:`range_header` asks for sorted,
non-overlapping, non-empty spans (:func:`check_spans`); :func:`split_spans` groups spans so
that each group's header fits :data:`MAX_RANGE_HEADER_BYTES`. :func:`parse_parts` reads a
multipart body into its parts by each part's ``Content-Range`` (it jumps over a part's bytes,
never scans them, so a 256-part body costs a few ``bytes.find`` per part), and
:func:`cut_spans` builds each span from whichever part covers it: a server may answer the
parts in any order and merge ranges into one part. Malformed bodies raise
:class:`MultipartError`, bodies that end too soon :class:`TruncatedMultipart`.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from typing import NamedTuple

__all__ = [
    "MAX_RANGE_HEADER_BYTES",
    "Span",
    "Part",
    "MultipartError",
    "TruncatedMultipart",
    "check_spans",
    "describe_spans",
    "range_header",
    "header_bytes",
    "split_spans",
    "boundary_of",
    "parse_parts",
    "cut_spans",
]

MAX_RANGE_HEADER_BYTES = 4000
"""The longest ``Range: bytes=...`` header line sent (servers refuse lines over about 8 KB)."""

Span = tuple[int, int]
"""``(start, stop)``: bytes ``start..stop-1`` of a file."""

_PREFIX = len("Range: bytes=")
_PART_RANGE = re.compile(rb"^content-range:[ \t]*bytes[ \t]+(\d+)-(\d+)/(\d+|\*)[ \t]*\r?$", re.I | re.M)
_PART_HEADER = re.compile(rb"^content-range:(.*)$", re.I | re.M)
_BOUNDARY = re.compile(r';\s*boundary\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^;\s]+))', re.IGNORECASE)


class Part(NamedTuple):
    """One part of a multipart answer: bytes ``start..start+len(data)-1`` of a file of ``total``
    bytes (None when the server wrote ``*``); ``data`` is a view of the body, not a copy."""

    start: int
    data: memoryview
    total: int | None


class MultipartError(ValueError):
    """A ``multipart/byteranges`` body that is not what it claims (a part longer or shorter than
    its ``Content-Range``, no ``Content-Range``, no boundary)."""


class TruncatedMultipart(MultipartError):
    """A ``multipart/byteranges`` body that ends before its closing boundary."""


def check_spans(spans: Sequence[Span]) -> None:
    """ValueError unless ``spans`` is not empty and holds non-empty spans of non-negative
    offsets, sorted ascending, non-overlapping."""
    if not spans:
        raise ValueError("no spans given")
    last = 0
    for i, (start, stop) in enumerate(spans):
        if start < last or stop <= start:
            raise ValueError(
                f"spans[{i}] = {(start, stop)} should be non-empty and start at or after {last} "
                "(spans sorted ascending, non-overlapping, offsets >= 0)"
            )
        last = stop


def describe_spans(spans: Sequence[Span], *, shown: int = 3) -> str:
    """A short name for ``spans`` in messages: ``"3 ranges, bytes 0-9, 20-29, 40-49"``, the first
    ``shown`` of them, then ``...``."""
    listed = ", ".join(f"{a}-{b - 1}" for a, b in spans[:shown])
    more = ", ..." if len(spans) > shown else ""
    return f"{len(spans)} ranges, bytes {listed}{more}"


def range_header(spans: Sequence[Span]) -> str:
    """The ``Range`` header's value that asks for ``spans``: ``bytes=a1-b1,a2-b2`` (inclusive ends)."""
    return "bytes=" + ",".join([f"{a}-{b - 1}" for a, b in spans])


def header_bytes(spans: Sequence[Span]) -> int:
    """The length of the header line ``Range: bytes=...`` that asks for ``spans``."""
    return _PREFIX + sum(len(str(a)) + len(str(b - 1)) + 2 for a, b in spans) - 1


def split_spans(spans: Sequence[Span], *, max_header_bytes: int = MAX_RANGE_HEADER_BYTES) -> list[list[Span]]:
    """``spans`` cut into consecutive groups, each as long as its ``Range`` header line (see
    :func:`header_bytes`) stays within ``max_header_bytes``; joined, the groups are ``spans``.
    ValueError for spans that :func:`check_spans` refuses, or a limit too small for one span."""
    check_spans(spans)
    groups: list[list[Span]] = []
    group: list[Span] = []
    used = _PREFIX - 1  # the header's fixed part, less the comma the first span does not need
    for a, b in spans:
        cost = len(str(a)) + len(str(b - 1)) + 2
        if _PREFIX + cost - 1 > max_header_bytes:
            raise ValueError(f"{max_header_bytes=} cannot hold one range ({a}, {b})")
        if group and used + cost > max_header_bytes:
            groups.append(group)
            group, used = [], _PREFIX - 1
        group.append((a, b))
        used += cost
    groups.append(group)
    return groups


def boundary_of(content_type: str | None) -> str | None:
    """The boundary of a ``multipart/byteranges`` Content-Type (quoted or not); None for any
    other Content-Type."""
    if not content_type or content_type.split(";", 1)[0].strip().lower() != "multipart/byteranges":
        return None
    m = _BOUNDARY.search(content_type)
    if m is None:
        return None
    quoted, bare = m.group(1), m.group(2)
    return re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare


def _content_range(body: bytes, pos: int, nl: bytes) -> tuple[int, int, int | None, int]:
    """A part's headers from ``pos`` (lines ending in ``nl``): ``(first, last, total, where its
    bytes start)``."""
    end = body.find(nl + nl, pos - len(nl))  # (a part without headers: the blank line at once)
    if end < 0:
        raise TruncatedMultipart("the body ends inside a part's headers")
    headers = body[pos:end]
    m = _PART_RANGE.search(headers)
    if m is None or int(m.group(2)) < int(m.group(1)):
        found = _PART_HEADER.search(headers)
        if found is None:
            raise MultipartError("a part without Content-Range")
        raise MultipartError(f"a part with Content-Range {found.group(1).strip().decode('latin-1')!r}")
    total = None if m.group(3) == b"*" else int(m.group(3))
    return int(m.group(1)), int(m.group(2)), total, end + 2 * len(nl)


def parse_parts(body: bytes, boundary: str) -> list[Part]:
    """The parts of a ``multipart/byteranges`` ``body`` delimited by ``boundary``, in the
    order sent. A preamble before the first boundary and an epilogue after the closing one are
    ignored; lines may end in CRLF or LF. Each part's bytes are as many as its
    ``Content-Range`` says and must be followed by the next boundary, else MultipartError
    (TruncatedMultipart when the body ends first)."""
    dash = b"--" + boundary.encode("latin-1")
    if body.startswith(dash):
        pos = 0
    else:
        pos = body.find(b"\n" + dash)
        if pos < 0:
            raise TruncatedMultipart(f"no boundary {boundary!r} in the body")
        pos += 1
    view = memoryview(body)
    parts: list[Part] = []
    while True:  # at a boundary
        pos += len(dash)
        if body.startswith(b"--", pos):
            if not parts:
                raise MultipartError("a multipart body without parts")
            return parts
        if len(body) - pos < 2:
            raise TruncatedMultipart(f"the body ends after {len(parts)} parts, without the closing boundary")
        end = body.find(b"\n", pos)
        if end < 0:
            raise TruncatedMultipart("the body ends after a boundary")
        if body[pos:end].strip(b" \t\r"):
            raise MultipartError(f"boundary {boundary!r} followed by {body[pos:end][:40]!r}")
        nl = b"\r\n" if body[end - 1 : end] == b"\r" else b"\n"
        first, last, total, pos = _content_range(body, end + 1, nl)
        stop = pos + last - first + 1
        if stop > len(body):
            raise TruncatedMultipart(f"the body ends inside the part of bytes {first}-{last}")
        parts.append(Part(first, view[pos:stop], total))
        if body.startswith(b"\r\n" + dash, stop):
            pos = stop + 2
        elif body.startswith(b"\n" + dash, stop):
            pos = stop + 1
        elif len(body) - stop < len(dash) + 2:
            raise TruncatedMultipart(f"the body ends after the part of bytes {first}-{last}")
        else:
            raise MultipartError(
                f"the part of bytes {first}-{last} is not followed by the boundary: "
                "it is longer or shorter than its Content-Range"
            )


def cut_spans(parts: Sequence[Part], spans: Sequence[Span]) -> list[bytes]:
    """Each of ``spans`` (sorted) cut from whichever of ``parts`` covers it whole; MultipartError
    naming the first span that none covers, or parts that disagree on the file's size."""
    totals = {p.total for p in parts if p.total is not None}
    if len(totals) > 1:
        raise MultipartError(f"parts disagree on the file's size: {sorted(totals)}")
    ordered = sorted(parts, key=lambda p: p.start)
    starts = [p.start for p in ordered]
    out: list[bytes] = []
    for a, b in spans:
        i = bisect.bisect_right(starts, a) - 1
        part = ordered[i] if i >= 0 else None
        if part is None or part.start + len(part.data) < b:  # (overlapping parts: look at all)
            part = next((p for p in ordered if p.start <= a and p.start + len(p.data) >= b), None)
            if part is None:
                raise MultipartError(f"no part of the answer covers bytes {a}-{b - 1}")
        out.append(bytes(part.data[a - part.start : b - part.start]))
    return out
