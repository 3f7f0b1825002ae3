"""``Stream`` mixing, ``samples_per_epoch`` and ``mark_repeats`` through the real loader."""

from __future__ import annotations

from collections import Counter

import pytest

from shardify.reader import SamplingOptions, ShardedDataset, Stream, make_loader


def text_only(n, offset):
    return [[(f"t{i:04d}", {"txt": str(offset + i).encode()}) for i in range(a, min(a + 4, n))] for a in range(0, n, 4)]


def from_books(sample):
    """A per-stream map: this stream has only ``txt``."""
    return int(sample["txt"]), sample["__stream__"], sample["__valid__"]


@pytest.fixture
def two_sources(tmp_path, shards, counting_dataset):
    web = counting_dataset([7, 2, 13], name="web")  # cls = txt = 0..21
    books = shards.write_dataset(tmp_path / "books", text_only(6, 1000))  # txt = 1000..1005
    return web, books


def mixed(web, books, **kw):
    return ShardedDataset(
        [Stream(web, weight=2, fields=("cls", "__stream__", "__valid__")), Stream(books, weight=1, map=from_books)],
        batch_size=4,
        shuffle=True,
        seed=1,
        sampling=SamplingOptions(samples_per_epoch=30, mark_repeats=True),
        **kw,
    )


def values(batches):
    return [(v, s) for ids, streams, ok in batches for v, s, o in zip(ids.tolist(), streams.tolist(), ok.tolist()) if o]


@pytest.mark.parametrize("workers", [0, 2])
def test_each_epoch_takes_exact_counts_of_each_stream(two_sources, workers):
    web, books = two_sources
    ds = mixed(web, books)
    assert ds.stream_counts == (20, 10) and len(ds) == 8
    used = Counter()
    with make_loader(ds, num_workers=workers) as loader:
        for epoch in range(3):
            ds.set_epoch(epoch)
            got = values(list(loader))
            assert Counter(s for _, s in got) == {0: 20, 1: 10}
            assert all((v >= 1000) == (s == 1) for v, s in got)
            books_seen = Counter(v for v, s in got if s == 1)
            assert set(books_seen) == set(range(1000, 1006)) and max(books_seen.values()) <= 3  # all, then 4 more
            used.update(v for v, s in got if s == 0)
    assert set(used) == set(range(22)) and max(used.values()) - min(used.values()) <= 1  # new subsets


def test_mixed_resume_on_other_workers_keeps_exact_counts(two_sources):
    web, books = two_sources
    with make_loader(mixed(web, books), num_workers=2) as loader:
        ds = loader.dataset
        ds.set_epoch(2)
        full = values(list(loader))
        ds.set_epoch(2)
        it = iter(loader)
        head = values([next(it) for _ in range(3)])
        state = loader.state_dict()
        del it
    with make_loader(mixed(web, books), num_workers=0) as loader:
        loader.load_state_dict(state)
        rest = values(list(loader))
    assert Counter(head + rest) == Counter(full)


def test_samples_per_epoch_with_one_source(counting_dataset):
    root = counting_dataset([7, 2, 13])
    ds = ShardedDataset(
        root, batch_size=5, fields=("cls",), shuffle=True, sampling=SamplingOptions(samples_per_epoch=10)
    )
    seen = []
    for epoch in range(4):
        ds.set_epoch(epoch)
        got = [x for b in ds for x in b.tolist()]
        assert len(got) == 10 and len(set(got)) == 10
        seen += got
    assert len(set(seen[:20])) == 20 and set(seen[:30]) == set(range(22))  # all once before any twice
    big = ShardedDataset(
        root, batch_size=5, fields=("cls",), shuffle=True, sampling=SamplingOptions(samples_per_epoch=50)
    )
    got = Counter(x for b in big for x in b.tolist())
    assert sum(got.values()) == 50 and set(got.values()) <= {2, 3}


@pytest.mark.parametrize("world, batch_size", [(3, 4), (4, 5), (5, 1)])
def test_mark_repeats_counts_every_sample_once_over_ranks(counting_dataset, monkeypatch, world, batch_size):
    root = counting_dataset([7, 2, 13])
    total, rows, lengths = Counter(), 0, set()
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        ds = ShardedDataset(
            root,
            batch_size=batch_size,
            shuffle=True,
            seed=2,
            sampling=SamplingOptions(mark_repeats=True),
            map=lambda d: (int(d["cls"]), d["__valid__"]),
        )
        batches = list(make_loader(ds, num_workers=0))
        lengths.add(len(batches))
        for cls, ok in batches:
            rows += len(cls)
            total.update(cls[ok].tolist())  # a metric summed over ranks, repeats masked out
    assert len(lengths) == 1 and rows > 22
    assert total == Counter(range(22))


def test_special_fields_need_their_option(counting_dataset):
    root = counting_dataset([3])
    with pytest.raises(ValueError, match="mark_repeats=True"):
        ShardedDataset(root, batch_size=2, fields=("cls", "__valid__"))
    with pytest.raises(ValueError, match="every stream a weight or none"):
        ShardedDataset([Stream(root, weight=1), Stream(root)], batch_size=2)
    with pytest.raises(TypeError, match="not both"):
        ShardedDataset([Stream(root), str(root)], batch_size=2)
    ds = ShardedDataset(Stream(root), batch_size=3, fields=("cls", "__stream__", "__key__"))
    ((cls, stream, keys),) = list(ds)
    assert stream.tolist() == [0, 0, 0] and list(keys) == ["s000_00000", "s000_00001", "s000_00002"]


def test_gzip_shards_are_read_whole_not_in_blocks(tmp_path, shards) -> None:
    """A .tgz cannot seek: blocks across ranks would inflate each shard once per block."""
    import gzip

    urls = []
    for i, samples in enumerate(shards.counting([40, 40, 40])):
        path = tmp_path / f"part-{i}.tgz"
        path.write_bytes(gzip.compress(shards.tar_bytes(samples), mtime=0))
        urls.append(str(path))
    ds = ShardedDataset(urls, batch_size=8, shuffle=True, seed=3, fields=("cls",))
    assert sorted(ds.epoch_sequence(0)) == [(0, 0, 40), (1, 0, 40), (2, 0, 40)]  # whole shards
    assert sorted(int(x) for b in make_loader(ds, num_workers=2) for x in b) == list(range(120))
    plain = tmp_path / "plain.tar"
    plain.write_bytes(shards.tar_bytes(shards.counting([40])[0]))
    assert (
        len(tuple(ShardedDataset([str(plain)], batch_size=8, shuffle=True, seed=3, fields=("cls",)).epoch_sequence(0)))
        > 1
    )
