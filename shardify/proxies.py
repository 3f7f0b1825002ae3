"""Whether a request goes through a proxy, as the environment says (``http_proxy``,
``https_proxy``, ``all_proxy``, ``no_proxy``), the way :mod:`urllib.request` decides it.

urllib's own answer walks the whole environment at every call (about 190 us, as much as a ranged
request on loopback); :func:`proxied` remembers it per scheme, host and the values of
:data:`PROXY_VARIABLES`, so a proxy set, bypassed or removed between two requests is still seen
at the next.
"""

from __future__ import annotations

import os
import urllib.parse
import urllib.request

__all__ = ["PROXY_VARIABLES", "proxied", "proxy_values"]

PROXY_VARIABLES = tuple(
    name
    for base in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "request_method")
    for name in (base, base.upper())
)
"""The environment variables :func:`urllib.request.getproxies` reads for ``http(s)://`` (and CGI's
``REQUEST_METHOD``, under which it ignores ``HTTP_PROXY``)."""

_PROXIED: dict[tuple[str, str, tuple[object, ...]], bool] = {}


def proxy_values() -> tuple[object, ...]:
    """The values of :data:`PROXY_VARIABLES` now (None for those unset): read from the mapping
    ``os.environ`` keeps (its keys encoded as it encodes them), not through ``os.environ.get``,
    which encodes each name and decodes each value (~1 us a variable)."""
    env = os.environ
    data, encode = getattr(env, "_data", None), getattr(env, "encodekey", None)
    if not isinstance(data, dict) or encode is None:
        return tuple(env.get(name) for name in PROXY_VARIABLES)
    keys = _ENCODED.get(encode)
    if keys is None:
        keys = _ENCODED[encode] = tuple(encode(name) for name in PROXY_VARIABLES)
    return tuple(map(data.get, keys))


_ENCODED: dict[object, tuple[object, ...]] = {}


def proxied(url: str) -> bool:
    """Whether urllib would send a request for ``url`` through a proxy (as the environment says).
    Remembered per scheme, host and the values of :data:`PROXY_VARIABLES` (see the module)."""
    scheme, netloc = urllib.parse.urlsplit(url)[:2]
    key = (scheme, netloc, proxy_values())
    found = _PROXIED.get(key)
    if found is None:
        found = scheme in urllib.request.getproxies() and not urllib.request.proxy_bypass(netloc)
        if len(_PROXIED) >= 1024:
            _PROXIED.clear()
        _PROXIED[key] = found
    return found
