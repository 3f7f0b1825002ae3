"""Hosts that ignore ``Range``: their shards are read whole, for the rest of the process.

A server that answers a ranged GET with 200 and the whole file (Python's ``http.server``, some
CDNs and proxies) cannot serve :mod:`~shardify.reader.io.ranged`'s reads. The first such answer
puts the host here, with one warning (once per host and process); from then on each of its
shards is fetched whole by its opener (through the node's cache, checked against the index's
size and SHA-256) and the bytes asked for are read from that copy. The body of that first
answer is not wasted: it becomes its shard's copy (checked the same way), so that shard is
fetched once, not twice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import BinaryIO
from urllib.parse import urlsplit

from shardify.fetchcontrol import Body
from shardify.keepalive import TakenBody, offered

__all__ = ["Opener", "reads_whole", "read_whole_from", "range_of_whole"]

log = logging.getLogger("shardify.reader")

Opener = Callable[[str], tuple[BinaryIO, bool]]
"""Opens a shard whole (through the node's cache, checked), as a source's ``open_tar`` does."""

_hosts: set[str] = set()
_lock = threading.Lock()


def reads_whole(url: str) -> bool:
    """Whether ``url``'s host is known to ignore ``Range`` (in this process)."""
    return urlsplit(url).netloc in _hosts


def read_whole_from(url: str) -> None:
    """From now on, this process reads the shards of ``url``'s host whole (warned once per host)."""
    host = urlsplit(url).netloc
    with _lock:
        if host in _hosts:
            return
        _hosts.add(host)
    log.warning(
        "%s: the server ignores Range (it answered a ranged request with the whole file); the shards of "
        "%s are fetched whole from now on. Pass CacheOptions(ranged=False) to skip the ranged attempt",
        url,
        host,
    )


def range_of_whole(opener: Opener, url: str, start: int, stop: int, body: Body | None = None) -> bytes:
    """Bytes ``start..stop-1`` of the shard ``url``, from its whole copy. ``body``: the whole
    shard a ranged GET received (a 200), unread: the copy is made from it, checked like any
    download, instead of asking the server again (closed here)."""
    if body is not None and isinstance(body, TakenBody):
        with offered(body):
            return range_of_whole(opener, url, start, stop)
    if body is not None:
        body.close()
    f, _ = opener(url)
    with f:
        f.seek(start)
        return f.read(stop - start)
