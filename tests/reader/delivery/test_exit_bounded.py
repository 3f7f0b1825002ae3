"""A process exits within seconds of its last batch, whatever its decode thread or workers are doing.

Each child process iterates as fast as it can, stops, closes the loader and reports the seconds
the close took and the threads still running that the interpreter would wait for at exit. The
bounds are generous (the expected close is a second or two): they tell "bounded" from "waits for
a decode or a worker that does not return" (a minute and more here), never fast from slow.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

BOUND_S = 30.0

DEVICE_CHILD = """
import json, sys, threading, time
from shardify.reader import DecodeOptions, ShardedDataset, make_loader
from shardify.reader import transforms as T
from shardify.reader.sample.device_decode import pil_decoder

calls = 0

def decoder(encoded, device):  # the CPU stand-in for nvJPEG; from the 4th batch on, it never returns
    global calls
    calls += 1
    if calls > 3:
        time.sleep(600)
    return pil_decoder(encoded, device)

ds = ShardedDataset(sys.argv[1], batch_size=2, transform=T.imagenet_train(16), decoding=DecodeOptions(device="cpu"))
loader = make_loader(ds, num_workers=2, jpeg_decoder=decoder)
for i, batch in enumerate(loader):  # as fast as it can
    if i == 2:
        break
start = time.monotonic()
loader.close()
closed = time.monotonic() - start
held = [t.name for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
print(json.dumps({"close_s": closed, "held": held}))
"""

WORKERS_CHILD = """
import json, os, sys, threading, time
from shardify.reader import BatchOptions, ShardedDataset, make_loader

def stuck(sample):  # every worker hangs in its second batch
    if int(sample["cls"]) >= 16:
        time.sleep(600)
    return int(sample["cls"])

ds = ShardedDataset(sys.argv[1], batch_size=2, map=stuck, batching=BatchOptions(collate_fn=list))
loader = make_loader(ds, num_workers=8, prefetch_factor=1)
it = iter(loader)
first = [next(it) for _ in range(8)]
start = time.monotonic()
loader.close()
closed = time.monotonic() - start
held = [t.name for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
print(json.dumps({"close_s": closed, "held": held}))
"""


def _run(tmp_path: Path, code: str, data: Path) -> dict:
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(code))
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(script), str(data)], capture_output=True, text=True, timeout=BOUND_S * 4)
    wall = time.monotonic() - start
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["wall_s"], out["stderr"] = wall, done.stderr
    return out


def test_a_device_decode_loader_exits_though_its_decoder_hangs(image_dataset, tmp_path):
    out = _run(tmp_path, DEVICE_CHILD, image_dataset)
    assert out["held"] == [], out
    assert out["close_s"] < BOUND_S and out["wall_s"] < BOUND_S * 2, out


def test_closing_stops_every_worker_against_one_deadline(counting_dataset, tmp_path):
    out = _run(tmp_path, WORKERS_CHILD, counting_dataset([40]))
    assert "did not stop within 3 s of being told to; terminating them" in out["stderr"]
    assert out["held"] == [], out
    assert out["close_s"] < BOUND_S, out  # torch's own shutdown: 5 s per stuck worker, 40 s for these 8
