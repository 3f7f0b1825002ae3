"""One request to a URL, its failure told apart as worth retrying or not: the transport under
:mod:`shardify.remote`, which retries, resumes and checks.

A body (:func:`open_body`) is a GET from a byte on, over ``http(s)://`` with the standard
library or any other scheme through fsspec; :func:`http_range` and :func:`fsspec_range`
fetch one byte range exactly. A failure comes out as :class:`Transient` (a reset, a timeout,
a truncated body, HTTP 429 and 5xx) or :class:`Permanent`; :func:`classify` sorts the rest.
"""

from __future__ import annotations

import http.client
import re
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from shardify import __version__

__all__ = [
    "HTTP_SCHEMES",
    "Transient",
    "Permanent",
    "Complete",
    "HttpBody",
    "FsspecBody",
    "open_body",
    "classify",
    "http_range",
    "fsspec_range",
]

HTTP_SCHEMES = ("http://", "https://")
CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")
PERMANENT_OS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


class Transient(Exception):
    """A failure worth retrying (the message says what happened)."""


class Permanent(Exception):
    """A failure that retrying cannot fix."""


class Complete(Exception):
    """A resumed request found nothing left to fetch (HTTP 416 at exactly the file's end)."""


class HttpBody:
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
            raise http_error(e, start) from e
        self._resp = resp
        self.start, self.total = 0, None
        length = resp.headers.get("Content-Length")
        if resp.status == 206:
            found = resp.headers.get("Content-Range", "")
            m = CONTENT_RANGE.fullmatch(found.strip())
            if m is None or int(m.group(1)) != start:
                self.close()
                raise Permanent(f"asked for Range bytes={start}-, the server answered 206 with Content-Range {found!r}")
            self.start = start
            self.total = int(m.group(3)) if m.group(3) != "*" else None
        elif resp.status == 200:
            self.total = int(length) if length is not None and length.isdigit() else None
        else:
            self.close()
            raise Permanent(f"unexpected HTTP status {resp.status} {resp.reason}")

    def read(self, n: int) -> bytes:
        return bytes(self._resp.read(n))

    def close(self) -> None:
        self._resp.close()


def http_error(e: urllib.error.HTTPError, start: int) -> Exception:
    what = f"HTTP {e.code} {e.reason}"
    if e.code == 429 or e.code >= 500:
        return Transient(what)
    if e.code == 416 and start:
        m = re.fullmatch(r"bytes\s+\*/(\d+)", (e.headers.get("Content-Range") or "").strip())
        if m is not None and int(m.group(1)) == start:
            return Complete()
    return Permanent(what)


def fsspec_fs(url: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    """``(filesystem, path)`` of a non-HTTP URL through fsspec; Permanent when fsspec or its
    backend for the URL's scheme is missing."""
    try:
        import fsspec  # deferred: an optional dependency, needed only for non-HTTP URLs
    except ImportError as e:
        raise Permanent(f"reading {url.split('://', 1)[0]}:// URLs needs fsspec: pip install 'shardify[remote]'") from e
    try:
        fs, path = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    except (ImportError, ValueError) as e:
        raise Permanent(f"no fsspec backend for this URL: {e}") from e
    return fs, path


class FsspecBody:
    """Like :class:`HttpBody`, for any fsspec URL (resumes by seeking)."""

    def __init__(self, url: str, start: int, storage_options: Mapping[str, Any] | None = None) -> None:
        fs, path = fsspec_fs(url, storage_options)
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


def open_body(url: str, start: int, timeout: float, storage_options: Mapping[str, Any] | None) -> HttpBody | FsspecBody:
    if url.startswith(HTTP_SCHEMES):
        return HttpBody(url, start, timeout)
    return FsspecBody(url, start, storage_options)


def classify(e: BaseException) -> Exception:
    """A network error as :class:`Transient` or :class:`Permanent`, with a readable reason."""
    what = f"{type(e).__name__}: {e}"
    if isinstance(e, urllib.error.URLError) and not isinstance(e, urllib.error.HTTPError):
        reason = e.reason
        what = f"{type(reason).__name__}: {reason}"
        if isinstance(reason, socket.gaierror) and reason.errno != socket.EAI_AGAIN:
            return Permanent(f"cannot resolve the host ({what})")
        if isinstance(reason, ssl.SSLCertVerificationError):
            return Permanent(what)
        return Transient(what) if isinstance(reason, OSError) else Permanent(what)
    if isinstance(e, PERMANENT_OS):
        return Permanent(what)
    if isinstance(e, (OSError, http.client.HTTPException, EOFError)):  # reset, timeout, truncated
        return Transient(what)
    return Permanent(what)


def http_range(url: str, start: int, stop: int, timeout: float) -> bytes:
    """Bytes ``start..stop-1`` of ``url`` in one ranged GET, exactly, or Transient/Permanent."""
    headers = {
        "Accept-Encoding": "identity",
        "User-Agent": f"shardify/{__version__}",
        "Range": f"bytes={start}-{stop - 1}",
    }
    try:
        resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as e:
        e.close()
        raise http_error(e, 0) from e
    except Exception as e:
        raise classify(e) from e
    try:
        if resp.status == 200:
            raise Permanent(
                "the server ignores Range (it answered 200 with the whole file); read this dataset "
                "with CacheOptions(ranged=False), which fetches whole shards"
            )
        if resp.status != 206:
            raise Permanent(f"unexpected HTTP status {resp.status} {resp.reason}")
        found = resp.headers.get("Content-Range", "")
        m = CONTENT_RANGE.fullmatch(found.strip())
        if m is None or int(m.group(1)) != start or int(m.group(2)) > stop - 1:
            raise Permanent(f"asked for bytes {start}-{stop - 1}, the server answered Content-Range {found!r}")
        if int(m.group(2)) < stop - 1:
            raise Transient(f"asked for bytes {start}-{stop - 1}, the server sent a shorter range {found!r}")
        try:
            data = bytes(resp.read(stop - start + 1))
        except Exception as e:
            raise classify(e) from e
    finally:
        resp.close()
    if len(data) != stop - start:
        raise Transient(f"connection closed after {len(data)} of {stop - start} bytes")
    return data


def fsspec_range(url: str, start: int, stop: int, storage_options: Mapping[str, Any] | None) -> bytes:
    """Bytes ``start..stop-1`` of an fsspec URL, exactly, or Transient/Permanent."""
    fs, path = fsspec_fs(url, storage_options)
    try:
        data = bytes(fs.cat_file(path, start=start, end=stop))
    except Exception as e:
        raise classify(e) from e
    if len(data) != stop - start:
        raise Transient(f"got {len(data)} of {stop - start} bytes")
    return data
