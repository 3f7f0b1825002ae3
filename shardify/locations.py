"""Where a manifest or split index may send a reader: only under its own location, unless allowed.

A split index (and the manifest that names it) says where its shards are, as URLs relative
to itself. An index read from ``https://host/data/ds/train.json`` may name shards under
``https://host/data/ds/`` only: not a local path (``file:///etc/...``, ``/etc/...``), not
another scheme or host, not ``../`` above its folder (also when percent-encoded). A local
dataset is held to its own folder the same way, after symbolic links are resolved: an index
path that is absolute, climbs out with ``../`` or is a link to a file elsewhere is refused, and
so is a shard or sidecar that is such a link. Other places are read only when the user lists
them in ``allow_locations`` (URL or path prefixes, e.g. ``("s3://mirror/ds/", "/mnt/shared/")``);
a refusal is a :class:`~shardify.errors.LocationError` naming the index and the URL. The reader
(``CacheOptions(allow_locations=...)``) and ``shardify verify`` (``--allow-location``) apply it.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from urllib.parse import unquote, urlsplit

from shardify.errors import LocationError

__all__ = ["check_location", "check_in_folder"]


def _parts(url: str) -> tuple[str, str, str]:
    """``(scheme, host, normalized path)`` of a URL or a local path (scheme ``file``, no host);
    the path is percent-decoded first, so ``%2e%2e`` is ``..`` here as on the server, and a
    local path has its symbolic links resolved (where it really is)."""
    if "://" in url:
        u = urlsplit(url)
        scheme, host, path = u.scheme.lower(), u.netloc.lower(), unquote(u.path)
    else:
        scheme, host, path = "file", "", url
    if scheme == "file":
        host, path = "", os.path.realpath(path or "/")
    normal = posixpath.normpath("/" + path.lstrip("/")) if path else "/"
    return scheme, host, normal


def _prefix(folder: str) -> tuple[str, str, str]:
    """``(scheme, host, path ending in /)`` of the folder ``folder``."""
    scheme, host, path = _parts(folder)
    return scheme, host, path.rstrip("/") + "/"


def _folder_of(url: str) -> str:
    """The folder of the file ``url`` (a URL or a local path), as written, without resolving it."""
    if "://" in url:
        u = urlsplit(url)
        return f"{u.scheme}://{u.netloc}{posixpath.dirname(u.path).rstrip('/')}/"
    return os.path.dirname(os.path.abspath(url))


def _under(url: str, prefix: tuple[str, str, str]) -> bool:
    scheme, host, path = _parts(url)
    if "://" in url and ".." in unquote(urlsplit(url).path).split("/"):
        return False  # a dot-dot segment left in the URL: the server, not this check, would resolve it
    return (scheme, host) == prefix[:2] and (path + "/").startswith(prefix[2])


def check_in_folder(folder: str, url: str, *, allow: Sequence[str] = (), named_by: str = "") -> None:
    """Raise :class:`LocationError` unless ``url`` (a URL, or a local path with its links
    resolved) lies under ``folder`` (also resolved) or under one of the ``allow`` prefixes.
    ``named_by``: the file that names ``url``, for the message (default: ``folder``)."""
    if _under(url, _prefix(folder)) or any(_under(url, _prefix(p)) for p in allow):
        return
    shown = folder.rstrip("/") + "/" if "://" in folder else os.path.abspath(folder).rstrip(os.sep) + os.sep
    real = url if "://" in url else os.path.realpath(url)
    resolved = "" if real == url else f" (which is {real})"
    raise LocationError(
        f"{named_by or shown}: refuses to read {url}{resolved}: it is not under the dataset's own location "
        f"{shown}; list its prefix in CacheOptions(allow_locations=...) to read it anyway"
    )


def check_location(index_at: str, url: str, *, allow: Sequence[str] = ()) -> None:
    """Raise :class:`LocationError` unless ``url`` (already resolved against ``index_at``) lies
    under the folder of ``index_at`` or under one of the ``allow`` prefixes."""
    check_in_folder(_folder_of(index_at), url, allow=allow, named_by=index_at)
