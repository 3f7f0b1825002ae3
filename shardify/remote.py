"""Fetching URLs: ``http(s)://`` with the standard library, any other scheme through fsspec.

A download streams into a file in chunks (memory holds one chunk), retries transient
failures (connection reset or refused, timeouts, truncated bodies, HTTP 429 and 5xx) with
exponential backoff within a :class:`RetryPolicy`, and resumes where it stopped: HTTP with
``Range: bytes=N-`` (checked against the answer's ``Content-Range``; a server that ignores
the range and answers 200 restarts the file from byte 0, what was received is discarded),
fsspec with a seek. Sizes are checked against ``Content-Length`` and the manifest, the
SHA-256 against the manifest when it is known.

:func:`fetch_range` fetches one byte range (``Range: bytes=a-b``, fsspec ``cat_file``) and
returns exactly those bytes: a server that answers 200 with the whole file (it ignores
Range) is refused at once, a shorter range or a connection dropped mid-range is retried
within the policy, then refused; never are other bytes returned.

The I/O that the converter (reading a dataset's own files back, ``shardify verify`` of a remote
dataset) and the reader share, beside the format: neither side imports the other for it.
"""

from __future__ import annotations

import hashlib
import http.client
import io
import logging
import posixpath
import random
import re
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

from shardify import __version__
from shardify.errors import ShardFormatError

__all__ = ["RetryPolicy", "ShardFetchError", "is_remote", "join_url", "download", "fetch_bytes", "fetch_range"]

log = logging.getLogger("shardify.reader")

_HTTP = ("http://", "https://")
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")
_PERMANENT_OS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try a URL: ``retries`` attempts after the first failure, waiting
    ``backoff_s`` seconds and doubling up to ``max_backoff_s`` (so at most
    ``retries * max_backoff_s`` seconds asleep); ``timeout_s`` bounds connecting and each
    read; ``chunk_bytes`` is the memory one download holds."""

    retries: int = 5
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    timeout_s: float = 60.0
    chunk_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError(f"{self.retries=} should be >= 0")
        if self.backoff_s < 0 or self.max_backoff_s < self.backoff_s:
            raise ValueError(f"{self.backoff_s=} and {self.max_backoff_s=} should be 0 <= backoff_s <= max_backoff_s")
        if self.timeout_s <= 0 or self.chunk_bytes < 1:
            raise ValueError(f"{self.timeout_s=} should be > 0 and {self.chunk_bytes=} >= 1")

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failure (jittered, never above ``max_backoff_s``)."""
        base = min(self.max_backoff_s, self.backoff_s * 2.0 ** (failures - 1))
        return base * random.uniform(0.5, 1.0)


class ShardFetchError(ShardFormatError):
    """A remote shard could not be fetched: a permanent error, or the retry budget ran out.

    The message names the URL and the last cause; a subclass of
    :class:`~shardify.errors.ShardFormatError` so readers treat it like an unreadable shard.
    """


class _Transient(Exception):
    """A failure worth retrying (the message says what happened)."""


class _Permanent(Exception):
    """A failure that retrying cannot fix."""


class _Complete(Exception):
    """A resumed request found nothing left to fetch (HTTP 416 at exactly the file's end)."""


def is_remote(url: str) -> bool:
    """Whether ``url`` needs fetching (any scheme but ``file://``); local paths are not."""
    return "://" in url and not url.startswith("file://")


def join_url(base: str, relative: str) -> str:
    """``relative`` (a shard's ``url`` in a split index) resolved against the URL ``base`` of
    the index: like a browser for ``http(s)``, by path for other schemes (``s3://b/ds/x.json``
    and ``x.tar`` give ``s3://b/ds/x.tar``); an absolute URL stays as it is."""
    if "://" in relative:
        return relative
    if base.startswith(_HTTP):
        return urllib.parse.urljoin(base, relative)
    scheme, rest = base.split("://", 1)
    folder = rest.rsplit("/", 1)[0] if "/" in rest else rest
    return f"{scheme}://{posixpath.normpath(posixpath.join(folder, relative))}"


class _HttpBody:
    """The body of a GET from byte ``start``: ``self.start`` is where it really starts (0 when
    the server ignored the range), ``self.total`` the whole file's size when known."""

    def __init__(self, url: str, start: int, timeout: float) -> None:
        headers = {"Accept-Encoding": "identity", "User-Agent": f"shardify/{__version__}"}
        if start:
            headers["Range"] = f"bytes={start}-"
        try:
            resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
        except urllib.error.HTTPError as e:
            e.close()
            raise _http_error(e, start) from e
        self._resp = resp
        self.start, self.total = 0, None
        length = resp.headers.get("Content-Length")
        if resp.status == 206:
            found = resp.headers.get("Content-Range", "")
            m = _CONTENT_RANGE.fullmatch(found.strip())
            if m is None or int(m.group(1)) != start:
                self.close()
                raise _Permanent(
                    f"asked for Range bytes={start}-, the server answered 206 with Content-Range {found!r}"
                )
            self.start = start
            self.total = int(m.group(3)) if m.group(3) != "*" else None
        elif resp.status == 200:
            self.total = int(length) if length is not None and length.isdigit() else None
        else:
            self.close()
            raise _Permanent(f"unexpected HTTP status {resp.status} {resp.reason}")

    def read(self, n: int) -> bytes:
        return self._resp.read(n)

    def close(self) -> None:
        self._resp.close()


def _http_error(e: urllib.error.HTTPError, start: int) -> Exception:
    what = f"HTTP {e.code} {e.reason}"
    if e.code == 429 or e.code >= 500:
        return _Transient(what)
    if e.code == 416 and start:
        m = re.fullmatch(r"bytes\s+\*/(\d+)", (e.headers.get("Content-Range") or "").strip())
        if m is not None and int(m.group(1)) == start:
            return _Complete()
    return _Permanent(what)


def _fsspec_fs(url: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    """``(filesystem, path)`` of a non-HTTP URL through fsspec; _Permanent when fsspec or its
    backend for the URL's scheme is missing."""
    try:
        import fsspec  # deferred: an optional dependency, needed only for non-HTTP URLs
    except ImportError as e:
        raise _Permanent(
            f"reading {url.split('://', 1)[0]}:// URLs needs fsspec: pip install 'shardify[remote]'"
        ) from e
    try:
        fs, path = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    except (ImportError, ValueError) as e:
        raise _Permanent(f"no fsspec backend for this URL: {e}") from e
    return fs, path


class _FsspecBody:
    """Like :class:`_HttpBody`, for any fsspec URL (resumes by seeking)."""

    def __init__(self, url: str, start: int, storage_options: Mapping[str, Any] | None = None) -> None:
        fs, path = _fsspec_fs(url, storage_options)
        self._f: Any = fs.open(path, "rb")
        size = getattr(self._f, "size", None)
        self.start, self.total = start, size if isinstance(size, int) else None
        try:
            self._f.seek(start)
        except BaseException:
            self._f.close()
            raise

    def read(self, n: int) -> bytes:
        return bytes(self._f.read(n))

    def close(self) -> None:
        self._f.close()


def _open_body(
    url: str, start: int, timeout: float, storage_options: Mapping[str, Any] | None
) -> _HttpBody | _FsspecBody:
    if url.startswith(_HTTP):
        return _HttpBody(url, start, timeout)
    return _FsspecBody(url, start, storage_options)


def _classify(e: BaseException) -> Exception:
    """A network error as :class:`_Transient` or :class:`_Permanent`, with a readable reason."""
    what = f"{type(e).__name__}: {e}"
    if isinstance(e, urllib.error.URLError) and not isinstance(e, urllib.error.HTTPError):
        reason = e.reason
        what = f"{type(reason).__name__}: {reason}"
        if isinstance(reason, socket.gaierror) and reason.errno != socket.EAI_AGAIN:
            return _Permanent(f"cannot resolve the host ({what})")
        if isinstance(reason, ssl.SSLCertVerificationError):
            return _Permanent(what)
        return _Transient(what) if isinstance(reason, OSError) else _Permanent(what)
    if isinstance(e, _PERMANENT_OS):
        return _Permanent(what)
    if isinstance(e, (OSError, http.client.HTTPException, EOFError)):  # reset, timeout, truncated
        return _Transient(what)
    return _Permanent(what)


class _Progress:
    """What one download has written so far: the destination, its length and running SHA-256."""

    def __init__(self, url: str, dest: BinaryIO, *, sha256: str, max_bytes: int | None) -> None:
        self.url, self.dest, self.max_bytes = url, dest, max_bytes
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
        if self.max_bytes is not None and self.pos + len(chunk) > self.max_bytes:
            raise _Permanent(f"larger than {self.max_bytes} bytes; is this the right URL?")
        try:
            self.dest.write(chunk)
        except OSError as e:  # the local disk, not the network: never retried
            raise _Permanent(f"cannot write {getattr(self.dest, 'name', 'the download')}: {e}") from e
        if self.hasher is not None:
            self.hasher.update(chunk)
        self.pos += len(chunk)

    def check_sha(self) -> None:
        if self.hasher is not None and self.hasher.hexdigest() != self.want_sha:
            got = self.hasher.hexdigest()
            self.restart()
            raise _Transient(f"sha256 is {got}, the manifest says {self.want_sha}")


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
    failures = 0
    while True:
        try:
            try:
                _attempt(done, retry=retry, size=size, storage_options=storage_options)
            except _Complete:
                pass
            done.check_sha()
            return done.pos
        except _Permanent as e:
            raise ShardFetchError(f"cannot fetch: {e}", shard=url) from e
        except _Transient as e:
            failures += 1
            if failures > retry.retries:
                raise ShardFetchError(
                    f"gave up after {failures} attempts ({done.pos} bytes received); last cause: {e}", shard=url
                ) from e
            wait = retry.delay(failures)
            log.warning(
                "%s: %s; retry %d of %d in %.2f s from byte %d", url, e, failures, retry.retries, wait, done.pos
            )
            time.sleep(wait)


def _attempt(
    done: _Progress, *, retry: RetryPolicy, size: int | None, storage_options: Mapping[str, Any] | None
) -> None:
    """One request from byte ``done.pos`` to the end of the file."""
    url = done.url
    try:
        body = _open_body(url, done.pos, retry.timeout_s, storage_options)
    except (_Transient, _Permanent, _Complete):
        raise
    except Exception as e:
        raise _classify(e) from e
    try:
        if body.start != done.pos:
            log.warning("%s: the server ignored Range bytes=%d- (answered 200); restarting from byte 0", url, done.pos)
            done.restart()
        total = body.total
        if size is not None and total is not None and total != size:
            raise _Permanent(f"the server says {total} bytes, the manifest says {size}")
        while True:
            try:
                chunk = body.read(retry.chunk_bytes)
            except Exception as e:
                raise _classify(e) from e
            if not chunk:
                break
            done.write(chunk)
    finally:
        body.close()
    want = total if total is not None else size
    if want is not None and done.pos < want:
        raise _Transient(f"connection closed after {done.pos} of {want} bytes")
    if want is not None and done.pos > want:
        raise _Permanent(f"received {done.pos} bytes, expected {want}")


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
    cancelled: Callable[[], bool] | None = None,
) -> bytes:
    """Bytes ``start..stop-1`` of the file at ``url``, exactly (see the module); raises
    :class:`ShardFetchError` naming ``url`` and the range. ``cancelled``: asked before each
    retry; when it says True, the fetch stops (its bytes are no longer wanted)."""
    failures = 0
    while True:
        try:
            if url.startswith(_HTTP):
                return _http_range(url, start, stop, retry.timeout_s)
            return _fsspec_range(url, start, stop, storage_options)
        except _Permanent as e:
            raise ShardFetchError(f"cannot fetch bytes {start}-{stop - 1}: {e}", shard=url) from e
        except _Transient as e:
            failures += 1
            if cancelled is not None and cancelled():
                raise ShardFetchError(f"bytes {start}-{stop - 1}: {e}; no longer wanted, not retried", shard=url) from e
            if failures > retry.retries:
                raise ShardFetchError(
                    f"bytes {start}-{stop - 1}: gave up after {failures} attempts; last cause: {e}", shard=url
                ) from e
            wait = retry.delay(failures)
            log.warning(
                "%s: bytes %d-%d: %s; retry %d of %d in %.2f s", url, start, stop - 1, e, failures, retry.retries, wait
            )
            time.sleep(wait)


def _http_range(url: str, start: int, stop: int, timeout: float) -> bytes:
    headers = {
        "Accept-Encoding": "identity",
        "User-Agent": f"shardify/{__version__}",
        "Range": f"bytes={start}-{stop - 1}",
    }
    try:
        resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as e:
        e.close()
        raise _http_error(e, 0) from e
    except Exception as e:
        raise _classify(e) from e
    try:
        if resp.status == 200:
            raise _Permanent(
                "the server ignores Range (it answered 200 with the whole file); read this dataset "
                "with CacheOptions(ranged=False), which fetches whole shards"
            )
        if resp.status != 206:
            raise _Permanent(f"unexpected HTTP status {resp.status} {resp.reason}")
        found = resp.headers.get("Content-Range", "")
        m = _CONTENT_RANGE.fullmatch(found.strip())
        if m is None or int(m.group(1)) != start or int(m.group(2)) > stop - 1:
            raise _Permanent(f"asked for bytes {start}-{stop - 1}, the server answered Content-Range {found!r}")
        if int(m.group(2)) < stop - 1:
            raise _Transient(f"asked for bytes {start}-{stop - 1}, the server sent a shorter range {found!r}")
        try:
            data = resp.read(stop - start + 1)
        except Exception as e:
            raise _classify(e) from e
    finally:
        resp.close()
    if len(data) != stop - start:
        raise _Transient(f"connection closed after {len(data)} of {stop - start} bytes")
    return data


def _fsspec_range(url: str, start: int, stop: int, storage_options: Mapping[str, Any] | None) -> bytes:
    fs, path = _fsspec_fs(url, storage_options)
    try:
        data = bytes(fs.cat_file(path, start=start, end=stop))
    except Exception as e:
        raise _classify(e) from e
    if len(data) != stop - start:
        raise _Transient(f"got {len(data)} of {stop - start} bytes")
    return data
