"""Key rules of the shard format: what a sample key and a member name may be.

A key is ASCII, starts with a letter or digit, holds only ``[A-Za-z0-9_-]`` (so no
``.``: webdataset and wids split a member name at the first dot of its base name), and
``{key}.{ext}`` fits the 100-byte ustar name field, so no PAX or GNU long-name headers are
ever needed and ``wids`` can index the shards.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import overload

import numpy as np

from shardify.errors import KeyRuleError
from shardify.records import Records, Repeats, repeated

__all__ = [
    "MAX_MEMBER_NAME",
    "MAX_KEY_LENGTH",
    "MAX_EXT_LENGTH",
    "KEY_RE",
    "EXT_RE",
    "check_key",
    "check_ext",
    "member_name",
    "split_member_name",
    "key_from_name",
    "assign_keys",
    "candidate_keys",
    "KeyList",
]

MAX_MEMBER_NAME = 100
"""Bytes in the ustar name field; every member name fits it."""
MAX_EXT_LENGTH = 19
"""Longest extension (without the dot) a member may have."""
MAX_KEY_LENGTH = MAX_MEMBER_NAME - 1 - MAX_EXT_LENGTH
"""Longest key, so that any allowed extension still fits (80 bytes)."""

KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*\Z")
EXT_RE = re.compile(r"[a-z0-9][a-z0-9_-]*(\.[a-z0-9][a-z0-9_-]*)*\Z")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_FIRST_BYTE = np.array([chr(b).isascii() and chr(b).isalnum() for b in range(256)])
"""The bytes a key may start with (as :data:`KEY_RE`): a table for :func:`_check_all`."""
_KEY_BYTE = _FIRST_BYTE | np.isin(np.arange(256), [ord("_"), ord("-")])
"""The bytes a key may hold."""
_HASH_LEN = 10


def check_key(key: str) -> str:
    """Return ``key`` if it obeys the key rules, else raise :class:`KeyRuleError`."""
    if not isinstance(key, str) or not KEY_RE.match(key) or len(key) > MAX_KEY_LENGTH:
        raise KeyRuleError(
            f"key {key!r} breaks the key rules: want 1..{MAX_KEY_LENGTH} characters of "
            "[A-Za-z0-9_-], starting with a letter or digit"
        )
    return key


def check_ext(ext: str) -> str:
    """Return ``ext`` if it is a valid member extension (lower-case, no leading dot)."""
    if not isinstance(ext, str) or not EXT_RE.match(ext) or len(ext) > MAX_EXT_LENGTH:
        raise KeyRuleError(
            f"extension {ext!r} breaks the key rules: want 1..{MAX_EXT_LENGTH} lower-case "
            "characters of [a-z0-9_-], dot-separated"
        )
    return ext


def member_name(key: str, ext: str) -> str:
    """The tar member name of field ``ext`` of sample ``key``."""
    return f"{check_key(key)}.{check_ext(ext)}"


def split_member_name(name: str) -> tuple[str, str]:
    """Split a member name into (key, ext) the way webdataset does.

    The key is everything up to the first dot of the base name (directories included);
    the extension is the rest, lower-cased. A name without a dot raises KeyRuleError.
    """
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot <= slash + 1:
        raise KeyRuleError(f"member name {name!r} has no key and extension ('key.ext')")
    return name[:dot], name[dot + 1 :].lower()


def _digest(text: str) -> str:
    raw = text.encode("utf-8", "surrogateescape")
    return hashlib.sha1(raw, usedforsecurity=False).hexdigest()[:_HASH_LEN]


def key_from_name(name: str, *, identity: str | None = None) -> tuple[str, bool]:
    """A candidate key for a relative path or ID given without its extension.

    Returns ``(key, rewritten)``. Path separators become ``__``; any other character outside
    the key alphabet becomes ``_``. When anything had to be rewritten or cut, a short hash
    of ``identity`` (default: ``name``; pass the full original path) is appended so that
    different inputs stay different keys.
    """
    if _is_key(name):
        return name, False  # most IDs: the rules below would keep it as it is
    joined = name.replace("/", "__")
    if _is_key(joined) and name[-1] != "/":
        return joined, False  # most relative paths (no "\\", no "/" at either end): as below, faster
    joined = name.replace("\\", "/").strip("/").replace("/", "__")
    safe = _UNSAFE.sub("_", joined)
    rewritten = safe != joined or not safe or not safe[0].isalnum()
    if not safe or not safe[0].isalnum():
        safe = "k" + safe
    if len(safe) > MAX_KEY_LENGTH:
        rewritten = True
    if rewritten:
        safe = _with_hash(safe, identity if identity is not None else name)
    return safe, rewritten


def _is_key(name: str) -> bool:
    """Whether ``name`` keeps the key rules (what :func:`check_key` checks), so is its own key."""
    return len(name) <= MAX_KEY_LENGTH and KEY_RE.match(name) is not None


def _with_hash(key: str, identity: str) -> str:
    return key[: MAX_KEY_LENGTH - _HASH_LEN - 1] + "-" + _digest(identity)


class KeyList(Sequence[str]):
    """Keys as ASCII records (:class:`~shardify.records.Records`): ~20 bytes a key instead
    of ~70, and past the spill budget on disk, not in memory."""

    def __init__(self, *, spill_bytes: int | None = None) -> None:
        self._records = Records(spill_bytes=spill_bytes)

    def append(self, key: str) -> None:
        self._records.append(key.encode("ascii"))

    def extend(self, keys: Sequence[str]) -> None:
        """Append ``keys`` (ASCII strings): one buffer write for them all."""
        data = "".join(keys).encode("ascii")  # so each key's length in bytes is its len()
        self._records.extend(data, np.fromiter(map(len, keys), np.int64, len(keys)).cumsum())

    def __len__(self) -> int:
        return len(self._records)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self._records[i].decode("ascii")

    def __iter__(self) -> Iterator[str]:
        for data, ends in self._records.spans():
            text, begin = data.decode("ascii"), 0
            for end in ends.tolist():
                yield text[begin:end]
                begin = end

    def take(self, indices: Iterable[int]) -> Iterator[str]:
        """The keys at ``indices`` (each in ``range(len(self))``), in that order: faster than
        indexing one at a time."""
        for key in self._records.take(indices):
            yield key.decode("ascii")

    def spans(self, *, chunk: int = 1 << 16) -> Iterator[tuple[bytes | bytearray, np.ndarray]]:
        """The keys in order, ``chunk`` at a time, as ``(ASCII bytes, where each key ends)``."""
        return self._records.spans(chunk=chunk)


_repeated = repeated
"""(the name the tests know)"""


def _check_all(keys: KeyList, *, chunk: int = 1 << 16) -> None:
    """:func:`check_key` on every key, at numpy speed (``chunk`` keys at a time, so the
    temporaries stay a few MB): the first bad key raises its error."""
    lo = 0
    for data, ends in keys.spans(chunk=chunk):
        text = np.frombuffer(data, dtype=np.uint8)
        lengths = np.diff(ends, prepend=0)
        bad = (lengths < 1) | (lengths > MAX_KEY_LENGTH)
        bad[~bad] = ~_FIRST_BYTE[text[(ends - lengths)[~bad]]]
        bad[np.searchsorted(ends, np.flatnonzero(~_KEY_BYTE[text]), side="right")] = True
        for j in np.flatnonzero(bad).tolist():
            check_key(keys[lo + j])
        lo += len(ends)


def assign_keys(
    names: Sequence[str], *, identities: Sequence[str] | None = None, candidates: Iterable[Sequence[str]] | None = None
) -> KeyList:
    """Keys for ``names`` (relative paths or IDs without extension): valid, unique, stable.

    ``identities`` (default: ``names``) are the full original names hashed into rewritten
    keys. Names that map to the same candidate key all get the hash suffix of their
    identity; the result depends only on the set of inputs, never on their order.
    Memory stays small at millions of names: candidates are compared by hash, and only
    those whose hashes repeat are compared as strings. ``candidates``: the names'
    :func:`candidate_keys`, a chunk at a time in order, when the caller made them (in
    worker processes, say).
    """
    ids = names if identities is None else identities
    if len(ids) != len(names):
        raise ValueError(f"{len(names)=} and {len(ids)=} should be equal")
    if candidates is None:
        pending = _candidate_keys(names, ids)
        candidates = iter(lambda: list(islice(pending, 1 << 16)), [])
    made = KeyList()
    hashes = Repeats()
    for chunk in candidates:
        made.extend(chunk)
        hashes.extend(map(hash, chunk))
    if len(made) != len(names):
        raise ValueError(f"{len(made)} candidates for {len(names)} names")
    counts: dict[str, int] = {}
    for j in hashes.repeated():
        counts[made[j]] = counts.get(made[j], 0) + 1
    clashing = {c for c, n in counts.items() if n > 1}
    if not clashing:
        keys = made
    else:
        keys, hashes = KeyList(), Repeats()
        rewritten = (_with_hash(c, ids[j]) if c in clashing else c for j, c in enumerate(made))
        for chunk in iter(lambda: list(islice(rewritten, 1 << 16)), []):
            keys.extend(chunk)
            hashes.extend(map(hash, chunk))
    _check_unique(ids, keys, hashes)
    return keys


def candidate_keys(names: Sequence[str], identities: Sequence[str]) -> list[str]:
    """:func:`key_from_name` of each name with its identity: the keys :func:`assign_keys`
    gives unless two names make the same one."""
    return list(_candidate_keys(names, identities))


def _candidate_keys(names: Sequence[str], ids: Sequence[str]) -> Iterator[str]:
    """:func:`key_from_name` of each name; its identity is read only for a name rewritten
    with a hash."""
    for j, n in enumerate(names):
        c, rewritten = key_from_name(n)
        if rewritten and ids is not names:
            c = key_from_name(n, identity=ids[j])[0]
        yield c


def _check_unique(names: Sequence[str], keys: KeyList, hashes: Repeats) -> None:
    _check_all(keys)
    owner: dict[str, str] = {}
    for j in hashes.repeated():
        key, name = keys[j], names[j]
        if key in owner:
            raise KeyRuleError(f"names {owner[key]!r} and {name!r} map to the same key {key!r}; rename one")
        owner[key] = name
