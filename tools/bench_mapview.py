"""Random access, map-style: MapDataset against wids, HF datasets (Arrow) and Lance, and key lookups.

    python tools/bench_mapview.py [--samples 20000] [--workers 2] [--batch-size 256] [--epochs 3]
                                  [--http-delay-ms 20] [--keys 100000000] [--build-keys 20000000]
                                  [--photos 800] [--cpu] [--dir DIR]

Writes (once per folder) ``--samples`` random 3x32x32 uint8 arrays with a label
(``benchlib.corpus.arrays``) as a shardify split (per-sample, and chunked by 256), as an Arrow
dataset (``datasets.Dataset.save_to_disk``, one ``bytes`` column) and, when ``pylance`` is
installed, as a Lance dataset (a ``fixed_size_binary(3072)`` column). Each reader is a map-style
dataset in a ``DataLoader(batch_size, shuffle=True, num_workers, persistent_workers=True)``,
its samples turned into uint8 ``[B, 3, 32, 32]`` and int64 labels (``MapDataset.collate``;
the others' bytes joined and viewed as one array, the lightest collate each allows); epochs
run in turn, and each side's best epoch is printed in samples/s. ``MapDataset`` is also read over
HTTP (tools/rangeserver.py, each answer delayed ``--http-delay-ms``): by ranged requests (one
epoch; then with the shuffled batches drawn through ``FetchAhead``, its best epoch), and
fetching each shard whole into a fresh cache folder on first touch
(``CacheOptions(ranged=False, dir=...)``: its first epoch, then the best later one).
``--build-keys``: a key index of that many generated keys written in bounded memory
(``write_key_file``), then in memory, each in a fresh process: seconds and peak memory added.
``--keys``: a key index of that many random keys written
to a file (once), then 10,000 ``candidates`` lookups timed in a fresh process, with its private
resident memory before and after (Linux). ``--cpu``: each reader's batches in this process
(no workers), in samples per CPU second of the process: the cost per sample, steadier than
wall time on a loaded machine. ``--photos``: that many 500x375 JPEGs read with
``transforms.imagenet_train(224)``, batches of 64, by ``MapDataset`` in a ``DataLoader`` (with
``collate_fn=MapDataset.collate``, then with torch's ``default_collate``) and by ``ShardedDataset``
through ``make_loader``, then by ``MapDataset`` over HTTP by ranged requests (each answer delayed
``--http-delay-ms``; ``--http-delay-ms -1`` leaves it out), without and with ``FetchAhead``;
with each reader's CPU time a sample
(this process and its workers, all epochs and the workers' start: steadier than samples/s on a
loaded machine; over HTTP it includes the server's, a process of its own started and ended with it).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import tempfile
import time
from collections.abc import Callable, Iterable
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import rangeserver
import torch
from benchlib import corpus
from torch.utils.data import BatchSampler, DataLoader, RandomSampler


def _epochs(
    loaders: dict[str, Iterable[Any]], epochs: int, samples: int, shape: tuple[int, ...] = (3, 32, 32)
) -> dict[str, float]:
    return {name: max(rates) for name, rates in _each_epoch(loaders, epochs, samples, shape).items()}


def _each_epoch(
    loaders: dict[str, Iterable[Any]], epochs: int, samples: int, shape: tuple[int, ...] = (3, 32, 32)
) -> dict[str, list[float]]:
    """Each loader's samples/s in each epoch (the loaders take turns), each batch checked:
    uint8 ``[B, *shape]`` and int64 labels."""
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    for _ in range(epochs):
        for name, loader in loaders.items():
            t, n = time.perf_counter(), 0
            for x, y in loader:
                if x.dtype != torch.uint8 or x.shape[1:] != shape or y.dtype != torch.int64:
                    raise SystemExit(f"{name}: a batch of {x.dtype} {tuple(x.shape)}, labels {y.dtype}")
                n += int(y.shape[0])
            took = time.perf_counter() - t
            if n != samples:
                raise SystemExit(f"{name}: an epoch gave {n} samples, expected {samples}")
            rates[name].append(n / took)
    return rates


def _wids_collate(batch: list[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
    x = np.stack([np.load(s[".npy"]) for s in batch])  # (wids hands each member as a BytesIO)
    y = np.array([int(s[".cls"].read()) for s in batch])
    return torch.from_numpy(x), torch.from_numpy(y)


def _arrow_collate(batch: list[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
    x = np.frombuffer(b"".join(s["x"] for s in batch), dtype=np.uint8).reshape(len(batch), 3, 32, 32)
    return torch.from_numpy(x.copy()), torch.tensor([s["y"] for s in batch])


class _Lance(torch.utils.data.Dataset[Any]):
    """A Lance dataset, map-style: a batch is one ``take`` of its rows (opened once per worker;
    Lance is not fork-safe, so it is written in a child process and read by spawned workers)."""

    def __init__(self, root: Path, samples: int) -> None:
        import lance  # noqa: F401  (ImportError: not installed)

        if not root.exists():
            with get_context("spawn").Pool(1) as pool:
                pool.apply(_write_lance, (root, samples))
        self.root, self._data, self._n = str(root), None, samples

    def __len__(self) -> int:
        return self._n

    def __getitems__(self, indices: list[int]) -> Any:
        if self._data is None:
            import lance

            self._data = lance.dataset(self.root)
        return self._data.take(indices, columns=["x", "y"])

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_data": None}


def _write_lance(root: Path, samples: int) -> None:
    import lance
    import pyarrow as pa

    images, labels = corpus.arrays(samples, classes=10)
    x = pa.array([a.tobytes() for a in images], type=pa.binary(3 * 32 * 32))
    lance.write_dataset(pa.table({"x": x, "y": pa.array(labels, type=pa.int64())}), str(root))


def _lance_collate(table: Any) -> tuple[torch.Tensor, torch.Tensor]:
    x = table.column("x").combine_chunks()
    data = np.frombuffer(x.buffers()[1], dtype=np.uint8)[x.offset * 3072 : (x.offset + len(x)) * 3072]
    y = table.column("y").to_numpy()
    return torch.from_numpy(data.reshape(len(x), 3, 32, 32).copy()), torch.from_numpy(y.astype(np.int64))


def _arrow(root: Path, samples: int) -> Any:
    import datasets

    if not root.exists():
        images, labels = corpus.arrays(samples, classes=10)
        data = datasets.Dataset.from_dict({"x": [a.tobytes() for a in images], "y": [int(v) for v in labels]})
        data.save_to_disk(str(root))
    return datasets.load_from_disk(str(root))


def _readers(work: Path, samples: int) -> tuple[Path, dict[str, tuple[Any, Callable[..., Any]]]]:
    """The shardify split's folder, and each reader's map-style dataset and collate."""
    import wids

    from shardify.reader import MapDataset

    root = corpus.arrays_dataset(work / f"map-{samples}", samples, classes=10)
    chunked = corpus.arrays_dataset(work / f"map-chunk256-{samples}", samples, classes=10, chunk=256)
    corpus.warm(root)
    corpus.warm(chunked)
    fields = ("npy", "cls")
    sets: dict[str, tuple[Any, Callable[..., Any]]] = {
        "shardify MapDataset": (MapDataset(root, fields=fields), MapDataset.collate),
        "shardify MapDataset (chunked 256)": (MapDataset(chunked, fields=fields), MapDataset.collate),
        "wids ShardListDataset": (wids.ShardListDataset(str(root / "train.json"), transformations=[]), _wids_collate),
    }
    try:
        sets["HF datasets (Arrow)"] = (_arrow(work / f"arrow-{samples}", samples), _arrow_collate)
    except ImportError:
        pass
    try:
        sets["Lance"] = (_Lance(work / f"lance-{samples}", samples), _lance_collate)
    except ImportError:
        pass
    return root, sets


def cpu(work: Path, *, samples: int, batch_size: int, epochs: int) -> dict[str, Any]:
    """Each reader's batches (its batched fetch, else one item at a time, then its collate) in
    this process, in samples per CPU second of this process (best epoch): the cost per sample,
    whatever else the machine runs."""
    _, sets = _readers(work, samples)
    order = np.random.default_rng(0).permutation(samples)
    batches = [order[i : i + batch_size].tolist() for i in range(0, samples, batch_size)]
    best: dict[str, float] = {}
    for _ in range(epochs):
        for name, (ds, collate) in sets.items():
            fetch = ds.__getitems__ if hasattr(ds, "__getitems__") else lambda b, ds=ds: [ds[i] for i in b]
            t = time.process_time()
            for b in batches:
                collate(fetch(b))
            best[name] = max(best.get(name, 0.0), samples / (time.process_time() - t))
    return {k: round(v) for k, v in best.items()}


def read(work: Path, *, samples: int, workers: int, batch_size: int, epochs: int, delay_ms: float) -> dict[str, Any]:
    from shardify.reader import CacheOptions, MapDataset

    root, sets = _readers(work, samples)
    fields = ("npy", "cls")
    kw: dict[str, Any] = dict(batch_size=batch_size, shuffle=True, num_workers=workers, persistent_workers=workers > 0)
    loaders = {
        name: DataLoader(ds, collate_fn=c, **kw, **({"multiprocessing_context": "spawn"} if name == "Lance" else {}))
        for name, (ds, c) in sets.items()
    }
    rates = _epochs(loaders, epochs, samples)
    name, coll = f"shardify MapDataset over HTTP (+{delay_ms:g} ms a request)", MapDataset.collate
    with rangeserver.serve_process(work, delay_s=delay_ms / 1000) as base:
        remote = MapDataset(f"{base}/{root.name}", fields=fields, cache=CacheOptions(requests=batch_size))
        rates[f"{name}, ranged"] = _epochs({name: DataLoader(remote, collate_fn=coll, **kw)}, 1, samples)[name]
    cpu: dict[str, float] = {}
    ahead_epochs = max(2, epochs)
    main, children = _cpu_split()
    with rangeserver.serve_process(work, delay_s=delay_ms / 1000) as base:
        remote = MapDataset(f"{base}/{root.name}", fields=fields, cache=CacheOptions(requests=batch_size))
        ahead = DataLoader(remote, collate_fn=coll, batch_sampler=_ahead(remote, batch_size), **_no_batch(kw))
        rates[f"{name}, ranged, FetchAhead"] = max(_each_epoch({name: ahead}, ahead_epochs, samples)[name])
        del ahead  # its workers end and are waited for
        gc.collect()
        after_main, after_workers = _cpu_split()
    server = _cpu_split()[1] - after_workers  # (the server's process has ended)
    per = 1e6 / (samples * ahead_epochs)
    cpu["main process"] = (after_main - main) * per
    cpu["workers"] = (after_workers - children) * per
    cpu["server"] = server * per
    with rangeserver.serve_process(work, delay_s=delay_ms / 1000) as base:
        url = f"{base}/{root.name}"
        with tempfile.TemporaryDirectory(dir=work) as cache:
            whole = MapDataset(url, fields=fields, cache=CacheOptions(ranged=False, dir=cache))
            each = _each_epoch({name: DataLoader(whole, collate_fn=coll, **kw)}, max(2, epochs), samples)[name]
        rates[f"{name}, shards fetched whole: first epoch"] = each[0]
        rates[f"{name}, shards fetched whole: later epochs"] = max(each[1:])
    return {
        "samples/s": {k: round(v) for k, v in rates.items()},
        "CPU us a sample over HTTP with FetchAhead (all its epochs)": {k: round(v, 1) for k, v in cpu.items()},
    }


def _cpu_split() -> tuple[float, float]:
    """CPU seconds of this process, and of its child processes that have ended."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def photos(
    work: Path, *, n: int, workers: int, epochs: int, batch_size: int = 64, delay_ms: float | None = None
) -> dict[str, Any]:
    """JPEG photos with ``imagenet_train(224)``: MapDataset + DataLoader against the streaming
    reader, and with ``delay_ms`` MapDataset over HTTP by ranged requests (each answer delayed)."""
    from shardify.convert.options import ConvertOptions
    from shardify.convert.synth import make_imagefolder
    from shardify.convert.write.run import convert_imagefolder
    from shardify.reader import CacheOptions, MapDataset, ShardedDataset, make_loader
    from shardify.reader import transforms as T

    root = work / f"photos-{n}"
    if not (root / "manifest.json").exists():
        src = make_imagefolder(work / f"photos-src-{n}", classes=4, per_class=n // 4, sizes=((500, 375), (375, 500)))
        convert_imagefolder(src, root, options=ConvertOptions(progress=False, fsync=False))
    corpus.warm(root)
    n = len(MapDataset(root))
    stream = ShardedDataset(root, batch_size=batch_size, shuffle=True, transform=T.imagenet_train(224))
    mapped = MapDataset(root, transform=T.imagenet_train(224))
    kw: dict[str, Any] = dict(batch_size=batch_size, shuffle=True, num_workers=workers, persistent_workers=True)
    shape = (3, 224, 224)
    # One reader's epochs after the other's, not in turns: make_loader's persistent workers make
    # the next epoch's first batches as an epoch ends, which would take CPU from the other's epoch.
    rates, cpu_ms = {}, {}
    name = "ShardedDataset + make_loader"
    start = _cpu_s()
    with make_loader(stream, num_workers=workers) as streaming:
        rates |= _epochs({name: streaming}, epochs, n, shape)
    cpu_ms[name] = (_cpu_s() - start) / (n * epochs) * 1e3
    for name, collate in [
        ("MapDataset + DataLoader(collate_fn=MapDataset.collate)", mapped.collate),
        ("MapDataset + DataLoader (default_collate)", None),
    ]:
        start = _cpu_s()
        loader = DataLoader(mapped, collate_fn=collate, **kw)
        rates |= _epochs({name: loader}, epochs, n, shape)
        del loader  # its workers stop and are waited for: their CPU time is counted
        gc.collect()
        cpu_ms[name] = (_cpu_s() - start) / (n * epochs) * 1e3
    if delay_ms is not None:  # the same photos by ranged requests, the server a process of its own
        for ahead in (False, True):
            name = f"MapDataset over HTTP (+{delay_ms:g} ms a request), ranged, collate_fn=MapDataset.collate"
            name += ", FetchAhead" if ahead else ""
            start = _cpu_s()
            with rangeserver.serve_process(work, delay_s=delay_ms / 1000) as base:
                remote = MapDataset(
                    f"{base}/{root.name}", transform=T.imagenet_train(224), cache=CacheOptions(requests=batch_size)
                )
                how = {"batch_sampler": _ahead(remote, batch_size), **_no_batch(kw)} if ahead else kw
                loader = DataLoader(remote, collate_fn=remote.collate, **how)
                rates |= _epochs({name: loader}, epochs, n, shape)
                del loader
                gc.collect()
            cpu_ms[name] = (_cpu_s() - start) / (n * epochs) * 1e3  # (the server's process has ended: counted)
    return {
        "samples/s (best epoch)": {k: round(v) for k, v in rates.items()},
        "CPU ms a sample (this process and its workers, all epochs)": {k: round(v, 3) for k, v in cpu_ms.items()},
    }


def _ahead(ds: Any, batch_size: int) -> Any:
    """Shuffled batches of ``ds``, each naming the next 16 (``FetchAhead``)."""
    from shardify.reader import FetchAhead

    return FetchAhead(BatchSampler(RandomSampler(ds), batch_size, drop_last=False), ahead=16)


def _no_batch(kw: dict[str, Any]) -> dict[str, Any]:
    """``kw`` without what a ``batch_sampler=`` replaces."""
    return {k: v for k, v in kw.items() if k not in ("batch_size", "shuffle")}


def _cpu_s() -> float:
    """CPU seconds of this process and of its child processes that have ended (workers stopped)."""
    return sum(_cpu_split())


def keys(work: Path, n: int, lookups: int = 10_000) -> dict[str, Any]:
    from shardify.reader.io.keyindex import KeyIndex, key_hash, load_key_index, write_key_index

    path = work / f"keys-{n}.idx"
    if not path.exists():
        # random sorted hashes stand for n keys' (the lookup cost does not depend on which)
        print(f"writing {path} (run again for the figures of a process that only looks up)")
        hashes = np.sort(np.random.default_rng(0).integers(0, 2**63, n, dtype=np.uint64))
        hashes[:: max(1, n // lookups)] = 0  # (replaced below by real keys' hashes)
        wanted = [f"k{i}" for i in range(lookups)]
        real = np.array([key_hash(k) for k in wanted], dtype=np.uint64)
        hashes[: len(real)] = real
        hashes.sort()
        write_key_index(KeyIndex(hashes, np.arange(n, dtype=np.uint64)), path)
        del hashes
    before = _rss()
    index = load_key_index(path, nsamples=n)
    t = time.perf_counter()
    found = sum(bool(index.candidates(f"k{i}")) for i in range(lookups))
    per = (time.perf_counter() - t) / lookups
    after = _rss()
    return {
        "keys": n,
        "found": found,
        "us_per_lookup": round(per * 1e6, 1),
        "private_mb_before_after": [before["RssAnon"], after["RssAnon"]],
        "shared_file_pages_mb_after": after["RssFile"],
        "file_mb": round(path.stat().st_size / 2**20),
    }


def build_keys(work: Path, n: int) -> dict[str, Any]:
    """A key index of ``n`` generated keys written as ``MapDataset(key_index=...)`` writes it
    (``write_key_file``: buckets on disk), then by the in-memory build, each in a fresh process:
    seconds and peak resident memory added."""
    with get_context("spawn").Pool(1) as pool:
        disk = pool.apply(_build_keys, (str(work), n, True))
    with get_context("spawn").Pool(1) as pool:
        memory = pool.apply(_build_keys, (str(work), n, False))
    return {"keys": n, "write_key_file (bounded memory)": disk, "in memory (build_key_index)": memory}


def _build_keys(work: str, n: int, bounded: bool) -> dict[str, float]:
    from shardify.reader.io.keyindex import build_key_index, write_key_file, write_key_index

    keys = (f"shard-{i // 10000:06d}/sample-{i:010d}" for i in range(n))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=work) as d:
        if bounded:
            write_key_file(keys, f"{d}/k", nsamples=n)
        else:
            write_key_index(build_key_index(keys), f"{d}/k")
    took = time.perf_counter() - start
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    return {"seconds": round(took, 1), "peak_rss_added_mb": round(peak)}


def _rss() -> dict[str, int]:
    """This process's resident MB: private (``RssAnon``) and file pages mapped (``RssFile``:
    the page cache's, shared with every process mapping the file, dropped under pressure)."""
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f if line.startswith("Rss"))
    return {k: int(v.split()[0]) // 1024 for k, v in fields.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=20000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--http-delay-ms", type=float, default=20.0)
    p.add_argument("--keys", type=int, default=0, help="only the key lookup figure, at this many keys")
    p.add_argument("--build-keys", type=int, default=0, help="only the key index build, at this many keys")
    p.add_argument("--photos", type=int, default=0, help="only the JPEG figure, with this many photos")
    p.add_argument("--cpu", action="store_true", help="only each reader's samples per CPU second, in one process")
    p.add_argument("--dir", type=Path, default=None)
    a = p.parse_args()
    work = a.dir or Path(tempfile.gettempdir()) / "shardify-bench-mapview"
    work.mkdir(parents=True, exist_ok=True)
    if a.photos:
        delay = None if a.http_delay_ms < 0 else a.http_delay_ms
        print(json.dumps(photos(work, n=a.photos, workers=a.workers, epochs=a.epochs, delay_ms=delay), indent=1))
        return
    if a.build_keys:
        print(json.dumps(build_keys(work, a.build_keys), indent=1))
        return
    if a.keys:
        print(json.dumps(keys(work, a.keys), indent=1))
        return
    if a.cpu:
        out = cpu(work, samples=a.samples, batch_size=a.batch_size, epochs=a.epochs)
        print(json.dumps({"samples per CPU second, one process": out}, indent=1))
        return
    out = read(
        work,
        samples=a.samples,
        workers=a.workers,
        batch_size=a.batch_size,
        epochs=a.epochs,
        delay_ms=a.http_delay_ms,
    )
    print(json.dumps({**out, "cpus": os.cpu_count()}, indent=1))


if __name__ == "__main__":
    main()
