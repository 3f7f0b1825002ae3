"""The sidecars' hash tree (:mod:`shardify.merkle`) and the compact index (:mod:`shardify.compactindex`):
every leaf's proof leads to the root and nothing else does; a compact index round-trips and any
damage is a ManifestError naming the file."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from shardify import merkle
from shardify.compactindex import HEADER, CompactRef, decode, encode
from shardify.errors import ManifestError


def _leaves(n: int) -> list[bytes]:
    return [merkle.leaf_hash(f"sidecar {i}".encode()) for i in range(n)]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33])
def test_every_leaf_proves_against_the_root_and_only_at_its_own_place(n: int) -> None:
    leaves = _leaves(n)
    tree = merkle.MerkleTree(leaves)
    assert all(len(tree.proof(i)) == merkle.depth(n) for i in range(n))
    for i, leaf in enumerate(leaves):
        assert merkle.root_from_proof(leaf, i, tree.proof(i)) == tree.root
        for j in range(n):
            if j != i:  # another place, or another leaf at this place: another root
                assert merkle.root_from_proof(leaf, j, tree.proof(i)) != tree.root
                assert merkle.root_from_proof(leaves[j], i, tree.proof(i)) != tree.root
    assert merkle.MerkleTree(leaves[:-1] + [merkle.leaf_hash(b"other")]).root != tree.root


def test_a_leaf_cannot_pass_for_a_node_nor_a_pad() -> None:
    a, b = _leaves(2)
    node = merkle.node_hash(a, b)
    assert merkle.leaf_hash(b"\x01" + a + b) != node  # the prefixes differ (0x00 leaf, 0x01 node)
    assert merkle.MerkleTree([a, b, merkle.PAD]).root != merkle.MerkleTree([a, b]).root
    assert merkle.depth(1) == 0 and merkle.MerkleTree([a]).root == a and merkle.MerkleTree([a]).proof(0) == []


FIELDS = {"split": "train", "version": "0123456789ab", "classes": ["a", "b"], "format_version": 2}
COUNTS = [2293, 2293, 17]
ROOT = hashlib.sha256(b"root").digest()


def test_a_compact_index_round_trips_and_is_counts_plus_a_header() -> None:
    data = encode(FIELDS, COUNTS, ROOT)
    index = decode(data, source="x.cidx", sha256=hashlib.sha256(data).hexdigest())
    assert index.fields == FIELDS and index.counts.tolist() == COUNTS and index.root == ROOT
    assert index.num_samples == sum(COUNTS) and index.shards == 3 and index.counts.dtype == np.uint32
    meta = len(data) - HEADER.size - 4 * len(COUNTS)
    assert data[HEADER.size : HEADER.size + meta].startswith(b"{") and data[-4:] == (17).to_bytes(4, "little")


def _flip(data: bytes, at: int) -> bytes:
    out = bytearray(data)
    out[at] ^= 1
    return bytes(out)


GOOD = encode(FIELDS, COUNTS, ROOT)


@pytest.mark.parametrize(
    ("data", "sha", "says"),
    [
        pytest.param(_flip(GOOD, len(GOOD) - 1), hashlib.sha256(GOOD).hexdigest(), "sha256", id="replaced"),
        pytest.param(_flip(GOOD, 0), None, "not a compact index", id="magic"),
        pytest.param(GOOD[:-4], None, "header says", id="truncated"),
        pytest.param(GOOD[:20], None, "shorter than", id="no-header"),
        pytest.param(_flip(GOOD, len(GOOD) - 1), None, "sum to", id="count-changed"),
        pytest.param(GOOD[: HEADER.size] + b"x" + GOOD[HEADER.size + 1 :], None, "not JSON", id="fields"),
    ],
)
def test_a_damaged_compact_index_is_a_manifest_error_naming_it(data: bytes, sha: str | None, says: str) -> None:
    with pytest.raises(ManifestError, match=says) as e:
        decode(data, source="ds/train-0123456789ab.cidx", sha256=sha)
    assert "ds/train-0123456789ab.cidx" in str(e.value)


@pytest.mark.parametrize(
    "obj",
    [
        {"index": "../other/train-0123456789ab.cidx", "size": 100, "sha256": "a" * 64},
        {"index": "/etc/train.cidx", "size": 100, "sha256": "a" * 64},
        {"index": "train-0123456789ab.json", "size": 100, "sha256": "a" * 64},
        {"index": "train-0123456789ab.cidx", "size": 100, "sha256": "xyz"},
        {"index": "train-0123456789ab.cidx", "size": 3, "sha256": "a" * 64},
        "train.cidx",
    ],
)
def test_a_manifest_names_only_a_compact_index_beside_it(obj: object) -> None:
    with pytest.raises(ManifestError, match="compact"):
        CompactRef.from_json(obj, "manifest.json (split 'train')")
