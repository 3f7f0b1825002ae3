"""Shard checksums given by the user, for ``ShardedDataset(decoding=DecodeOptions(verify=...))`` on shards without a
split index (a list or a pattern, e.g. webdataset shards served over HTTP).

``verify=`` takes a mapping ``{shard: sha256 hex}`` or the path or URL of a sidecar file in
``sha256sum`` format (``<hex>  <name>`` per line, as ``sha256sum *.tar > SHA256SUMS`` writes).
A shard's entry is found by its full URL or path, else by its trailing path components
(``https://host/ds/a-000.tar`` matches ``ds/a-000.tar`` and ``a-000.tar``). The hashes become
the source's own (:attr:`ShardInfo.sha256`), so they are checked exactly like a split index's:
a remote shard when it is fetched, a local one before its first sample is used.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from shardify.errors import ManifestError
from shardify.reader.io.compact import CompactShards
from shardify.reader.io.shardlist import LazySequence
from shardify.reader.io.sources import Source
from shardify.remote import RetryPolicy, ShardFetchError, fetch_bytes, is_remote

__all__ = ["ChecksumSpec", "parse_sha256sums", "load_checksums", "with_checksums", "source_checksums"]

ChecksumSpec = Mapping[str, str] | str | os.PathLike[str]
"""A mapping ``{shard: sha256 hex}``, or the path or URL of a ``sha256sum`` sidecar file."""

_LINE = re.compile(r"(?P<hex>[0-9a-fA-F]{64}) [ *](?P<name>.+)")
_HEX = re.compile(r"[0-9a-f]{64}")


def parse_sha256sums(text: str, *, where: str) -> dict[str, str]:
    """``{name: hex}`` from ``sha256sum`` output; blank lines and ``#`` comments are passed over."""
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.fullmatch(line)
        if m is None:
            raise ManifestError(f"{where}, line {number}: want '<sha256 hex>  <name>', found {line[:120]!r}")
        out[m.group("name")] = m.group("hex").lower()
    if not out:
        raise ManifestError(f"{where}: no checksums")
    return out


def load_checksums(spec: ChecksumSpec, *, retry: RetryPolicy) -> dict[str, str]:
    """The checksums of ``spec``: a mapping as it is (lower-cased and checked), or a sidecar
    file read from its path or URL."""
    if isinstance(spec, Mapping):
        out = {str(k): str(v).lower() for k, v in spec.items()}
        bad = next(((k, v) for k, v in out.items() if not _HEX.fullmatch(v)), None)
        if bad is not None:
            raise ValueError(f"verify= checksum of {bad[0]!r} is {bad[1]!r}, not 64 hex digits of a SHA-256")
        return out
    where = os.fspath(spec)
    try:
        data = fetch_bytes(where, retry=retry) if is_remote(where) else Path(where).read_bytes()
    except (OSError, ShardFetchError) as e:
        raise ManifestError(f"{where}: cannot read the checksum file: {e}") from e
    return parse_sha256sums(data.decode("utf-8", "replace"), where=where)


def _lookup(checksums: Mapping[str, str], url: str) -> str | None:
    if url in checksums:
        return checksums[url]
    parts = url.replace("\\", "/").split("/")
    for i in range(1, len(parts)):
        found = checksums.get("/".join(parts[i:]))
        if found is not None:
            return found
    return None


def with_checksums(source: Source, spec: ChecksumSpec) -> Source:
    """``source`` with each shard's SHA-256 taken from ``spec`` (see the module); a shard
    without an entry raises ValueError naming it."""
    checksums = load_checksums(spec, retry=source.fetch.retry)
    shards = []
    for shard in source.shards:
        found = _lookup(checksums, shard.url)
        if found is None:
            raise ValueError(
                f"verify= has no checksum for shard {shard.url} ({len(checksums)} given, "
                f"matched by URL, path or file name)"
            )
        shards.append(dataclasses.replace(shard, sha256=found))
    return dataclasses.replace(source, shards=tuple(shards))


def source_checksums(source: Source) -> Sequence[str]:
    """Each shard's SHA-256 from the split index (or :func:`with_checksums`), for ``verify=True``;
    a compact index's come from each shard's sidecar (checked against the index's root) when asked for."""
    if isinstance(source.shards, CompactShards):
        return LazySequence(len(source.shards), lambda i: source.full(i).sha256)
    missing = [s.url for s in source.shards if not s.sha256]
    if missing:
        raise ValueError(
            f"verify=True needs each shard's sha256 from a split index, and {missing[0]} has none "
            f"({len(missing)} of {len(source.shards)} shards; shards given as a list or pattern have no manifest: "
            "pass decoding=DecodeOptions(verify={shard: sha256}) or verify='SHA256SUMS', a sha256sum file)"
        )
    return tuple(s.sha256 for s in source.shards)
