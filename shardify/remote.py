"""Fetching URLs: ``http(s)://`` with the standard library, any other scheme through fsspec.

A download streams into a file in chunks (memory holds one chunk), retries transient
failures (connection reset or refused, timeouts, a request past its deadline, truncated
bodies, bodies longer than expected, HTTP 429 and 5xx) with exponential backoff within a
:class:`RetryPolicy` (waiting as long as a ``Retry-After`` header asks, up to
``max_retry_after_s``), and resumes where it stopped: HTTP with
``Range: bytes=N-`` (checked against the answer's ``Content-Range``; a server that ignores
the range and answers 200 restarts the file from byte 0, what was received is discarded),
fsspec with a seek. Sizes are checked against ``Content-Length`` and the manifest (a body
longer than that is cut off there, never written past it), the SHA-256 against the manifest
when it is known. Every request (connecting, the headers, the whole body) ends within
``deadline_s``, whatever pace the server sends at; :attr:`RetryPolicy.worst_case_s` is the
longest a fetch can take.

:func:`fetch_range` fetches one byte range (``Range: bytes=a-b``, fsspec ``cat_file``) and
returns exactly those bytes: a server that answers 200 with the whole file (it ignores
Range) raises :class:`RangeNotSupported` at once (the caller can fetch the whole file
instead), a shorter range or a connection dropped mid-range is retried
within the policy, then refused; never are other bytes returned. Over ``http(s)://`` a
fetch thread keeps its connection to a host for the next range (see
:func:`~shardify.transport.http_range`).

:func:`fetch_ranges` fetches many ranges of one file in one GET (``Range: bytes=a-b,c-d``,
answered ``206 multipart/byteranges``, see :mod:`shardify.multifetch`), exactly, retried as a
whole; a server that answers with the whole file or one range raises
:class:`MultiRangeRefused` and its host is remembered (:func:`multi_range_ok`), so the caller
asks it one range per request from then on.

One request and its failure's kind are :mod:`shardify.transport`'s; this module retries,
resumes and checks. The I/O that the converter (reading a dataset's own files back, ``shardify verify`` of a remote
dataset) and the reader share, beside the format: neither side imports the other for it.
"""

from __future__ import annotations

import hashlib
import io
import logging
import posixpath
import random
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar

from shardify.errors import ShardFormatError
from shardify.fetchcontrol import Abort, Body, Complete, Deadline, Permanent, RangeIgnored, Transient
from shardify.keepalive import TakenBody
from shardify.multifetch import MultiRangeIgnored, http_ranges, multi_range_ok
from shardify.multirange import MAX_RANGE_HEADER_BYTES, check_spans, describe_spans, header_bytes, split_spans
from shardify.transport import HTTP_SCHEMES, classify, fsspec_range, http_range, open_body

__all__ = [
    "Abort",
    "RetryPolicy",
    "ShardFetchError",
    "RangeNotSupported",
    "MultiRangeRefused",
    "MAX_RANGE_HEADER_BYTES",
    "multi_range_ok",
    "split_spans",
    "is_remote",
    "join_url",
    "download",
    "fetch_bytes",
    "fetch_range",
    "fetch_ranges",
]

log = logging.getLogger("shardify.reader")
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try a URL: ``retries`` attempts after the first failure, waiting
    ``backoff_s`` seconds and doubling up to ``max_backoff_s``, or as long as the server's
    ``Retry-After`` asks up to ``max_retry_after_s``; ``timeout_s`` bounds connecting and each
    read, ``deadline_s`` one whole request (connecting, headers and body: a server trickling
    bytes cannot hold it longer); ``chunk_bytes`` is the memory one download holds.
    :attr:`worst_case_s` is the longest one fetch can take."""

    retries: int = 5
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    timeout_s: float = 30.0
    deadline_s: float = 300.0
    max_retry_after_s: float = 60.0
    chunk_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError(f"{self.retries=} should be >= 0")
        if self.backoff_s < 0 or self.max_backoff_s < self.backoff_s:
            raise ValueError(f"{self.backoff_s=} and {self.max_backoff_s=} should be 0 <= backoff_s <= max_backoff_s")
        if self.timeout_s <= 0 or self.chunk_bytes < 1:
            raise ValueError(f"{self.timeout_s=} should be > 0 and {self.chunk_bytes=} >= 1")
        if self.deadline_s <= 0 or self.max_retry_after_s < 0:
            raise ValueError(f"{self.deadline_s=} should be > 0 and {self.max_retry_after_s=} >= 0")

    @property
    def worst_case_s(self) -> float:
        """The longest one fetch can take (seconds): every attempt running to ``deadline_s``,
        and before each retry the longest wait (the backoff, or a ``Retry-After`` up to
        ``max_retry_after_s``)."""
        waits = sum(self.wait_s(i, self.max_retry_after_s) for i in range(1, self.retries + 1))
        return (self.retries + 1) * self.deadline_s + waits

    def wait_s(self, failures: int, retry_after: float | None = None) -> float:
        """The longest wait after the ``failures``-th failure: the backoff, or what the server
        asked (``retry_after``) up to ``max_retry_after_s``, whichever is longer."""
        base = min(self.max_backoff_s, self.backoff_s * 2.0 ** (failures - 1))
        return max(base, min(retry_after, self.max_retry_after_s)) if retry_after is not None else base

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failure (jittered, never above ``max_backoff_s``)."""
        base = min(self.max_backoff_s, self.backoff_s * 2.0 ** (failures - 1))
        return base * random.uniform(0.5, 1.0)


class ShardFetchError(ShardFormatError):
    """A remote shard could not be fetched: a permanent error, or the retry budget ran out.

    The message names the URL and the last cause; a subclass of
    :class:`~shardify.errors.ShardFormatError` so readers treat it like an unreadable shard.
    """


class RangeNotSupported(ShardFetchError):
    """The server answered a ranged request with the whole file (it ignores ``Range``): the
    caller fetches the whole file instead (:func:`fetch_range`). ``body``: that answer's body,
    unread, when asked for (``take_whole``), else None."""

    body: Body | None = None


class MultiRangeRefused(ShardFetchError):
    """The server answered a request for many ranges (:func:`fetch_ranges`) with the whole file
    or with one range: it does not serve many ranges in one request. Its host is remembered
    (:func:`multi_range_ok` is False after); the caller fetches one range per request."""


def is_remote(url: str) -> bool:
    """Whether ``url`` needs fetching (any scheme but ``file://``); local paths are not."""
    return "://" in url and not url.startswith("file://")


def join_url(base: str, relative: str) -> str:
    """``relative`` (a shard's ``url`` in a split index) resolved against the URL ``base`` of
    the index: like a browser for ``http(s)``, by path for other schemes (``s3://b/ds/x.json``
    and ``x.tar`` give ``s3://b/ds/x.tar``); an absolute URL stays as it is."""
    if "://" in relative:
        return relative
    if base.startswith(HTTP_SCHEMES):
        return urllib.parse.urljoin(base, relative)
    scheme, rest = base.split("://", 1)
    folder = rest.rsplit("/", 1)[0] if "/" in rest else rest
    return f"{scheme}://{posixpath.normpath(posixpath.join(folder, relative))}"


class _Progress:
    """What one download has written so far: the destination, its length and running SHA-256."""

    def __init__(self, url: str, dest: BinaryIO, *, sha256: str, max_bytes: int | None) -> None:
        self.url, self.dest, self.max_bytes = url, dest, max_bytes
        self.expected: int | None = None  # the file's size, once known: no byte is written past it
        self.want_sha = sha256.lower()
        self.pos = 0
        self.hasher = hashlib.sha256() if sha256 else None

    def restart(self) -> None:
        """Discard everything received (the next bytes are the file's first)."""
        self.dest.seek(0)
        self.dest.truncate()
        self.pos = 0
        self.hasher = hashlib.sha256() if self.want_sha else None

    def write(self, chunk: bytes) -> None:
        if self.expected is not None and self.pos + len(chunk) > self.expected:
            self.restart()  # what else this answer held cannot be trusted either
            raise Transient(f"the body is longer than the {self.expected} bytes expected; cut off there")
        if self.max_bytes is not None and self.pos + len(chunk) > self.max_bytes:
            raise Permanent(f"larger than {self.max_bytes} bytes; is this the right URL?")
        try:
            self.dest.write(chunk)
        except OSError as e:  # the local disk, not the network: never retried
            raise Permanent(f"cannot write {getattr(self.dest, 'name', 'the download')}: {e}") from e
        if self.hasher is not None:
            self.hasher.update(chunk)
        self.pos += len(chunk)

    def check_sha(self) -> None:
        if self.hasher is not None and self.hasher.hexdigest() != self.want_sha:
            got = self.hasher.hexdigest()
            self.restart()
            raise Transient(f"sha256 is {got}, the manifest says {self.want_sha}")


def download(
    url: str,
    dest: BinaryIO,
    *,
    retry: RetryPolicy,
    size: int | None = None,
    sha256: str = "",
    max_bytes: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> int:
    """Write the bytes at ``url`` to ``dest`` (an empty file open for writing) and return
    their count. Retries and resumes as the module says; ``size`` and ``sha256`` (from the
    manifest) are checked when given; ``storage_options`` go to the fsspec backend (credentials,
    endpoint). Raises :class:`ShardFetchError` naming ``url``."""
    done = _Progress(url, dest, sha256=sha256, max_bytes=max_bytes)

    def attempt() -> int:
        try:
            _attempt(done, retry=retry, size=size, storage_options=storage_options)
        except Complete:
            pass
        done.check_sha()
        return done.pos

    return _retrying(url, attempt, retry=retry, received=lambda: done.pos)


def _retrying(
    url: str,
    attempt: Callable[[], T],
    *,
    retry: RetryPolicy,
    what: str = "",
    received: Callable[[], int] | None = None,
    abort: Abort | None = None,
) -> T:
    """What ``attempt()`` returns, calling it again after each Transient failure within
    ``retry``; ShardFetchError naming ``url`` when it fails for good. For the messages:
    ``what`` part of the file is asked for (a byte range; "" for all of it), ``received``
    how many bytes a download has so far. ``abort``, when fired, ends the wait before a
    retry and the retries."""
    at, prefix = (f" {what}", f"{what}: ") if what else ("", "")
    failures = 0
    while True:
        try:
            return attempt()
        except Permanent as e:
            raise ShardFetchError(f"cannot fetch{at}: {e}", shard=url) from e
        except Transient as e:
            failures += 1
            got = f" ({received()} bytes received)" if received is not None else ""
            if abort is not None and abort.fired:
                raise ShardFetchError(f"{prefix}{e}; no longer wanted, not retried", shard=url) from e
            if failures > retry.retries:
                raise ShardFetchError(
                    f"{prefix}gave up after {failures} attempts{got}; last cause: {e}", shard=url
                ) from e
            wait = retry.delay(failures)
            if e.retry_after is not None:
                wait = max(wait, min(e.retry_after, retry.max_retry_after_s))
            log.warning("%s: %s%s; retry %d of %d in %.2f s%s", url, prefix, e, failures, retry.retries, wait, got)
            if abort is not None:
                if abort.sleep(wait):
                    raise ShardFetchError(f"{prefix}{e}; no longer wanted, not retried", shard=url) from e
            else:
                time.sleep(wait)


def _attempt(
    done: _Progress, *, retry: RetryPolicy, size: int | None, storage_options: Mapping[str, Any] | None
) -> None:
    """One request from byte ``done.pos`` to the end of the file."""
    url = done.url
    try:
        body = open_body(url, done.pos, Deadline(retry.deadline_s, retry.timeout_s), storage_options)
    except (Transient, Permanent, Complete):
        raise
    except Exception as e:
        raise classify(e) from e
    try:
        if body.start != done.pos:
            log.warning("%s: the server ignored Range bytes=%d- (answered 200); restarting from byte 0", url, done.pos)
            done.restart()
        total = body.total
        if size is not None and total is not None and total != size:
            what = f"the server says {total} bytes, the manifest says {size}"
            raise Transient(what) if isinstance(body, TakenBody) else Permanent(what)  # (ask again for that one)
        done.expected = total if total is not None else size
        while True:
            try:
                chunk = body.read(retry.chunk_bytes)
            except (Transient, Permanent):
                raise
            except Exception as e:
                raise classify(e) from e
            if not chunk:
                break
            done.write(chunk)
    finally:
        body.close()
    want = total if total is not None else size
    if want is not None and done.pos < want:
        raise Transient(f"connection closed after {done.pos} of {want} bytes")
    if want is not None and done.pos > want:
        raise Permanent(f"received {done.pos} bytes, expected {want}")


def fetch_bytes(
    url: str, *, retry: RetryPolicy, max_bytes: int = 256 << 20, storage_options: Mapping[str, Any] | None = None
) -> bytes:
    """The whole content of a small file at ``url`` (a manifest or split index)."""
    buf = io.BytesIO()
    download(url, buf, retry=retry, max_bytes=max_bytes, storage_options=storage_options)
    return buf.getvalue()


def fetch_range(
    url: str,
    start: int,
    stop: int,
    *,
    retry: RetryPolicy,
    storage_options: Mapping[str, Any] | None = None,
    abort: Abort | None = None,
    take_whole: bool = False,
) -> bytes:
    """Bytes ``start..stop-1`` of the file at ``url``, exactly (see the module); raises
    :class:`ShardFetchError` naming ``url`` and the range, :class:`RangeNotSupported` when the
    server answers with the whole file (with ``take_whole``, its ``body``: that answer's body
    unread, for the caller to use, see :func:`shardify.keepalive.offered`, and close).
    ``abort``: when fired (from another thread), the fetch stops at once (its bytes are no
    longer wanted)."""
    what = f"bytes {start}-{stop - 1}"

    def attempt() -> bytes:
        if url.startswith(HTTP_SCHEMES):
            deadline = Deadline(retry.deadline_s, retry.timeout_s)
            return http_range(url, start, stop, deadline, abort, take_whole=take_whole)
        return fsspec_range(url, start, stop, storage_options)

    try:
        return _retrying(url, attempt, retry=retry, what=what, abort=abort)
    except ShardFetchError as e:
        if isinstance(e.__cause__, RangeIgnored):
            refused = RangeNotSupported(
                f"cannot fetch {what}: {e.__cause__}; CacheOptions(ranged=False) fetches whole shards", shard=url
            )
            refused.body = e.__cause__.body
            raise refused from e.__cause__
        raise


def fetch_ranges(
    url: str,
    spans: Sequence[tuple[int, int]],
    *,
    retry: RetryPolicy,
    storage_options: Mapping[str, Any] | None = None,
    abort: Abort | None = None,
) -> list[bytes]:
    """Bytes ``start..stop-1`` of the file at ``url`` for each ``(start, stop)`` of ``spans``
    (sorted, non-overlapping, non-empty: ValueError otherwise), exactly. Over ``http(s)://``
    in one GET whose ``Range`` header fits :data:`MAX_RANGE_HEADER_BYTES` (ValueError for more
    spans than fit: :func:`split_spans` groups them), retried as a whole like
    :func:`fetch_range`; :class:`MultiRangeRefused` when the server does not serve many ranges
    in one request. One span is one :func:`fetch_range`; other schemes fetch span by span."""
    check_spans(spans)
    if not url.startswith(HTTP_SCHEMES) or len(spans) == 1:
        return [fetch_range(url, a, b, retry=retry, storage_options=storage_options, abort=abort) for a, b in spans]
    if header_bytes(spans) > MAX_RANGE_HEADER_BYTES:
        raise ValueError(f"{len(spans)} spans need a Range header over {MAX_RANGE_HEADER_BYTES} bytes: split_spans")
    what = describe_spans(spans)

    def attempt() -> list[bytes]:
        return http_ranges(url, spans, Deadline(retry.deadline_s, retry.timeout_s), abort)

    try:
        return _retrying(url, attempt, retry=retry, what=what, abort=abort)
    except ShardFetchError as e:
        if isinstance(e.__cause__, MultiRangeIgnored):
            raise MultiRangeRefused(f"cannot fetch {what}: {e.__cause__}", shard=url) from e.__cause__
        raise
