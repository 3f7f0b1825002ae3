"""``convert ids --pt-to-npy``: each ``.pt`` tensor stored as ``.npy``, exactly; pickled objects refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from shardify.cli import EXIT_OK, EXIT_SKIPPED, main
from shardify.convert.write.run import convert_ids
from shardify.errors import InputError
from shardify.npy import array_to_tensor, decode_array

TENSORS = {
    "f32": torch.randn(3, 32, 32, generator=torch.Generator().manual_seed(0)),
    "f64": torch.randn(5, generator=torch.Generator().manual_seed(1)).double(),
    "f16": torch.tensor([[0.5, -1.0], [float("inf"), float("nan")]], dtype=torch.float16),
    "bf16": torch.tensor([1.5, -2.25, 3e38], dtype=torch.bfloat16),
    "i64": torch.arange(-3, 9).reshape(2, 2, 3),
    "u8": torch.arange(256, dtype=torch.uint8).reshape(16, 16),
    "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
    "bool": torch.tensor([True, False, True]),
    "c64": torch.complex(torch.ones(2), torch.arange(2.0)),
    "scalar": torch.tensor(7),
    "empty": torch.zeros(0, 4),
    "slice": torch.arange(100.0)[10:40:3],  # torch.save keeps the whole storage; npy the view only
    "transposed": torch.arange(12).reshape(3, 4).t(),
}


class Payload:
    """Unpickling this would create ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, (f": > '{self.marker}'",))


def _source(tmp_path: Path, files: dict[str, object]) -> dict[str, Path]:
    data = tmp_path / "data"
    data.mkdir()
    for ident, obj in files.items():
        torch.save(obj, data / f"{ident}.pt")
    (tmp_path / "partition.json").write_text(json.dumps({"train": sorted(files)}))
    (tmp_path / "labels.json").write_text(json.dumps({ident: i % 3 for i, ident in enumerate(sorted(files))}))
    return {"src": data, "partition": tmp_path / "partition.json", "labels": tmp_path / "labels.json"}


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def test_every_pt_is_stored_as_npy_with_dtype_shape_and_values_exact(tmp_path, options, read_split) -> None:
    src = _source(tmp_path, TENSORS)
    result = convert_ids(
        src["src"],
        tmp_path / "out",
        partition=src["partition"],
        labels=src["labels"],
        options=options(),
        pt_to_npy=True,
    )
    assert result.num_skipped == 0
    samples = read_split(tmp_path / "out", "train")
    by_id = {json.loads(s["json"])["path"]: s for s in samples.values()}
    assert set(by_id) == set(TENSORS)
    for ident, _original in TENSORS.items():
        sample = by_id[ident]
        assert set(sample) == {"cls", "json", "npy"}, ident
        back = array_to_tensor(decode_array(sample["npy"]))
        loaded = torch.load(src["src"] / f"{ident}.pt", weights_only=True)
        assert back.dtype == loaded.dtype and back.shape == loaded.shape, ident
        assert _bits(back) == _bits(loaded), ident
        assert json.loads(sample["json"])["files"] == {"npy": f"{ident}.pt"}
    index = json.loads((tmp_path / "out" / "train.json").read_text())
    assert index["shardify"]["fields"] == ["cls", "json", "npy"]


def test_without_the_option_pt_files_are_stored_unchanged(tmp_path, options, read_split) -> None:
    src = _source(tmp_path, {"a": torch.ones(2)})
    convert_ids(src["src"], tmp_path / "out", partition=src["partition"], labels=src["labels"], options=options())
    (sample,) = read_split(tmp_path / "out", "train").values()
    assert sample["pt"] == (src["src"] / "a.pt").read_bytes()


def test_a_pickled_object_is_refused_naming_the_file_and_id(tmp_path, options) -> None:
    marker = tmp_path / "pwned"
    src = _source(
        tmp_path,
        {
            "good": torch.ones(2),
            "evil": {"w": torch.zeros(1), "hook": Payload(marker)},
            "dict": {"w": torch.zeros(1)},
            "list": [torch.zeros(1)],
        },
    )
    (src["src"] / "broken.pt").write_bytes(b"not a torch file")
    src["partition"].write_text(json.dumps({"train": ["broken", "dict", "evil", "good", "list"]}))
    src["labels"].write_text(json.dumps({"broken": 0, "dict": 0, "evil": 1, "good": 0, "list": 1}))
    result = convert_ids(
        src["src"],
        tmp_path / "out",
        partition=src["partition"],
        labels=src["labels"],
        options=options(),
        pt_to_npy=True,
    )
    assert not marker.exists(), "the pickle payload ran"
    reasons = {p.path: p.reason for p in result.splits["train"].skipped}
    assert set(reasons) == {"broken.pt", "dict.pt", "evil.pt", "list.pt"}
    assert "ID 'evil'" in reasons["evil.pt"] and "weights_only=True" in reasons["evil.pt"]
    assert "pickled object (posix.system)" in reasons["evil.pt"] or "pickled object (os.system)" in reasons["evil.pt"]
    assert "ID 'dict'" in reasons["dict.pt"] and "holds a dict, not one tensor" in reasons["dict.pt"]
    assert "holds a list, not one tensor" in reasons["list.pt"]
    assert "ID 'broken': cannot load as a torch file" in reasons["broken.pt"]
    assert "Unsupported operand" in reasons["broken.pt"] or "invalid load key" in reasons["broken.pt"]
    assert result.splits["train"].samples == 1
    report = (tmp_path / "out" / "train.report.jsonl").read_text()
    assert "evil.pt" in report and "weights_only=True" in report
    src["partition"].write_text(json.dumps({"train": ["evil", "good"]}))
    with pytest.raises(InputError, match=r"evil\.pt .*ID 'evil'.*weights_only=True"):
        convert_ids(
            src["src"],
            tmp_path / "strict",
            partition=src["partition"],
            labels=src["labels"],
            options=options(strict=True),
            pt_to_npy=True,
        )
    assert not marker.exists()


def test_cli_flag(tmp_path: Path, read_split, capsys) -> None:
    src = _source(tmp_path, {"a": torch.ones(2, 3), "b": "not a tensor"})
    argv = [
        "convert",
        "ids",
        str(src["src"]),
        str(tmp_path / "out"),
        "--partition",
        str(src["partition"]),
        "--labels",
        str(src["labels"]),
        "--quiet",
        "--workers",
        "1",
        "--no-fsync",
    ]
    assert main([*argv, "--pt-to-npy"]) == EXIT_SKIPPED
    assert "b.pt: ID 'b': holds a str, not one tensor" in capsys.readouterr().err
    (sample,) = read_split(tmp_path / "out", "train").values()
    assert torch.equal(array_to_tensor(decode_array(sample["npy"])), torch.ones(2, 3))
    assert main([*argv[:3], str(tmp_path / "plain"), *argv[4:]]) == EXIT_OK  # without the flag: bytes as they are
    assert all(set(s) == {"cls", "json", "pt"} for s in read_split(tmp_path / "plain", "train").values())
