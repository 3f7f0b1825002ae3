"""shardify.npy: deterministic encoding, exact round trips (torch dtypes numpy lacks too), refusals."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from shardify import npy
from shardify.errors import ArrayFormatError, ObjectArrayError
from shardify.npy import array_to_tensor, decode_array, encode_array, encode_tensor, tensor_to_array

SHAPES = [(), (0,), (7,), (3, 32, 32), (2, 0, 3), (1, 1, 1, 5)]
NUMPY_DTYPES = [
    "bool",
    "uint8",
    "int8",
    "<i2",
    "<i4",
    "<i8",
    "<u2",
    "<u4",
    "<u8",
    "<f2",
    "<f4",
    "<f8",
    "<c8",
    "<c16",
    "S3",
    "<U2",
    "<M8[s]",
    "<m8[ms]",
    "S0",
]


def _values(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    rng = np.random.default_rng(sum(shape) + dtype.itemsize)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    if dtype.kind in "SUbmM":
        return (rng.integers(0, 2, size=shape) if dtype.kind == "b" else rng.integers(0, 99, size=shape)).astype(dtype)
    return raw.view(dtype).reshape(shape)  # every bit pattern, NaNs included


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal dtype, shape and bits (so NaN payloads count)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_encoding_is_pinned_byte_for_byte() -> None:
    """The format 1.0 layout: magic, version, header length, dict padded to 64 bytes, C-order data."""
    header = b"{'descr': '<i2', 'fortran_order': False, 'shape': (2, 3), }"
    head = header + b" " * 58 + b"\n"  # 10 + 118 = 128 bytes before the data
    assert len(head) == 118
    expected = b"\x93NUMPY\x01\x00" + b"v\x00" + head + bytes([0, 0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0])
    assert encode_array(np.arange(6, dtype="<i2").reshape(2, 3)) == expected


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_numpy_round_trip_is_exact_and_numpy_reads_it(dtype: str, shape: tuple[int, ...]) -> None:
    a = _values(shape, np.dtype(dtype))
    data = encode_array(a)
    assert (10 + data[8] + 256 * data[9]) % 64 == 0
    assert _same(decode_array(data), a)
    assert _same(np.load(io.BytesIO(data)), a)
    assert decode_array(data).flags.writeable and decode_array(data).flags.c_contiguous


@pytest.mark.parametrize("dtype", ["<f4", "<i8", "<c8"])
def test_same_values_same_bytes_whatever_the_memory_or_byte_order(dtype: str) -> None:
    a = _values((4, 6), np.dtype(dtype))
    data = encode_array(a)
    assert encode_array(np.asfortranarray(a)) == data
    assert encode_array(a.astype(np.dtype(dtype).newbyteorder(">"))) == data
    assert encode_array(a[:, ::1].copy()) == data
    strided = np.zeros((4, 12), dtype=dtype)
    strided[:, ::2] = a
    assert encode_array(strided[:, ::2]) == data


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", ["<f4", ">f8", ">i2", "|u1"])
def test_decodes_what_numpy_writes(version: tuple[int, int], order: str, dtype: str) -> None:
    a = np.asarray(_values((3, 4, 5), np.dtype(dtype)), order=order)
    buf = io.BytesIO()
    np.lib.format.write_array(buf, a, version=version)
    out = decode_array(buf.getvalue())
    assert out.dtype.isnative and out.dtype == a.dtype.newbyteorder("=")
    np.testing.assert_array_equal(out, a)
    assert _same(decode_array(bytearray(buf.getvalue())), out)
    assert _same(decode_array(memoryview(buf.getvalue())), out)


def test_object_arrays_are_refused_both_ways_and_load_only_when_allowed() -> None:
    obj = np.array([{"a": 1}, None], dtype=object)
    with pytest.raises(ObjectArrayError, match="object array"):
        encode_array(obj)
    buf = io.BytesIO()
    np.save(buf, obj, allow_pickle=True)
    with pytest.raises(ObjectArrayError, match="allow_pickle=False"):
        decode_array(buf.getvalue())
    assert decode_array(buf.getvalue(), allow_pickle=True)[0] == {"a": 1}
    with pytest.raises(ArrayFormatError, match="cannot store dtype"):
        encode_array(np.zeros(2, dtype=[("a", "<i4"), ("b", "<f4")]))
    with pytest.raises(ArrayFormatError, match="wants a numpy array"):
        encode_array([1, 2])  # type: ignore[arg-type]


def _v1(header: bytes) -> bytes:
    """A format 1.0 file made of ``header`` alone."""
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header


@pytest.mark.parametrize(
    ("data", "match"),
    [
        pytest.param(b"garbage", "magic", id="not-npy"),
        pytest.param(b"\x93NUMPY\x09\x00\x10\x00", "version 9", id="unknown-version"),
        pytest.param(encode_array(np.arange(10, dtype="<i4"))[:-1], "header says 40", id="truncated-data"),
        pytest.param(encode_array(np.arange(10, dtype="<i4")) + b"\0", "header says 40", id="trailing-data"),
        pytest.param(encode_array(np.arange(10, dtype="<i4"))[:40], "truncated", id="truncated-header"),
        pytest.param(_v1(b"{'a': 1}"), "descr, fortran_order, shape", id="wrong-keys"),
        pytest.param(
            b"\x93NUMPY\x02\x00" + (10**6).to_bytes(4, "little") + b" " * 10**6, "exceeds 10000", id="huge-header"
        ),
        pytest.param(_v1(b"__import__('os')"), "unreadable", id="code-in-header"),
        pytest.param(
            _v1(b"{'descr': '<i4', 'fortran_order': False, 'shape': (-1,), }"), "bad shape", id="negative-shape"
        ),
        pytest.param(_v1(b"{'descr': 'zz', 'fortran_order': False, 'shape': (1,), }"), "bad descr", id="bad-descr"),
    ],
)
def test_bad_bytes_raise_array_format_error(data: bytes, match: str) -> None:
    with pytest.raises(ArrayFormatError, match=match):
        decode_array(data)


def test_the_header_is_parsed_once_per_distinct_header(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    parse = npy._parse_header
    monkeypatch.setattr(npy, "_parse_header", lambda *a: calls.append(a) or parse(*a))
    monkeypatch.setattr(npy, "_headers", {})
    for i in range(50):
        decode_array(encode_array(np.full((3, 8, 8), i, dtype=np.float32)))
    decode_array(encode_array(np.zeros((3, 8, 9), dtype=np.float32)))
    assert len(calls) == 2


TORCH_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
    torch.bfloat16,
    torch.complex32,
]
TORCH_DTYPES += [
    getattr(torch, n)
    for n in (
        "uint16",
        "uint32",
        "uint64",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
    )
    if hasattr(torch, n)
]


def _tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Every bit pattern of ``dtype`` (NaNs, infinities, subnormals) in a tensor of ``shape``."""
    g = torch.Generator().manual_seed(sum(shape))
    n = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        return (raw % 2).bool().reshape(shape)
    return raw.view(dtype).reshape(shape)


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_tensor_round_trip_keeps_dtype_shape_and_bits(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    t = _tensor(shape, dtype)
    back = array_to_tensor(decode_array(encode_tensor(t)))
    assert back.dtype == dtype and tuple(back.shape) == shape and _bits(back) == _bits(t)
    assert array_to_tensor(tensor_to_array(t)).dtype == dtype


def test_raw_views_are_documented_structured_dtypes_numpy_can_load() -> None:
    t = torch.tensor([1.5, -2.0, float("inf")], dtype=torch.bfloat16)
    a = np.load(io.BytesIO(encode_tensor(t)))
    assert a.dtype == np.dtype([("bfloat16", "<u2")])
    assert a["bfloat16"].tolist() == t.view(torch.int16).numpy().view(np.uint16).tolist()


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: torch.arange(12.0).reshape(3, 4).t(), id="transposed"),
        pytest.param(lambda: torch.arange(100.0)[10:20:3], id="strided-slice-of-bigger-storage"),
        pytest.param(lambda: torch.complex(torch.ones(3), torch.arange(3.0)).conj(), id="lazy-conj"),
        pytest.param(lambda: -torch.ones(3, requires_grad=True), id="requires-grad"),
        pytest.param(lambda: torch.ones(2, 2).expand(3, 2, 2), id="expanded"),
    ],
)
def test_views_and_lazy_tensors_store_their_values(make) -> None:
    t = make()
    back = array_to_tensor(decode_array(encode_tensor(t)))
    assert back.dtype == t.dtype and back.shape == t.shape and torch.equal(back, t.detach().resolve_conj())


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_tensors_without_a_dense_npy_form_are_refused() -> None:
    with pytest.raises(ArrayFormatError, match="sparse_coo"):
        tensor_to_array(torch.eye(3).to_sparse())
    with pytest.raises(ArrayFormatError, match="quantized"):
        tensor_to_array(torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.quint8))
    with pytest.raises(ArrayFormatError, match="wants a torch.Tensor"):
        tensor_to_array(np.ones(3))  # type: ignore[arg-type]
    with pytest.raises(ArrayFormatError, match="torch has no dtype"):
        array_to_tensor(np.array(["a"]))
