"""The calling thread's kept HTTP connections: one per ``(scheme, host, port)``, so that ranged
GETs from a fetch thread reuse one connection (no new TCP or TLS handshake per request).

A connection belongs to one thread, so no lock is needed and no two requests ever share a
socket. Whoever sends a request on it reads the answer to its end or closes it
(:meth:`http.client.HTTPConnection.close`); a closed one reconnects on its next request.
A thread's connections are closed when the thread ends (a pool thread ends when its pool is
shut down), at interpreter exit, or by :func:`close_connections`; a forked child never uses
the sockets it inherited from its parent.

An answer of 200 to a ranged GET (the whole file) can be handed over unread
(:class:`TakenBody`): :func:`offered` lets the thread's next whole GET of that file read it
instead of asking again.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import ssl
import threading
import weakref
from collections.abc import Callable, Iterator

from shardify.fetchcontrol import Deadline, read_timed

__all__ = ["connection", "close_connections", "TakenBody", "offered", "taken"]

Key = tuple[str, str, int]
"""``(scheme, host, port)``."""


class _Kept:
    """One thread's connections (in one process)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.conns: dict[Key, http.client.HTTPConnection] = {}
        self.tls: ssl.SSLContext | None = None
        weakref.finalize(self, _close_all, self.conns)  # when the thread's locals go: it ended


def _close_all(conns: dict[Key, http.client.HTTPConnection]) -> None:
    for conn in conns.values():
        conn.close()
    conns.clear()


_local = threading.local()


def _kept() -> _Kept:
    kept: _Kept | None = getattr(_local, "kept", None)
    if kept is None or kept.pid != os.getpid():
        if kept is not None:  # a forked child: its parent's sockets (closing our copy leaves theirs open)
            _close_all(kept.conns)
        kept = _local.kept = _Kept()
    return kept


def connection(scheme: str, host: str, port: int, timeout: float) -> http.client.HTTPConnection:
    """The calling thread's connection to ``scheme://host:port`` (``http`` or ``https``), made
    when first asked for; ``timeout`` (seconds) bounds connecting and each read. Its ``sock``
    is None until it connects, or after it was closed."""
    kept = _kept()
    conn = kept.conns.get((scheme, host, port))
    if conn is None:
        if scheme == "https":
            if kept.tls is None:
                kept.tls = ssl.create_default_context()
                kept.tls.set_alpn_protocols(["http/1.1"])
            conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=kept.tls)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        kept.conns[(scheme, host, port)] = conn
    elif conn.timeout != timeout:
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
    return conn


def close_connections() -> None:
    """Close the calling thread's connections now (they reconnect when next used)."""
    kept: _Kept | None = getattr(_local, "kept", None)
    if kept is not None and kept.pid == os.getpid():
        _close_all(kept.conns)


class TakenBody:
    """The whole file that a ranged GET of ``url`` received (a 200) instead of its range, not
    yet read: read like an :class:`~shardify.transport.HttpBody` from byte 0, under that
    request's ``deadline``; :meth:`close` ends the request (``closer`` closes its connection)."""

    start = 0

    def __init__(
        self,
        url: str,
        resp: http.client.HTTPResponse,
        deadline: Deadline,
        sock: socket.socket | None,
        closer: Callable[[], None],
    ) -> None:
        self.url, self._resp, self._deadline, self._sock, self._closer = url, resp, deadline, sock, closer
        length = resp.headers.get("Content-Length")
        self.total = int(length) if length is not None and length.isdigit() else None
        self._closed = False

    def read(self, n: int) -> bytes:
        return read_timed(self._resp, n, self._deadline, self._sock)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._deadline.done()
            self._closer()


_offers = threading.local()


@contextlib.contextmanager
def offered(body: TakenBody) -> Iterator[None]:
    """Within the block, the calling thread's next whole GET of ``body.url`` from byte 0 reads
    ``body`` instead of asking the server again (:func:`taken`); closed at the end if unused."""
    _offers.body = body
    try:
        yield
    finally:
        _offers.body = None
        body.close()


def taken(url: str, start: int) -> TakenBody | None:
    """The body offered to the calling thread for a GET of ``url`` from ``start``, if any (once)."""
    body: TakenBody | None = getattr(_offers, "body", None)
    if body is None or start != 0 or body.url != url:
        return None
    _offers.body = None
    return body
