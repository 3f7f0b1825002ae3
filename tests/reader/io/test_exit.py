"""A process exits promptly after its last batch whatever the server is doing: a loop left while
ranged fetches or whole-shard downloads trickle (one shard's bytes at 1 KB/s), with 0 and 2
workers, CPU decode and device decode (on the CPU, with Pillow standing in for nvJPEG).

The figure measured here is about 0.5 to 1.5 s (interpreter teardown included); the bound is
generous so that a loaded machine passes: before the fix, a 0-worker ranged loop never exited."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import rangeserver  # tools/rangeserver.py (pytest's pythonpath holds tools/)

from shardify.convert import ShardWriter
from shardify.convert.synth import jpeg_bytes, natural_image

EXIT_BOUND_S = 10.0  # measured: about 1 s
KILL_S = 90.0

CHILD = textwrap.dedent(
    """
    import sys, time
    from shardify.reader import CacheOptions, DecodeOptions, ShardedDataset, make_loader
    from shardify.reader import transforms as T
    from shardify.reader.sample.device_decode import pil_decoder
    from shardify.remote import RetryPolicy

    url, workers, mode, decode = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    # waits far longer than the test: only stopping the fetches lets the process exit
    cache = CacheOptions(ranged=mode == "ranged", retry=RetryPolicy(retries=0, timeout_s=120.0, deadline_s=600.0))
    if decode == "device":
        ds = ShardedDataset(url, batch_size=4, transform=T.imagenet_train(32),
                            decoding=DecodeOptions(device="cpu"), cache=cache)
        loader = make_loader(ds, num_workers=workers, device="cpu", jpeg_decoder=pil_decoder)
    else:
        ds = ShardedDataset(url, batch_size=4, fields=("__key__", "cls"), cache=cache)
        loader = make_loader(ds, num_workers=workers)
    for batch in loader:
        print("batch", flush=True)
        break
    """
)


@pytest.fixture(scope="module")
def www(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``www/ds``: 48 JPEG samples of ~22 KB in 6 shards (a shard takes minutes at 1 KB/s)."""
    root = tmp_path_factory.mktemp("exit") / "www"
    with ShardWriter(root / "ds", samples_per_shard=8, fsync=False) as w:
        for i in range(48):
            w.write({"jpg": jpeg_bytes(natural_image(64, 64, seed=i)), "cls": i % 5, "bin": os.urandom(20000)})
    return root


@pytest.mark.parametrize(
    ("workers", "mode", "decode"),
    [
        (0, "ranged", "cpu"),
        (0, "whole", "cpu"),
        (2, "ranged", "cpu"),
        (2, "whole", "cpu"),
        (0, "ranged", "device"),
        (2, "whole", "device"),
    ],
)
def test_a_process_exits_promptly_after_its_last_batch(www, tmp_path, workers, mode, decode):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    shards = sorted(p.name for p in (www / "ds").glob("*.tar"))
    # the first batches' shards come fast, every other shard trickles
    b = rangeserver.Behaviour(trickle_bps=1000, fault_paths=(".tar",), clean_paths=tuple(shards[:2]))
    with rangeserver.serve(www, b) as (base, served):
        child = subprocess.Popen(
            [sys.executable, str(script), f"{base}/ds", str(workers), mode, decode],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None and child.stdout.readline() == "batch\n"
            last_batch = time.monotonic()
            child.wait(timeout=KILL_S)
            took = time.monotonic() - last_batch
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        trickled = [p for p in served.paths if p.endswith(".tar") and not p.endswith(tuple(shards[:2]))]
    print(f"exit {took:.2f} s after the last batch ({workers=}, {mode}, {decode})")
    assert child.returncode == 0
    if workers or mode == "ranged":  # (0 workers, whole shards: nothing is fetched in the background)
        assert trickled, "no fetch was trickling when the loop ended: the test tests nothing"
    assert took < EXIT_BOUND_S


def test_fetch_threads_are_daemons_that_end_with_their_pool():
    from shardify.reader.io.fetchpool import DaemonPool

    pool = DaemonPool(2, "test-fetch")
    release = threading.Event()
    running = [pool.submit(release.wait, 30.0) for _ in range(2)]
    queued = pool.submit(lambda: "never")
    threads = [t for t in threading.enumerate() if t.name.startswith("test-fetch-")]
    assert len(threads) == 2 and all(t.daemon for t in threads)
    pool.shutdown()
    assert queued.cancelled()
    release.set()
    assert [f.result(timeout=30) for f in running] == [True, True]
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive()
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(lambda: None)
    bad = DaemonPool(1, "test-fetch-bad")
    with pytest.raises(ZeroDivisionError):
        bad.submit(lambda: 1 / 0).result(timeout=30)
    bad.shutdown()
