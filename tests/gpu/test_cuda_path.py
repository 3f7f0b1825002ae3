"""The CUDA path (pinned memory, side stream, record_stream, normalisation on the device) on a GPU.

Skipped without CUDA (see conftest.py). Checks: batches equal the CPU path's after
normalisation (float32, bf16, channels_last); memory handed to the training loop is never
reused by the prefetch while queued work still reads it (a long run of delayed reads through
the caching allocator, checked against sums computed on the CPU); and the step-time
benchmark runs (``tools/bench_gpu_step.py``), printing its figures.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from builders import augmented

from shardify.reader import make_loader

TIME_LIMIT_S = 300


@pytest.mark.parametrize(
    "dtype, channels_last, atol",
    [
        pytest.param(torch.float32, False, 1e-5, id="float32"),
        pytest.param(torch.bfloat16, True, 0.03, id="bf16-channels_last"),
    ],
)
@pytest.mark.parametrize("workers", [0, 2])
def test_batches_equal_the_cpu_path_after_normalisation(
    jpeg_dataset: Path, device: str, dtype: torch.dtype, channels_last: bool, atol: float, workers: int
) -> None:
    # Two datasets alike: iterating one dataset twice at once in one process shares its shard reader.
    ds, twin = augmented(jpeg_dataset), augmented(jpeg_dataset)
    with (
        make_loader(twin, num_workers=workers, device="cpu") as cpu,
        make_loader(ds, num_workers=workers, device=device, dtype=dtype, channels_last=channels_last) as dev,
    ):
        if device == "cuda":
            assert dev.dataloader.pin_memory
        for epoch in range(2):
            ds.set_epoch(epoch)
            twin.set_epoch(epoch)
            pairs = list(zip(cpu, dev, strict=True))
            assert len(pairs) == len(ds)
            for (xc, yc), (xd, yd) in pairs:
                assert xd.device.type == device and xd.dtype == dtype and yd.device.type == device
                if channels_last:
                    assert xd.is_contiguous(memory_format=torch.channels_last)
                assert torch.equal(yd.cpu(), yc)
                assert torch.allclose(xd.float().cpu(), xc, atol=atol, rtol=0)


def test_no_use_after_free_under_the_caching_allocator(jpeg_dataset: Path, device: str, delayed_read_sums) -> None:
    """Each batch is read by work queued behind a delay on the training stream, after the loop
    dropped it and the prefetch of the next batches allocated memory on the side stream.
    Without ``record_stream`` the allocator could hand the batch's memory to a later copy
    before the delayed read ran, and the sums would differ from the CPU's."""
    ds = augmented(jpeg_dataset)
    with make_loader(ds, num_workers=2, device="cpu") as cpu:  # batches depend on the worker count
        expected = []
        for epoch in range(6):
            ds.set_epoch(epoch)
            expected += [(x.double().sum().item(), int(y.sum())) for x, y in cpu]
    with make_loader(ds, num_workers=2, device=device) as loader:
        got = delayed_read_sums(loader, ds, epochs=6, max_allocated=256 << 20)
    assert len(got) == len(expected)
    for (gs, gl), (es, el) in zip(got, expected):
        assert gl == el and gs == pytest.approx(es, rel=1e-9, abs=1e-3)


def test_step_time_benchmark_runs(jpeg_dataset: Path, device: str, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parents[2] / "tools"))  # the tool imports tools/benchlib
    spec = importlib.util.spec_from_file_location(
        "bench_gpu_step", Path(__file__).parents[2] / "tools" / "bench_gpu_step.py"
    )
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    r = module.step_times(
        jpeg_dataset, device=device, batch_size=16, image_size=64, workers=2, steps=10, warmup=2, width=8
    )
    assert r["prestaged_ms"] > 0 and r["loader_ms"] > 0 and r["ratio"] > 0
    with capsys.disabled():
        print(
            f"\n{device}: step {r['prestaged_ms']:.1f} ms pre-staged, {r['loader_ms']:.1f} ms with the loader "
            f"({r['ratio']:.2f} x)"
        )
