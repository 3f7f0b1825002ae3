"""MapDataset on an S3-compatible server (moto's, on 127.0.0.1, through s3fs): every index and
key gives the stored sample, by ranged reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from test_s3 import bucket, s3_endpoint, s3_env  # noqa: E402,F401  (the moto server fixtures, shared)

from shardify.convert.options import ConvertOptions  # noqa: E402
from shardify.convert.synth import make_imagefolder  # noqa: E402
from shardify.convert.write.run import convert_imagefolder  # noqa: E402
from shardify.reader import MapDataset  # noqa: E402

FIELDS = ("__key__", "jpg", "cls")


def test_every_index_and_key_from_s3_equals_local(bucket: str, tmp_path: Path) -> None:  # noqa: F811
    src = make_imagefolder(tmp_path / "src", classes=3, per_class=4, sizes=((48, 40),))
    options = ConvertOptions(samples_per_shard=4, workers=1, progress=False, fsync=False)
    convert_imagefolder(src, tmp_path / "local", options=options)
    convert_imagefolder(src, f"s3://{bucket}/ds", options=options)
    local = MapDataset(tmp_path / "local", fields=FIELDS)
    remote = MapDataset(f"s3://{bucket}/ds", fields=FIELDS)
    want = [local[i] for i in range(len(local))]
    assert len(remote) == len(local) == 12
    assert _same(remote.__getitems__(list(range(11, -1, -1))), want[::-1])
    assert _same([remote.get(k) for k, _, _ in want], want)


def _same(got: list, want: list) -> bool:
    return len(got) == len(want) and all(
        a[0] == b[0] and a[2] == b[2] and torch.equal(a[1], b[1]) for a, b in zip(got, want)
    )
