"""A binary hash tree over a split's sidecars: one 32-byte root vouches for every one of them.

A split with sidecars (:mod:`shardify.sidecar`) records in its compact index
(:mod:`shardify.compactindex`) only each shard's sample count and this tree's root; each sidecar
carries its own proof (the sibling hashes on its path to the root). A reader checks shard ``i``'s
sidecar alone, against the root, the first time it reads from that shard: nothing else per shard
has to be read up front, however many shards the split has.

Leaves are ``SHA-256(0x00 || bytes)``, inner nodes ``SHA-256(0x01 || left || right)`` (the
prefixes keep a leaf from passing for a node); the leaves are padded to the next power of two
with :data:`PAD`. A tree of one leaf has that leaf as its root and empty proofs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = ["HASH_BYTES", "PAD", "leaf_hash", "node_hash", "depth", "MerkleTree", "root_from_proof"]

HASH_BYTES = 32
PAD = hashlib.sha256(b"shardify merkle pad").digest()
"""The hash of the leaves that pad a tree to a power of two (no leaf hashes to it)."""


def leaf_hash(data: bytes | memoryview) -> bytes:
    return hashlib.sha256(b"\x00" + bytes(data)).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def depth(leaves: int) -> int:
    """Levels above the leaves of a tree of ``leaves`` leaves: the length of each proof."""
    if leaves < 1:
        raise ValueError(f"{leaves=} should be >= 1")
    return (leaves - 1).bit_length()


class MerkleTree:
    """The tree over the leaf hashes ``leaves`` (in shard order): its :attr:`root` and each
    leaf's :meth:`proof`. Holds every level: 64 bytes a leaf."""

    def __init__(self, leaves: Sequence[bytes]) -> None:
        level = list(leaves)
        if not level:
            raise ValueError("a tree needs at least one leaf")
        level += [PAD] * ((1 << depth(len(level))) - len(level))
        self.levels = [level]
        while len(level) > 1:
            level = [node_hash(level[k], level[k + 1]) for k in range(0, len(level), 2)]
            self.levels.append(level)

    @property
    def root(self) -> bytes:
        return self.levels[-1][0]

    def proof(self, index: int) -> list[bytes]:
        """The sibling hashes from leaf ``index`` up to the root's children."""
        out = []
        for level in self.levels[:-1]:
            out.append(level[index ^ 1])
            index >>= 1
        return out


def root_from_proof(leaf: bytes, index: int, proof: Sequence[bytes]) -> bytes:
    """The root that leaf hash ``leaf`` at position ``index`` with ``proof`` leads to."""
    node = leaf
    for sibling in proof:
        node = node_hash(sibling, node) if index & 1 else node_hash(node, sibling)
        index >>= 1
    return node
