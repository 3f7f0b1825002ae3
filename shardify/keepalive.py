"""The calling thread's kept HTTP connections: one per ``(scheme, host, port)``, so that ranged
GETs from a fetch thread reuse one connection (no new TCP or TLS handshake per request).

A connection belongs to one thread, so no lock is needed and no two requests ever share a
socket. Whoever sends a request on it reads the answer to its end or closes it
(:meth:`http.client.HTTPConnection.close`); a closed one reconnects on its next request.
A thread's connections are closed when the thread ends (a pool thread ends when its pool is
shut down), at interpreter exit, or by :func:`close_connections`; a forked child never uses
the sockets it inherited from its parent.
"""

from __future__ import annotations

import http.client
import os
import ssl
import threading
import weakref

__all__ = ["connection", "close_connections"]

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
