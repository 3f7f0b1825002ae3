"""FetchAhead: a batch sampler read early, whose batches tell MapDataset which ones to fetch
before they are asked for; the batches are the wrapped sampler's, and fetching ahead never
changes what a batch holds."""

from __future__ import annotations

import pickle
from concurrent.futures import wait
from pathlib import Path

import numpy as np
import pytest
import rangeserver  # tools/rangeserver.py (pytest's pythonpath holds tools/)
from builders import text_dataset
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, RandomSampler, SequentialSampler

from shardify.errors import SampleChecksumError, ShardFormatError
from shardify.reader import CacheOptions, DecodeOptions, FetchAhead, MapDataset, ShardedDataset
from shardify.reader.mapahead import AheadBatch, batches_for_worker
from shardify.remote import RetryPolicy

FIELDS = ("__key__", "txt", "cls")
N = 42
FAST = RetryPolicy(retries=1, backoff_s=0.01)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return text_dataset(tmp_path_factory.mktemp("ahead") / "www" / "ds", n=N, per_shard=8)


@pytest.fixture(scope="module")
def stored(root: Path) -> list[tuple[str, str, int]]:
    from shardify.reader import BatchOptions

    ds = ShardedDataset(root, batch_size=1, fields=FIELDS, batching=BatchOptions(collate_fn=list))
    return [tuple(s) for batch in ds for s in batch]


def _batch(indices: list[int], number: int, ahead: list[list[int]], run: int = 1) -> AheadBatch:
    return AheadBatch(indices, number=number, run=run, ahead=tuple(np.array(a, np.int64) for a in ahead))


@pytest.mark.parametrize("ahead", [0, 1, 3, 16, 100])
@pytest.mark.parametrize("n, size, drop_last", [(0, 4, False), (10, 4, False), (10, 4, True), (12, 3, False)])
def test_the_batches_are_the_wrapped_samplers_each_naming_those_after_it(
    ahead: int, n: int, size: int, drop_last: bool
) -> None:
    inner = BatchSampler(SequentialSampler(range(n)), size, drop_last)
    got = list(FetchAhead(inner, ahead=ahead))
    want = list(inner)
    assert [list(b) for b in got] == want and len(FetchAhead(inner, ahead=ahead)) == len(want)
    for b in got:
        assert isinstance(b, AheadBatch) and type(b.number) is int
        assert [a.tolist() for a in b.ahead] == want[b.number + 1 : b.number + 1 + ahead]
    assert [b.number for b in got] == list(range(len(want)))


def test_each_iteration_is_a_new_run_and_a_batch_pickles_whole() -> None:
    fa = FetchAhead(BatchSampler(SequentialSampler(range(9)), 2, False), ahead=2)
    first, second = next(iter(fa)), next(iter(fa))
    assert first.run != second.run
    back = pickle.loads(pickle.dumps(first))
    assert type(back) is AheadBatch and back == [0, 1] and (back.number, back.run) == (0, first.run)
    assert [a.tolist() for a in back.ahead] == [[2, 3], [4, 5]]


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_a_worker_fetches_the_batches_dealt_to_it_after_this_one(workers: int) -> None:
    b = _batch([0], 10, [[i] for i in range(11, 23)])  # batches 11..22 named
    got = batches_for_worker(b, workers)
    assert [n for n, _ in got] == list(range(10 + workers, 23, workers))
    assert all(idx.tolist() == [n] for n, idx in got)
    with pytest.raises(ValueError):
        batches_for_worker(b, 0)


def test_set_epoch_reaches_the_sampler_wrapped_and_changes_the_order() -> None:
    data = list(range(30))
    inner = BatchSampler(DistributedSampler(data, num_replicas=3, rank=1, shuffle=True, seed=3), 4, False)
    fa = FetchAhead(inner, ahead=4)
    fa.set_epoch(0)
    zero = [list(b) for b in fa]
    fa.set_epoch(1)
    one = [list(b) for b in fa]
    assert zero != one
    inner.sampler.set_epoch(0)
    assert zero == list(inner)
    inner.sampler.set_epoch(1)
    assert one == list(inner)
    with pytest.raises(AttributeError):
        FetchAhead([[1], [2]]).set_epoch(1)
    with pytest.raises(ValueError):
        FetchAhead(inner, ahead=-1)
    with pytest.raises(TypeError):
        FetchAhead(fa)


def test_over_http_a_batch_fetched_ahead_is_read_without_a_request(root: Path, stored: list) -> None:
    with rangeserver.serve(root.parent) as (base, behaviour):
        ds = MapDataset(f"{base}/{root.name}", fields=FIELDS, cache=CacheOptions(retry=FAST))
        first, later = [3, 17, 30], [1, 9, 25, 41]
        assert [tuple(s) for s in ds.__getitems__(_batch(first, 0, [later]))] == [stored[i] for i in first]
        pending = set(ds._bytes._ahead.values())
        assert len(ds._bytes._ahead) == len(later) and pending
        wait(pending, timeout=60)
        gets = behaviour.gets
        assert [tuple(s) for s in ds.__getitems__(_batch(later, 1, []))] == [stored[i] for i in later]
        assert behaviour.gets == gets, "every sample of batch 1 was fetched ahead"
        assert not ds._bytes._ahead
        again = [2, 3]  # not fetched ahead: read when asked for
        assert [tuple(s) for s in ds.__getitems__(_batch(again, 2, []))] == [stored[i] for i in again]
        assert behaviour.gets > gets


def test_over_http_every_sample_once_through_a_dataloader(root: Path, stored: list) -> None:
    with rangeserver.serve(root.parent) as (base, _):
        ds = MapDataset(f"{base}/{root.name}", fields=FIELDS, cache=CacheOptions(retry=FAST))
        for workers in (0, 2):
            batches = FetchAhead(BatchSampler(RandomSampler(ds), 5, False), ahead=4)
            loader = DataLoader(ds, batch_sampler=batches, num_workers=workers, collate_fn=list)
            got = [tuple(s) for b in loader for s in b]
            assert sorted(got) == sorted(stored)


def test_a_batch_dealt_out_of_turn_or_a_new_run_is_still_exact(root: Path, stored: list) -> None:
    with rangeserver.serve(root.parent) as (base, _):
        ds = MapDataset(f"{base}/{root.name}", fields=FIELDS, cache=CacheOptions(retry=FAST))
        ds.__getitems__(_batch([0], 0, [[5, 6], [7]]))
        assert [tuple(s) for s in ds.__getitems__(_batch([7], 2, []))] == [stored[7]]  # batch 1 skipped
        assert [tuple(s) for s in ds.__getitems__(_batch([8], 0, [[40]], run=2))] == [stored[8]]
        assert [tuple(s) for s in ds.__getitems__(_batch([40, 5], 1, [], run=2))] == [stored[40], stored[5]]
        with pytest.raises(IndexError):
            ds.__getitems__(_batch([N], 3, [], run=2))
        ds.__getitems__(_batch([1], 0, [[N + 5]], run=3))  # a bad index ahead: raised only when asked for
        with pytest.raises(IndexError):
            ds.__getitems__(_batch([N + 5], 1, [], run=3))


def _damaged(tmp_path: Path, stored: list, index: int) -> Path:
    copy = text_dataset(tmp_path / "www" / "ds", n=N, per_shard=8)
    ds = MapDataset(copy, fields=FIELDS)
    shard, pos = ds.locate(index)
    path = Path(ds.source.urls[shard])
    data = bytearray(path.read_bytes())
    data[ds._bytes.offset(shard, pos) + 600] ^= 0xFF
    path.write_bytes(bytes(data))
    return copy


def test_a_damaged_sample_fetched_ahead_is_an_error_when_its_batch_is_asked_for_or_skipped(
    tmp_path: Path, stored: list
) -> None:
    copy = _damaged(tmp_path, stored, 10)
    with rangeserver.serve(copy.parent) as (base, _):
        url = f"{base}/{copy.name}"
        ds = MapDataset(url, fields=FIELDS, cache=CacheOptions(retry=FAST))
        assert [tuple(s) for s in ds.__getitems__(_batch([0], 0, [[9, 10, 11]]))] == [stored[0]]
        with pytest.raises(SampleChecksumError) as e:
            ds.__getitems__(_batch([9, 10, 11], 1, []))
        assert e.value.key == stored[10][0] and e.value.shard == f"{url}/{Path(ds.source.urls[1]).name}"
        skip = MapDataset(url, fields=FIELDS, cache=CacheOptions(retry=FAST), decoding=DecodeOptions(on_error="skip"))
        skip.__getitems__(_batch([0], 0, [[9, 10, 11]]))
        got = skip.__getitems__(_batch([9, 10, 11], 1, []))
        assert [s[0] for s in got] == [stored[9][0], stored[11][0]] and skip.skipped == 1


def test_a_fetch_ahead_that_fails_is_raised_by_the_batch_that_asks_for_it(tmp_path: Path) -> None:
    copy = text_dataset(tmp_path / "www" / "ds", n=N, per_shard=8)
    with rangeserver.serve(copy.parent) as (base, behaviour):
        ds = MapDataset(f"{base}/{copy.name}", fields=FIELDS, cache=CacheOptions(retry=FAST))
        ds.__getitems__([0])  # the index and tables, before the server fails
        shard, _ = ds.locate(20)
        url = ds.source.urls[shard]
        behaviour.error_status, behaviour.fault_paths = 404, (Path(url).name,)
        assert len(ds.__getitems__(_batch([1], 0, [[20]]))) == 1, "this batch's own shard answers"
        wait(set(ds._bytes._ahead.values()), timeout=60)
        with pytest.raises(ShardFormatError) as e:
            ds.__getitems__(_batch([20], 1, []))
        assert e.value.shard == url and "404" in str(e.value)


def test_over_http_a_batch_is_one_multi_range_request_a_shard(root: Path, stored: list) -> None:
    with rangeserver.serve(root.parent) as (base, behaviour):
        ds = MapDataset(f"{base}/{root.name}", fields=FIELDS, cache=CacheOptions(retry=FAST))
        ds.__getitems__([0])  # the index and tables
        scattered = list(range(0, N, 4))  # every fourth sample: further apart than a multi-range request joins
        behaviour.reset()
        assert [tuple(s) for s in ds.__getitems__(scattered)] == [stored[i] for i in scattered]
        shards = {ds.locate(i)[0] for i in scattered}
        assert behaviour.gets == len(shards), "one GET for each shard's samples"
        sent = behaviour.sent
        wanted = sum(len(ds._bytes.read([ds.locate(i)])[0]) for i in scattered)
        assert sent < wanted * 1.3, "only the samples' bytes, not the gaps between them"


def test_over_http_a_server_that_refuses_many_ranges_is_asked_one_range_a_request(root: Path, stored: list) -> None:
    with rangeserver.serve(root.parent, rangeserver.Behaviour(multi_range="whole")) as (base, behaviour):
        ds = MapDataset(f"{base}/{root.name}", fields=FIELDS, cache=CacheOptions(retry=FAST))
        ds.__getitems__([0])
        apart = [1, 7]  # two samples of shard 0, further apart than a multi-range request joins
        behaviour.reset()
        assert [tuple(s) for s in ds.__getitems__(apart)] == [stored[i] for i in apart]
        assert behaviour.gets == 1 + len(apart), "refused once, then a request a range"
        behaviour.reset()
        assert [tuple(s) for s in ds.__getitems__(apart)] == [stored[i] for i in apart]
        assert behaviour.gets == 1, "the refusal remembered: neighbours joined as for one range a request"


def test_a_damaged_sample_in_a_multi_range_answer_names_shard_and_key(tmp_path: Path, stored: list) -> None:
    copy = _damaged(tmp_path, stored, 10)
    with rangeserver.serve(copy.parent) as (base, behaviour):
        url = f"{base}/{copy.name}"
        ds = MapDataset(url, fields=FIELDS, cache=CacheOptions(retry=FAST))
        ds.__getitems__([0])
        behaviour.reset()
        with pytest.raises(SampleChecksumError) as e:
            ds.__getitems__([8, 10, 12, 14])
        assert behaviour.gets == 1
        assert e.value.key == stored[10][0] and e.value.shard == f"{url}/{Path(ds.source.urls[1]).name}"
