"""Corrupt samples and damaged shards: clear errors in the trainer, or skip, count, and pad."""

from __future__ import annotations

import logging

import pytest

from shardify.errors import SampleError, ShardFormatError
from shardify.reader import DecodeOptions, ShardedDataset, make_loader
from shardify.reader import transforms as T


@pytest.fixture
def corrupt_dataset(tmp_path, shards):
    """The 7-2-13 image dataset with sample img00009 (in shard 1) holding garbage as its jpg."""
    data = shards.images([7, 2, 13], size=(24, 20))
    key, fields = data[1][0]
    data[1][0] = (key, {**fields, "jpg": b"\xff\xd8\xff" + b"not a jpeg" * 20})
    return shards.write_dataset(tmp_path / "bad", data)


def images(root, **kw) -> ShardedDataset:
    return ShardedDataset(root, batch_size=4, transform=T.RandomResizedCrop(8), shuffle=True, **kw)


def test_corrupt_sample_error_reaches_the_trainer_with_shard_and_key(corrupt_dataset):
    with pytest.raises(SampleError) as caught:
        list(make_loader(images(corrupt_dataset), num_workers=2))
    message = str(caught.value)
    assert "train-000001.tar" in message and "'img00007'" in message
    assert "field 'jpg'" in message and "cannot decode image" in message


def test_skip_counts_reports_and_keeps_batch_counts_equal(corrupt_dataset, monkeypatch, caplog):
    monkeypatch.setenv("WORLD_SIZE", "2")
    counts, bad = [], 0
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        ds = images(corrupt_dataset, decoding=DecodeOptions(on_error="skip"))
        with caplog.at_level(logging.WARNING, logger="shardify.reader"):
            batches = list(make_loader(ds, num_workers=2))
        counts.append(len(batches))
        assert all(len(labels) == 4 for _, labels in batches[:-1])
        report = ds.last_epoch_report
        bad += report.bad
        if report.bad:
            assert report.entries[0][:2] == (str(corrupt_dataset / "train-000001.tar"), "img00007")
            assert "img00007" in caplog.text and "skipped 1 bad samples" in caplog.text
    assert counts == [len(ds)] * 2 and bad == 1


def test_reading_in_process_logs_the_report_once(corrupt_dataset, caplog):
    """Without workers the dataset itself logs the epoch's report at its end (the loader logs
    it only for its workers): once, naming the sample."""
    ds = images(corrupt_dataset, decoding=DecodeOptions(on_error="skip"))
    with caplog.at_level(logging.WARNING, logger="shardify.reader"):
        assert len(list(make_loader(ds, num_workers=0))) == len(ds)
    assert caplog.text.count("skipped 1 bad samples") == 1 and "img00007" in caplog.text


def test_truncated_shard_raises_naming_it(tmp_path, shards):
    root = shards.write_dataset(tmp_path / "t", shards.counting([6, 10]))
    shard = root / "train-000001.tar"
    shard.write_bytes(shard.read_bytes()[: 5 * 2048 + 100])
    with pytest.raises(ShardFormatError, match="train-000001.tar.*truncated"):
        list(make_loader(ShardedDataset(root, batch_size=4, fields=("cls",)), num_workers=2))


def test_truncated_shard_with_skip_keeps_earlier_samples_and_reports_the_loss(tmp_path, shards):
    root = shards.write_dataset(tmp_path / "t", shards.counting([6, 10]))
    shard = root / "train-000001.tar"
    shard.write_bytes(shard.read_bytes()[: 5 * 2048 + 100])  # 2 KiB a sample: damage in global 11
    ds = ShardedDataset(root, batch_size=4, fields=("cls",), decoding=DecodeOptions(on_error="skip"))
    batches = [[int(x) for x in b] for b in ds]
    assert len(batches) == len(ds) == 4 and all(len(b) == 4 for b in batches)
    # 11..15 are lost (10, read in full before the damaged header, is kept); repeats of good
    # samples fill their places
    assert set(x for b in batches for x in b) == set(range(11))
    report = ds.last_epoch_report
    assert (report.bad, report.lost) == (0, 5) and "train-000001.tar" in report.entries[0][0]


def test_a_member_behind_a_corrupt_header_is_reported_as_the_damage_not_a_field_to_choose(tmp_path):
    """A sample whose second member's header is corrupt is read up to it: the field it then lacks
    is reported as behind the damaged header, never as a field ``fields=`` should leave out."""
    import tarfile

    from shardify.convert import ShardWriter

    with ShardWriter(tmp_path / "ds", samples_per_shard=10, fsync=False) as w:
        for i in range(10):
            w.write({"json": {"i": i}, "cls": i})
    shard = next((tmp_path / "ds").glob("train-*.tar"))
    with tarfile.open(shard) as tar:
        header = [m for m in tar.getmembers() if m.name.endswith(".json")][3].offset
    data = bytearray(shard.read_bytes())
    data[header + 148] ^= 0x11  # the checksum field of sample 3's json member: no longer octal
    shard.write_bytes(bytes(data))
    unchecked = DecodeOptions(on_error="skip", check_samples=False)  # by the tar headers alone
    ds = ShardedDataset(tmp_path / "ds", batch_size=2, fields=("json", "cls"), decoding=unchecked)
    list(make_loader(ds))
    report = ds.last_epoch_report
    (shard_name, key, reason), *_ = [e for e in report.entries if e[1] is not None]
    assert (shard_name, key) == (str(shard), "000000003")
    assert reason.startswith("ShardFormatError: no field 'json' (sample has ['cls']): the tar header after its")
    assert f"corrupt header at byte {header}" in reason and "fields=" not in reason
    for decoding in (DecodeOptions(check_samples=False), DecodeOptions()):  # raise: either way, the header named
        with pytest.raises((SampleError, ShardFormatError), match=f"corrupt header at byte {header}"):
            list(make_loader(ShardedDataset(tmp_path / "ds", batch_size=2, fields=("json", "cls"), decoding=decoding)))


def test_a_batch_with_no_good_sample_borrows_from_the_next(tmp_path, shards):
    root = shards.write_dataset(tmp_path / "g", shards.counting([4, 4, 4]))
    (root / "train-000001.tar").write_bytes(b"\x00garbage" * 300)
    ds = ShardedDataset(root, batch_size=4, fields=("cls",), decoding=DecodeOptions(on_error="skip"))
    assert [[int(x) for x in b] for b in ds] == [[0, 1, 2, 3], [8] * 4, [8, 9, 10, 11]]
    assert ds.last_epoch_report.lost == 4
    (root / "train-000002.tar").write_bytes(b"\x00garbage" * 300)
    assert [[int(x) for x in b] for b in ds] == [[0, 1, 2, 3], [3] * 4, [3] * 4]
    for i in (0,):
        (root / f"train-00000{i}.tar").write_bytes(b"")
    with pytest.raises(SampleError, match="nothing to pad them with"):
        list(ds)


# -- shards missing or unreadable --------------------------------------------------------------------


def _gone(shard) -> None:
    shard.unlink()


def _a_directory(shard) -> None:
    shard.unlink()
    shard.mkdir()


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("policy", ["raise", "skip"])
@pytest.mark.parametrize("damage", [_gone, _a_directory], ids=["deleted", "directory"])
def test_a_shard_gone_between_epochs_follows_the_error_policy(tmp_path, shards, workers, policy, damage):
    root = shards.write_dataset(tmp_path / "d", shards.counting([8, 12, 8]))
    ds = ShardedDataset(root, batch_size=4, fields=("cls",), shuffle=True, decoding=DecodeOptions(on_error=policy))
    # (epoch_ahead=False: made ahead, epoch 1's first batches would be read before the damage)
    with make_loader(ds, num_workers=workers, epoch_ahead=False) as loader:
        assert sorted(int(x) for b in loader for x in b) == list(range(28))  # every shard scanned and open
        damage(root / "train-000001.tar")
        ds.set_epoch(1)
        if policy == "raise":
            with pytest.raises(ShardFormatError, match="train-000001.tar: cannot read") as caught:
                list(loader)
            assert not isinstance(caught.value, OSError)
            return
        batches = list(loader)
    assert len(batches) == len(ds)
    got = {int(x) for b in batches for x in b}
    assert got == set(range(8)) | set(range(20, 28))  # the other shards whole, gaps padded by repeats
    report = ds.last_epoch_report
    assert report.lost == 12 and report.bad == 0
    assert all("train-000001.tar" in reason for _, _, reason in report.entries)


@pytest.mark.parametrize("policy", ["raise", "skip"])
@pytest.mark.parametrize("bad", ["missing.tar", "folder.tar", "empty.tar"])
def test_a_listed_shard_missing_or_unreadable_follows_the_error_policy(tmp_path, shards, policy, bad):
    good = tmp_path / "good.tar"
    good.write_bytes(shards.tar_bytes(shards.counting([6])[0]))
    (tmp_path / "folder.tar").mkdir()
    (tmp_path / "empty.tar").write_bytes(b"")
    urls = [str(good), str(tmp_path / bad)]
    if policy == "raise":
        with pytest.raises(ShardFormatError, match=f"shard {urls[1]}: "):
            ShardedDataset(urls, batch_size=4, fields=("cls",))
        return
    ds = ShardedDataset(urls, batch_size=4, fields=("cls",), decoding=DecodeOptions(on_error="skip"))
    assert [u for u, _ in ds.source.unreadable] == [urls[1]] and ds.num_samples == 6
    with make_loader(ds, num_workers=2) as loader:
        assert sorted(int(x) for b in loader for x in b) == list(range(6))
