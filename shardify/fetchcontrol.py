"""What bounds one request and tells its failures apart: the failure kinds
(:class:`Transient`, worth retrying; :class:`Permanent`; :class:`Complete`), its
:class:`Deadline` (connecting, headers and the whole body within ``seconds``, each socket
operation within ``read_timeout``) and :class:`Abort` (another thread stops it by shutting down
its socket: a blocked read returns at once). Used by :mod:`shardify.transport` and
:mod:`shardify.remote`.

A deadline is enforced by one watchdog thread per process (a daemon, started with the first
request): it keeps a heap of the requests in flight by their end and, when one passes it,
shuts down that request's socket, so a server trickling its status line, headers or body
cannot hold a request past ``seconds``. A request registers its socket with
:meth:`Deadline.watch` and unregisters with :meth:`Deadline.done` (no thread per request);
:func:`urlopen` registers each connection urllib makes as soon as it connects.
"""

from __future__ import annotations

import email.utils
import heapq
import http.client
import itertools
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from email.message import Message
from typing import Any, Protocol

from shardify.proxies import proxy_values

__all__ = [
    "Body",
    "Transient",
    "Permanent",
    "Complete",
    "RangeIgnored",
    "http_error",
    "http_status_error",
    "Deadline",
    "Abort",
    "sock_of",
    "read_timed",
    "retry_after",
    "urlopen",
]


class Transient(Exception):
    """A failure worth retrying (the message says what happened); ``retry_after``: the seconds
    the server asked to wait (``Retry-After``), None when it did not say."""

    def __init__(self, what: str, *, retry_after: float | None = None) -> None:
        super().__init__(what)
        self.retry_after = retry_after


class Permanent(Exception):
    """A failure that retrying cannot fix."""


class Complete(Exception):
    """A resumed request found nothing left to fetch (HTTP 416 at exactly the file's end)."""


class Body(Protocol):
    """A GET's body from byte ``start`` (of a file of ``total`` bytes, when known)."""

    start: int
    total: int | None

    def read(self, n: int) -> bytes: ...

    def close(self) -> None: ...


class RangeIgnored(Permanent):
    """A ranged GET answered 200 with the whole file: the server ignores ``Range``. ``body``:
    that answer's body, unread, when the caller asked to be handed it (see :func:`offered`)."""

    def __init__(self, what: str, *, body: Body | None = None) -> None:
        super().__init__(what)
        self.body = body


class Deadline:
    """When one request must be over, from connecting to its last byte: ``seconds`` from now;
    each socket operation waits at most ``read_timeout`` seconds, and never past the end. The
    sockets passed to :meth:`watch` are shut down by the watchdog when the end passes (until
    :meth:`done`), whatever the server sends meanwhile."""

    def __init__(self, seconds: float, read_timeout: float) -> None:
        self.seconds, self.read_timeout = seconds, read_timeout
        self.end = time.monotonic() + seconds
        self._abort: Abort | None = None
        self._entry: list[Any] | None = None

    def timeout(self) -> float:
        """Seconds the next socket operation may wait; Transient once the deadline has passed."""
        left = self.end - time.monotonic()
        if left <= 0 or self.expired:
            raise self.passed()
        return min(self.read_timeout, left)

    def passed(self) -> Transient:
        return Transient(f"no complete answer within the request deadline of {self.seconds:g} s")

    @property
    def expired(self) -> bool:
        """Whether the watchdog has shut this request's sockets down (its end passed)."""
        return self._abort is not None and self._abort.fired

    def watch(self, sock: socket.socket | None) -> None:
        """Shut ``sock`` down when the end passes (at once, if it has)."""
        if sock is None:
            return
        if self._abort is None:
            self._abort = Abort()
            self._entry = _WATCHDOG.add(self.end, self._abort)
        self._abort.watch(sock)

    def done(self) -> None:
        """The request is over: the watchdog forgets it (its sockets are no longer shut down)."""
        if self._entry is not None:
            _WATCHDOG.remove(self._entry)
            self._entry = None


class _Watchdog:
    """The process's one thread that fires the :class:`Abort` of each request whose deadline
    passed: a heap of ``[end, seq, abort]`` (``abort`` None once the request is done)."""

    def __init__(self) -> None:
        self._heap: list[list[Any]] = []
        self._removed = 0
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, end: float, abort: Abort) -> list[Any]:
        entry: list[Any] = [end, next(self._seq), abort]
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="shardify-deadlines", daemon=True)
                self._thread.start()
            heapq.heappush(self._heap, entry)
            if self._heap[0] is entry:
                self._cond.notify()
        return entry

    def remove(self, entry: list[Any]) -> None:
        with self._cond:
            if entry[2] is None:
                return
            entry[2] = None
            self._removed += 1
            if self._removed > 64 and self._removed * 2 > len(self._heap):  # done requests weigh no more than live ones
                self._heap = [e for e in self._heap if e[2] is not None]
                heapq.heapify(self._heap)
                self._removed = 0

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    while self._heap and self._heap[0][2] is None:
                        heapq.heappop(self._heap)
                        self._removed -= 1
                    if not self._heap:
                        self._cond.wait()
                        continue
                    left = self._heap[0][0] - time.monotonic()
                    if left <= 0:
                        abort = heapq.heappop(self._heap)[2]
                        break
                    self._cond.wait(left)
            abort.fire()

    def forked(self) -> None:
        """In a forked child: the parent's thread and requests are not here."""
        self.__init__()  # type: ignore[misc]


_WATCHDOG = _Watchdog()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WATCHDOG.forked)


class Abort:
    """Stops the requests it is passed to, from another thread: :meth:`fire` shuts down the
    sockets they use (a blocked read returns at once) and makes their next step fail."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._socks: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def fired(self) -> bool:
        return self._event.is_set()

    def sleep(self, seconds: float) -> bool:
        """Wait ``seconds`` unless fired first; whether it was fired."""
        return self._event.wait(seconds)

    def watch(self, sock: socket.socket | None) -> None:
        """Shut ``sock`` down when fired (at once, if fired already)."""
        if sock is None:
            return
        with self._lock:
            self._socks.add(sock)
            if not self.fired:
                return
        _shut(sock)

    def forget(self, sock: socket.socket | None) -> None:
        with self._lock:
            self._socks.discard(sock)

    def fire(self) -> None:
        with self._lock:
            self._event.set()
            socks, self._socks = list(self._socks), set()
        for sock in socks:
            _shut(sock)

    def check(self) -> None:
        if self.fired:
            raise Permanent("no longer wanted (stopped)")


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # closed already, or never connected
        pass


def sock_of(resp: http.client.HTTPResponse) -> socket.socket | None:
    """The socket under an answer (urllib's responses do not name it)."""
    raw = getattr(getattr(resp, "fp", None), "raw", None)
    sock = getattr(raw, "_sock", None)
    return sock if isinstance(sock, socket.socket) else None


def read_timed(resp: http.client.HTTPResponse, n: int, deadline: Deadline, sock: socket.socket | None) -> bytes:
    """Up to ``n`` bytes of ``resp``'s body (fewer only at its end), each socket read bounded by
    ``deadline`` (a trickle cannot stretch one read past it)."""
    parts: list[bytes] = []
    got = 0
    while got < n and not resp.isclosed():
        wait = deadline.timeout()
        if sock is not None and sock.fileno() != -1:
            sock.settimeout(wait)
        try:
            piece = resp.read1(n - got)
        except (OSError, http.client.HTTPException) as e:
            if deadline.expired or (isinstance(e, TimeoutError) and wait < deadline.read_timeout):
                raise deadline.passed() from e  # the read was cut short by the deadline
            raise
        if not piece:
            if deadline.expired:
                raise deadline.passed()
            resp.read(0)  # at the body's known end: marks the answer complete (the connection can be kept)
            break
        parts.append(piece)
        got += len(piece)
    return b"".join(parts)


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """The seconds a ``Retry-After`` header asks to wait (delay-seconds or an HTTP-date); None
    when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def http_error(e: urllib.error.HTTPError, start: int) -> Exception:
    return http_status_error(e.code, e.reason, e.headers, start)


def http_status_error(code: int, reason: str, headers: Message, start: int) -> Exception:
    """An HTTP error status as Transient (429, 5xx), Complete (416 at exactly ``start``, the
    file's end, when resuming) or Permanent."""
    what = f"HTTP {code} {reason}"
    if code == 429 or code >= 500:
        return Transient(what, retry_after=retry_after(headers.get("Retry-After")) if headers else None)
    if code == 416 and start:
        m = re.fullmatch(r"bytes\s+\*/(\d+)", (headers.get("Content-Range") or "").strip())
        if m is not None and int(m.group(1)) == start:
            return Complete()
    return Permanent(what)


_opening = threading.local()  # the deadline and abort of the urllib request being opened in this thread


def _watch_new(sock: socket.socket | None) -> None:
    """A urllib request's new connection: watched by its deadline and abort from the start,
    so that a server trickling its headers cannot hold it."""
    deadline: Deadline | None = getattr(_opening, "deadline", None)
    abort: Abort | None = getattr(_opening, "abort", None)
    if deadline is not None:
        deadline.watch(sock)
    if abort is not None:
        abort.watch(sock)


class _WatchedHTTP(http.client.HTTPConnection):
    def connect(self) -> None:
        super().connect()
        _watch_new(self.sock)


class _WatchedHTTPS(http.client.HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        _watch_new(self.sock)


class _HTTPHandler(urllib.request.HTTPHandler):
    def do_open(self, http_class: Any, req: urllib.request.Request, **kw: Any) -> http.client.HTTPResponse:
        return super().do_open(_WatchedHTTP, req, **kw)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def do_open(self, http_class: Any, req: urllib.request.Request, **kw: Any) -> http.client.HTTPResponse:
        return super().do_open(_WatchedHTTPS, req, **kw)


class _HttpRedirects(urllib.request.HTTPRedirectHandler):
    """Follows redirects to ``http(s)://`` only (urllib's own also follows ``ftp://``)."""

    def redirect_request(
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: http.client.HTTPMessage, newurl: str
    ) -> urllib.request.Request | None:
        if not newurl.startswith(("http://", "https://")):
            raise Permanent(f"redirected to {newurl!r}: only http:// and https:// redirects are followed")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENERS: dict[tuple[object, ...], urllib.request.OpenerDirector] = {}
"""urllib openers by the values of the proxy variables they were built under (an opener's
proxies are read from the environment when it is built)."""


def _opener() -> urllib.request.OpenerDirector:
    """The opener for the proxy variables' values now."""
    key = proxy_values()
    opener = _OPENERS.get(key)
    if opener is None:
        if len(_OPENERS) >= 16:
            _OPENERS.clear()
        opener = _OPENERS[key] = urllib.request.build_opener(_HTTPHandler, _HTTPSHandler, _HttpRedirects)
    return opener


def urlopen(req: urllib.request.Request, deadline: Deadline, abort: Abort | None) -> http.client.HTTPResponse:
    """:func:`urllib.request.urlopen` (proxies, redirects) with each connection it makes
    watched by ``deadline`` and ``abort`` from the moment it connects: status line and
    headers are bound by the deadline too. Its failures are raised as they come, except one
    cut short by the deadline: Transient saying so."""
    opener = _opener()
    _opening.deadline, _opening.abort = deadline, abort
    try:
        resp: http.client.HTTPResponse = opener.open(req, timeout=deadline.timeout())
        return resp
    except urllib.error.HTTPError:
        raise
    except Exception as e:
        if deadline.expired:
            raise deadline.passed() from e
        raise
    finally:
        _opening.deadline = _opening.abort = None
