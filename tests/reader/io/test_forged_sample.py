"""A sample changed on purpose so that its CRC-32 still matches: what each check stands against.

A CRC-32 can be forged at will (four chosen bytes reach any CRC, by linear algebra over GF(2)),
so the per-sample table keeps a SHA-256 prefix beside it. A ranged read from a server checks
the SHA-256 prefix: a server that alters a sample is caught whatever CRC it arranges. A read
from a local file checks the CRC-32 (against accidental change, at a fifth of the cost); a
deliberate change there is for ``verify=True`` (the shard's SHA-256) or ``shardify verify``.
"""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path

import pytest
import rangeserver  # tools/rangeserver.py (pytest's pythonpath holds tools/)

from shardify.convert import ShardWriter
from shardify.errors import ShardFormatError
from shardify.reader import CacheOptions, DecodeOptions, ShardedDataset, make_loader
from shardify.remote import RetryPolicy
from shardify.sampletable import SampleTable

FAST = RetryPolicy(retries=1, backoff_s=0.01, max_backoff_s=0.02, timeout_s=5.0, deadline_s=30.0)


def forge_crc(data: bytearray, at: int, target: int) -> None:
    """Set ``data[at:at + 4]`` so that ``zlib.crc32(data) == target``: the CRC of a message of
    fixed length is affine in its bits, so four bytes solve a 32x32 system over GF(2)."""
    data[at : at + 4] = bytes(4)
    base = zlib.crc32(data)
    columns = []  # the CRC change made by each of the 32 bits alone
    for bit in range(32):
        data[at + bit // 8] ^= 1 << (bit % 8)
        columns.append(zlib.crc32(data) ^ base)
        data[at + bit // 8] ^= 1 << (bit % 8)
    rows = [(col, 1 << bit) for bit, col in enumerate(columns)]  # Gaussian elimination on (column, bits)
    want, solution = target ^ base, 0
    basis: dict[int, tuple[int, int]] = {}
    for col, bits in rows:
        for pivot in sorted(basis, reverse=True):
            if col >> pivot & 1:
                col, bits = col ^ basis[pivot][0], bits ^ basis[pivot][1]
        if col:
            basis[col.bit_length() - 1] = (col, bits)
    for pivot in sorted(basis, reverse=True):
        if want >> pivot & 1:
            want, solution = want ^ basis[pivot][0], solution ^ basis[pivot][1]
    assert want == 0, "these four bytes cannot reach the target CRC"
    data[at : at + 4] = solution.to_bytes(4, "little")


@pytest.fixture
def forged(tmp_path: Path) -> tuple[Path, str]:
    """``www/ds``: 24 samples in 3 shards; in shard 0, sample 2's bytes changed, its CRC-32 kept."""
    root = tmp_path / "www" / "ds"
    with ShardWriter(root, samples_per_shard=8, fsync=False) as w:
        for i in range(24):
            w.write({"dat": bytes([97 + i]) * 600, "cls": i % 5})
    entry = json.loads(next(root.glob("train-*.json")).read_text())["shardlist"][0]
    shard = root / entry["url"]
    data = bytearray(shard.read_bytes())
    start, stop, _ = SampleTable(base64.b64decode(entry["samples"])).ranges()[2]
    sample = bytearray(data[start:stop])
    crc = zlib.crc32(sample)
    at = sample.index(b"c" * 600)
    sample[at : at + 8] = b"FORGED!!"  # the change a training run would see
    forge_crc(sample, at + 8, crc)
    assert zlib.crc32(sample) == crc and sample != data[start:stop]
    data[start:stop] = sample
    shard.write_bytes(bytes(data))
    return root, entry["url"]


def _values(spec: object, **options: object) -> list[bytes]:
    ds = ShardedDataset(spec, batch_size=8, fields=("dat",), **options)  # type: ignore[arg-type]
    with make_loader(ds, num_workers=0) as loader:
        return [t for batch in loader for t in batch]


def test_a_forged_crc_fools_only_the_crc(forged):
    root, _ = forged
    texts = _values(root)  # a local read checks the CRC-32: matched on purpose
    assert sum(t.startswith(b"FORGED!!") for t in texts) == 1


def test_a_ranged_read_checks_the_sha256_and_refuses_the_forged_sample(forged):
    root, name = forged
    with rangeserver.serve(root.parent) as (base, _):
        with pytest.raises(ShardFormatError) as e:
            _values(f"{base}/ds", cache=CacheOptions(retry=FAST))
    assert name in str(e.value)


def test_verify_refuses_the_forged_shard_locally(forged):
    root, name = forged
    with pytest.raises(ShardFormatError) as e:
        _values(root, decoding=DecodeOptions(verify=True))
    assert name in str(e.value)
