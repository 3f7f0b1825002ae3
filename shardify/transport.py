"""One request to a URL, its failure told apart as worth retrying or not: the transport under
:mod:`shardify.remote`, which retries, resumes and checks.

A body (:func:`open_body`) is a GET from a byte on, over ``http(s)://`` with the standard
library or any other scheme through fsspec; :func:`http_range` and :func:`fsspec_range`
fetch one byte range exactly, :func:`http_range` over the calling thread's kept connection
(:mod:`shardify.keepalive`) unless the environment names a proxy for the host, as
:func:`http_get` sends any GET whose answer a function reads. A failure
comes out as :class:`Transient` (a reset, a timeout, a truncated body, HTTP 429 and 5xx) or
:class:`Permanent`; :func:`classify` sorts the rest. Each request ends by its
:class:`~shardify.fetchcontrol.Deadline` and can be stopped by an
:class:`~shardify.fetchcontrol.Abort` (:mod:`shardify.fetchcontrol`).
"""

from __future__ import annotations

import functools
import http.client
import re
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar

from shardify import __version__
from shardify.fetchcontrol import (
    Abort,
    Complete,
    Deadline,
    Permanent,
    RangeIgnored,
    Transient,
    http_error,
    http_status_error,
    read_timed,
    sock_of,
    urlopen,
)
from shardify.keepalive import TakenBody, connection, taken
from shardify.proxies import proxied

__all__ = [
    "HTTP_SCHEMES",
    "HttpBody",
    "FsspecBody",
    "open_body",
    "classify",
    "http_range",
    "http_get",
    "Check",
    "range_headers",
    "checked_range",
    "fsspec_range",
]

HTTP_SCHEMES = ("http://", "https://")
CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")
REDIRECTS = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 5
DRAIN_BYTES = 64 << 10  # read of a redirect's or an error's body; a longer one closes the connection
IGNORED = "the server ignores Range (it answered 200 with the whole file)"
PERMANENT_OS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
T = TypeVar("T")
Check = Callable[[http.client.HTTPResponse, Deadline, socket.socket | None], T]  # reads an answer (http_get)


class HttpBody:
    """The body of a GET from byte ``start``: ``self.start`` is where it really starts (0 when
    the server ignored the range), ``self.total`` the whole file's size when known. The request
    ends by ``deadline``; ``abort`` can stop it from another thread."""

    def __init__(self, url: str, start: int, deadline: Deadline, abort: Abort | None = None) -> None:
        headers = {"Accept-Encoding": "identity", "User-Agent": f"shardify/{__version__}"}
        if start:
            headers["Range"] = f"bytes={start}-"
        try:
            resp = urlopen(urllib.request.Request(url, headers=headers), deadline, abort)
        except urllib.error.HTTPError as e:
            e.close()
            deadline.done()
            raise http_error(e, start) from e
        except BaseException:
            deadline.done()
            raise
        self._resp, self._deadline, self._abort = resp, deadline, abort
        self._sock = sock_of(resp)
        if abort is not None:
            abort.watch(self._sock)
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
        return read_timed(self._resp, n, self._deadline, self._sock)

    def close(self) -> None:
        self._deadline.done()
        if self._abort is not None:
            self._abort.forget(self._sock)
        self._resp.close()


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


def open_body(
    url: str,
    start: int,
    deadline: Deadline,
    storage_options: Mapping[str, Any] | None,
    abort: Abort | None = None,
) -> HttpBody | FsspecBody | TakenBody:
    """The body of ``url`` from byte ``start``: a whole body offered to this thread
    (:func:`~shardify.fetchcontrol.offered`) when there is one, else a new GET."""
    if url.startswith(HTTP_SCHEMES):
        return taken(url, start) or HttpBody(url, start, deadline, abort)
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


def http_range(
    url: str, start: int, stop: int, deadline: Deadline, abort: Abort | None = None, *, take_whole: bool = False
) -> bytes:
    """Bytes ``start..stop-1`` of ``url`` in one ranged GET, exactly, or Transient/Permanent
    (:class:`RangeIgnored` when the server answers with the whole file; with ``take_whole``
    it carries that answer's body, unread, for the caller to use and close), by ``deadline``;
    ``abort`` stops it from another thread. How the GET is made: :func:`http_get`."""
    check = functools.partial(checked_range, start, stop)
    return http_get(url, range_headers(f"bytes={start}-{stop - 1}"), check, deadline, abort, take_whole=take_whole)


def http_get(
    url: str,
    headers: dict[str, str],
    check: Check[T],
    deadline: Deadline,
    abort: Abort | None = None,
    *,
    take_whole: bool = False,
) -> T:
    """What ``check(answer, deadline, socket)`` makes of the answer to one GET of ``url`` with
    ``headers`` (it reads the body), or Transient/Permanent; a redirect, a status of 400 or more
    and (with ``take_whole``) a 200 are dealt with before ``check`` is called.

    Over the calling thread's kept connection to the host (:mod:`shardify.keepalive`): one the
    server closed since its last answer is reopened once, not counted as a failure; the
    connection is kept only when ``check`` returned and the answer was read to its end.
    Redirects are followed with a new request, at most :data:`MAX_REDIRECTS`, to ``http(s)://``
    only, and not remembered. A host reached through a proxy (``http_proxy``, ``https_proxy``,
    ``no_proxy``) is asked through :mod:`urllib.request`, without a kept connection."""
    origin = url
    for _ in range(MAX_REDIRECTS + 1):
        if proxied(url):
            return _urllib_get(url, headers, check, deadline, abort)
        got = _kept_get(url, headers, check, deadline, abort, origin if take_whole else None)
        if not isinstance(got, _Redirect):
            return got
        url = got.url
    raise Permanent(f"more than {MAX_REDIRECTS} redirects (the last to {url})")


class _Redirect(NamedTuple):
    url: str


def range_headers(ranges: str) -> dict[str, str]:
    """The headers of a GET of ``Range: {ranges}`` (no compression: the ranges are of the file's bytes)."""
    return {"Accept-Encoding": "identity", "User-Agent": f"shardify/{__version__}", "Range": ranges}


def _kept_get(
    url: str, headers: dict[str, str], check: Check[T], deadline: Deadline, abort: Abort | None, take_as: str | None
) -> T | _Redirect:
    """What ``check`` makes of the answer, or the URL a redirect points to; the connection is
    kept only when the whole answer was read and right. With ``take_as`` (a URL), a 200 is
    :class:`RangeIgnored` with its body handed over as the whole of that URL, the request left
    open."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as e:
        raise Permanent(f"bad URL {url!r}: {e}") from e
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if abort is not None:
        abort.check()
    conn = connection(parts.scheme, parts.hostname or "", port, deadline.timeout())
    keep = handed = False
    try:
        resp = _send(conn, target, headers, deadline, abort)
        if resp.status == 200 and take_as is not None:
            handed = True
            raise RangeIgnored(IGNORED, body=TakenBody(take_as, resp, deadline, conn.sock, conn.close))
        if resp.status in REDIRECTS:
            keep = _drain(resp)
            return _Redirect(_redirect_target(url, resp.getheader("Location")))
        if resp.status >= 400:
            _drain(resp)
            raise http_status_error(resp.status, resp.reason, resp.headers, 0)
        data = check(resp, deadline, conn.sock)
        keep = resp.isclosed() and not resp.will_close
        return data
    except (Transient, Permanent, Complete):
        raise
    except Exception as e:
        if abort is not None and abort.fired:
            raise Permanent("no longer wanted (stopped)") from e
        if deadline.expired:
            raise deadline.passed() from e
        raise classify(e) from e
    finally:
        if not handed:
            deadline.done()
            if abort is not None:
                abort.forget(conn.sock)
            if not keep or deadline.expired:  # (a socket shut down just as its answer ended)
                conn.close()


def _send(
    conn: http.client.HTTPConnection, target: str, headers: dict[str, str], deadline: Deadline, abort: Abort | None
) -> http.client.HTTPResponse:
    """The answer's status and headers; a kept connection the server closed is reopened once.
    Its socket is watched by ``deadline`` and ``abort`` from the moment it is connected."""
    reused = conn.sock is not None
    try:
        return _request(conn, target, headers, deadline, abort)
    except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
        if not reused or (abort is not None and abort.fired) or deadline.expired:
            raise
    conn.close()
    return _request(conn, target, headers, deadline, abort)


def _request(
    conn: http.client.HTTPConnection, target: str, headers: dict[str, str], deadline: Deadline, abort: Abort | None
) -> http.client.HTTPResponse:
    if conn.sock is None:
        conn.connect()
    deadline.watch(conn.sock)
    if abort is not None:
        abort.watch(conn.sock)
    conn.request("GET", target, headers=headers)
    return conn.getresponse()


def _drain(resp: http.client.HTTPResponse) -> bool:
    """Read a small answer's body (a redirect's, an error's); whether it ended, so that the
    connection can carry the next request."""
    resp.read(DRAIN_BYTES)
    return resp.isclosed() and not resp.will_close


def _redirect_target(url: str, location: str | None) -> str:
    if not location:
        raise Permanent("a redirect without a Location")
    target = urllib.parse.urljoin(url, location.strip())
    if not target.startswith(HTTP_SCHEMES):
        raise Permanent(f"redirected to {target!r}: only http:// and https:// redirects are followed")
    return target


def _urllib_get(url: str, headers: dict[str, str], check: Check[T], deadline: Deadline, abort: Abort | None) -> T:
    """Like :func:`_kept_get` through :mod:`urllib.request` (its proxies and redirects)."""
    try:
        resp = urlopen(urllib.request.Request(url, headers=headers), deadline, abort)
    except urllib.error.HTTPError as e:
        e.close()
        deadline.done()
        raise http_error(e, 0) from e
    except BaseException as e:
        deadline.done()
        if isinstance(e, (Transient, Permanent)) or not isinstance(e, Exception):
            raise
        raise classify(e) from e
    sock = sock_of(resp)
    if abort is not None:
        abort.watch(sock)
    try:
        return check(resp, deadline, sock)
    except (Transient, Permanent, Complete):
        raise
    except Exception as e:
        raise classify(e) from e
    finally:
        deadline.done()
        if abort is not None:
            abort.forget(sock)
        resp.close()


def checked_range(
    start: int, stop: int, resp: http.client.HTTPResponse, deadline: Deadline, sock: socket.socket | None
) -> bytes:
    """The body of an answer to ``Range: bytes=start-(stop-1)``: exactly those bytes, or
    Transient/Permanent (read one byte past them, so that a chunked body is read to its end).
    An answer of 200 (the whole file) is :class:`RangeIgnored`, its body not read."""
    if resp.status == 200:
        raise RangeIgnored(IGNORED)
    if resp.status != 206:
        raise Permanent(f"unexpected HTTP status {resp.status} {resp.reason}")
    found = resp.headers.get("Content-Range", "")
    m = CONTENT_RANGE.fullmatch(found.strip())
    if m is None or int(m.group(1)) != start or int(m.group(2)) > stop - 1:
        raise Permanent(f"asked for bytes {start}-{stop - 1}, the server answered Content-Range {found!r}")
    if int(m.group(2)) < stop - 1:
        raise Transient(f"asked for bytes {start}-{stop - 1}, the server sent a shorter range {found!r}")
    length = resp.headers.get("Content-Length")
    if length is not None and length.strip() != str(stop - start):
        raise Permanent(f"Content-Range {found!r} with Content-Length {length}")
    try:
        data = read_timed(resp, stop - start + 1, deadline, sock)
    except (Transient, Permanent):
        raise
    except Exception as e:
        raise classify(e) from e
    if len(data) > stop - start:
        raise Transient(f"received more than the {stop - start} bytes of Content-Range {found!r}")
    if len(data) < stop - start:
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
