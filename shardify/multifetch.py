"""Many byte ranges of one file in one HTTP GET (``Range: bytes=a1-b1,a2-b2,...``): the request
under :func:`shardify.remote.fetch_ranges`, and which hosts refused it.

:func:`http_ranges` sends the GET as :func:`~shardify.transport.http_get` sends any (a kept
connection, redirects, proxies, deadline, abort) and accepts a ``206 multipart/byteranges``
answer (its parts in any order, ranges merged into one part) or a single-part 206 that covers
every span (the server merged them all), checked to the byte (:mod:`shardify.multirange`). A
host that answers 200 (the whole file; its body is not read, the connection is closed) or a
single part that leaves spans out does not serve many ranges in one request:
:class:`MultiRangeIgnored`, and the host is remembered for the process
(:func:`multi_range_ok`).
"""

from __future__ import annotations

import http.client
import socket
import threading
import urllib.parse
from collections.abc import Sequence

from shardify.fetchcontrol import Abort, Deadline, Permanent, Transient, read_timed
from shardify.multirange import (
    MultipartError,
    Span,
    TruncatedMultipart,
    boundary_of,
    cut_spans,
    parse_parts,
    range_header,
)
from shardify.transport import CONTENT_RANGE, HTTP_SCHEMES, checked_range, http_get, range_headers

__all__ = ["MultiRangeIgnored", "http_ranges", "multi_range_ok", "PART_OVERHEAD_BYTES"]

PART_OVERHEAD_BYTES = 512
"""The most bytes a part's boundary and headers may take, for the largest body accepted when
the server does not say its length (the spans' extent plus this per span)."""


class MultiRangeIgnored(Permanent):
    """A GET of many ranges answered with the whole file (200) or with a part that leaves
    spans out: the server does not serve many ranges in one request."""


_REFUSED: set[tuple[str, str, int]] = set()
_LOCK = threading.Lock()


def _host(url: str) -> tuple[str, str, int]:
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        port = 0
    return parts.scheme, (parts.hostname or ""), port


def multi_range_ok(url: str) -> bool:
    """Whether to ask ``url``'s host for many ranges in one GET: False for a host that refused
    it in this process (:class:`MultiRangeIgnored`), and for every URL but ``http(s)://``."""
    if not url.startswith(HTTP_SCHEMES):
        return False
    key = _host(url)
    with _LOCK:
        return key not in _REFUSED


def _refused(url: str) -> None:
    key = _host(url)
    with _LOCK:
        _REFUSED.add(key)


def http_ranges(url: str, spans: Sequence[Span], deadline: Deadline, abort: Abort | None = None) -> list[bytes]:
    """Each of ``spans`` (sorted, non-overlapping, non-empty; at least two) of ``url`` in one
    GET, exactly, or Transient/Permanent by ``deadline`` (see the module); ``abort`` stops it
    from another thread. :class:`MultiRangeIgnored` also marks the host as refusing."""

    def check(resp: http.client.HTTPResponse, deadline: Deadline, sock: socket.socket | None) -> list[bytes]:
        return _checked_ranges(resp, spans, deadline, sock)

    try:
        return http_get(url, range_headers(range_header(spans)), check, deadline, abort)
    except MultiRangeIgnored:
        _refused(url)
        raise


def _checked_ranges(
    resp: http.client.HTTPResponse, spans: Sequence[Span], deadline: Deadline, sock: socket.socket | None
) -> list[bytes]:
    """The spans out of an answer to their multi-range GET, or Transient/Permanent; a 200 is
    :class:`MultiRangeIgnored`, its body not read."""
    if resp.status == 200:
        raise MultiRangeIgnored("the server answered 200 with the whole file to a request for many ranges")
    if resp.status != 206:
        raise Permanent(f"unexpected HTTP status {resp.status} {resp.reason}")
    boundary = boundary_of(resp.headers.get("Content-Type"))
    if boundary is None:
        return _one_part(resp, spans, deadline, sock)
    most = spans[-1][1] - spans[0][0] + len(spans) * PART_OVERHEAD_BYTES + len(boundary) + 256
    length = resp.headers.get("Content-Length")
    want = int(length) if length is not None and length.strip().isdigit() else None
    if want is not None and want > most:
        raise Permanent(f"the server answers {want} bytes to a request for {_sum(spans)} bytes")
    body = read_timed(resp, (most if want is None else want) + 1, deadline, sock)
    if want is not None and len(body) < want:
        raise Transient(f"connection closed after {len(body)} of {want} bytes")
    if len(body) > most:
        raise Transient(f"the body is longer than the {most} bytes the ranges can take; cut off there")
    try:
        return cut_spans(parse_parts(body, boundary), spans)
    except TruncatedMultipart as e:
        raise Transient(f"a truncated multipart/byteranges answer: {e}") from e
    except MultipartError as e:
        raise Permanent(f"a wrong multipart/byteranges answer: {e}") from e


def _one_part(
    resp: http.client.HTTPResponse, spans: Sequence[Span], deadline: Deadline, sock: socket.socket | None
) -> list[bytes]:
    """The spans out of a single-part 206 that covers them all (the server merged them), read
    and checked as a single range is; :class:`MultiRangeIgnored` when it does not cover them."""
    found = resp.headers.get("Content-Range", "")
    m = CONTENT_RANGE.fullmatch(found.strip())
    if m is None or int(m.group(2)) < int(m.group(1)):
        raise Permanent(f"asked for many ranges, the server answered 206 with Content-Range {found!r}")
    first, last = int(m.group(1)), int(m.group(2))
    if first > spans[0][0] or last < spans[-1][1] - 1:
        raise MultiRangeIgnored(f"asked for many ranges, the server answered one, Content-Range {found!r}")
    view = memoryview(checked_range(first, last + 1, resp, deadline, sock))  # (read and checked as any one range)
    return [bytes(view[a - first : b - first]) for a, b in spans]


def _sum(spans: Sequence[Span]) -> int:
    return sum(b - a for a, b in spans)
