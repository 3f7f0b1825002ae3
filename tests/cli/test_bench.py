"""run_bench on a tiny dataset: every figure is there and the table prints."""

from __future__ import annotations

from shardify.cli.bench import format_bench, process_memory, run_bench


def test_run_bench_smoke(image_dataset):
    r = run_bench(image_dataset, batch_size=4, num_workers=2, image_size=16, epochs=2)
    for name in (
        "single_process_ips",
        "independent_processes_ips",
        "loader_ips",
        "webdataset_ips",
        "first_batch_s",
        "loader_vs_webdataset",
    ):
        assert r[name] > 0
    assert len(r["memory_mb_per_epoch"]) == 2
    assert 0 < r["shuffle_quality"]["gap"] and r["shuffle_quality_imagenet"]["shards_per_batch"] > 10
    assert "(f) shuffle" in format_bench(r) and "(g) classes per batch" in format_bench(r)
    assert min(r["class_mixing"].values()) >= 0.9 > r["class_mixing_whole_shards"][8]
    assert process_memory() > 0
    stats = r["loader_stats"]  # (b) is the loader's own stats() of its best epoch
    assert stats["samples_per_s"] == r["loader_ips"] and stats["samples"] == 22
    assert stats["bottleneck"] == "input"  # the bench's loop does nothing per batch
    assert "where its time went" in format_bench(r) and "bottleneck" in format_bench(r)
