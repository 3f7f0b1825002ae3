"""Where a split index may send the reader: only under its own location, unless allowed.

A split index (and the manifest that names it) says where its shards are, as URLs relative
to itself. An index read from ``https://host/data/ds/train.json`` may name shards under
``https://host/data/ds/`` only: not a local path (``file:///etc/...``, ``/etc/...``), not
another scheme or host, not ``../`` above its folder (also when percent-encoded). A local
index is held to its own folder the same way. Other places are read only when the user
lists them in ``allow_locations`` (URL or path prefixes, e.g. ``("s3://mirror/ds/",)``); a
refusal is a :class:`~shardify.errors.LocationError` naming the index and the URL.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from urllib.parse import unquote, urlsplit

from shardify.errors import LocationError

__all__ = ["check_location"]


def _parts(url: str) -> tuple[str, str, str]:
    """``(scheme, host, normalized path)`` of a URL or a local path (scheme ``file``, no host);
    the path is percent-decoded first, so ``%2e%2e`` is ``..`` here as on the server."""
    if "://" in url:
        u = urlsplit(url)
        scheme, host, path = u.scheme.lower(), u.netloc.lower(), unquote(u.path)
    else:
        scheme, host, path = "file", "", os.path.abspath(url)
    if scheme == "file":
        host = ""
    normal = posixpath.normpath("/" + path.lstrip("/")) if path else "/"
    return scheme, host, normal


def _folder(url: str) -> tuple[str, str, str]:
    scheme, host, path = _parts(url)
    return scheme, host, posixpath.dirname(path).rstrip("/") + "/"


def _under(url: str, prefix: tuple[str, str, str]) -> bool:
    scheme, host, path = _parts(url)
    if "://" in url and ".." in unquote(urlsplit(url).path).split("/"):
        return False  # a dot-dot segment left in the URL: the server, not this check, would resolve it
    return (scheme, host) == prefix[:2] and (path + "/").startswith(prefix[2])


def check_location(index_at: str, url: str, *, allow: Sequence[str] = ()) -> None:
    """Raise :class:`LocationError` unless ``url`` (already resolved against ``index_at``) lies
    under the folder of ``index_at`` or under one of the ``allow`` prefixes."""
    if _under(url, _folder(index_at)):
        return
    for prefix in allow:
        scheme, host, path = _parts(prefix)
        if _under(url, (scheme, host, path.rstrip("/") + "/")):
            return
    folder = index_at.rsplit("/", 1)[0] + "/" if "://" in index_at else _folder(index_at)[2]
    raise LocationError(
        f"{index_at}: refuses to read {url}: it is not under the index's own location {folder}; "
        "list its prefix in CacheOptions(allow_locations=...) to read it anyway"
    )
