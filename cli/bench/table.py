"""``format_bench``: the figures of :func:`~shardify.cli.bench.measure.run_bench` as a table for people."""

from __future__ import annotations

from typing import Any

__all__ = ["format_bench"]


def format_bench(r: dict[str, Any]) -> str:
    """The figures of :func:`run_bench` as a table."""
    w = r["num_workers"]
    q, b, i = r["shuffle_quality"], r["shuffle_quality_buffer_only"], r["shuffle_quality_imagenet"]
    if "not_measured" in r:
        return _format_without_images(r)
    rows = [
        (
            "dataset",
            f"{r['samples']} samples in {r['shards']} shards, batches of {r['batch_size']}, "
            f"{w} workers, RandomResizedCrop {r['image_size']} + flip, uint8",
        ),
        ("(a) single process, fast path", f"{r['single_process_ips']:.0f} images/s"),
        ("    single process, plain PIL", f"{r['single_process_plain_ips']:.0f} images/s"),
    ]
    fd = r.get("fast_decode_vs_exact")
    if fd:
        rows.append(
            (
                "    fast IDCT (fast_decode=True)",
                f"{fd['ratio']:.2f} x the exact path ({fd['fast_ips']:.0f} vs "
                f"{fd['exact_ips']:.0f} images per CPU second); pixels off by {fd['mean_abs_diff']:.2f} on average, "
                f"{fd['max_abs_diff']:.0f} at most (0..255), {100 * fd['share_differing']:.0f}% differ",
            )
        )
    if r.get("independent_processes_ips"):
        rows.append(
            (
                f"    {w} bare processes at once",
                f"{r['independent_processes_ips']:.0f} images/s = "
                f"{r['independent_vs_2x_single']:.2f} x {w} x (a)  (this machine's ceiling for (b))",
            )
        )
    rows.append(
        (
            f"(b) shardify loader, {w} workers",
            f"{r['loader_ips']:.0f} images/s = {r['loader_vs_2x_single']:.2f} x {w} x (a)  (target >= 0.90)",
        )
    )
    if "webdataset_ips" in r:
        rows.append(
            (
                f"(c) webdataset, {w} workers",
                f"{r['webdataset_ips']:.0f} images/s; shardify = {r['loader_vs_webdataset']:.2f} x  (target >= 1.30)",
            )
        )
    rows += _where_the_time_went(r)
    rows += [
        ("(d) time to first batch", f"{r['first_batch_s']:.2f} s  (target < 1 s)"),
        ("(e) memory by epoch (PSS, MB)", " ".join(f"{m:.0f}" for m in r["memory_mb_per_epoch"])),
        ("    loader images/s by epoch", " ".join(f"{x:.0f}" for x in r["loader_ips_per_epoch"])),
        (
            "(f) shuffle: mean gap / (N/3)",
            f"{q['gap']:.2f}, {q['shards_per_batch']:.1f} shards per batch "
            f"(buffer alone: {b['gap']:.2f}, {b['shards_per_batch']:.1f}; full permutation: 1.00)",
        ),
        (
            "    at ImageNet scale",
            f"{i['gap']:.2f}, {i['shards_per_batch']:.1f} shards per batch of 256 "
            "(1.28 M samples in 1024 shards, 8 workers; full permutation: 1.00, ~226)",
        ),
    ]
    mix, old = r["class_mixing"], r["class_mixing_whole_shards"]
    rows.append(
        (
            "(g) classes per batch / permutation",
            ", ".join(f"world {w}: {mix[w]:.2f}" for w in mix)
            + "  (target >= 0.90; class-sorted shards, 100 classes x 1000, batches of 256, 4 workers; "
            "whole shards per rank as before: " + ", ".join(f"{old[w]:.2f}" for w in old) + ")",
        )
    )
    return _table(rows)


def _where_the_time_went(r: dict[str, Any]) -> list[tuple[str, str]]:
    """(b)'s epoch as ``loader.stats()`` saw it (see docs/bottleneck.md)."""
    s = r.get("loader_stats")
    if not s:
        return []
    stages = ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in s["stages"].items() if v >= 0.005)
    return [
        (
            "    where its time went",
            f"the loop waited {s['wait_fraction']:.0%} of {s['wall_s']:.2f} s; workers busy "
            f"{s['worker_utilisation']:.0%}; stage seconds over the workers: {stages or 'none'}",
        ),
        ("    bottleneck", f"{s['bottleneck']} ({s['dominant']}); {s['advice']}"),
    ]


def _table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _format_without_images(r: dict[str, Any]) -> str:
    q = r["shuffle_quality"]
    return _table(
        [
            (
                "dataset",
                f"{r['samples']} samples in {r['shards']} shards, batches of {r['batch_size']}, "
                f"{r['num_workers']} workers, fields {', '.join(r['fields'])}",
            ),
            ("not measured", r["not_measured"]),
            (f"(b) shardify loader, {r['num_workers']} workers", f"{r['loader_ips']:.0f} samples/s"),
            *_where_the_time_went(r),
            ("(d) time to first batch", f"{r['first_batch_s']:.2f} s"),
            ("(e) memory by epoch (PSS, MB)", " ".join(f"{m:.0f}" for m in r["memory_mb_per_epoch"])),
            ("(f) shuffle: mean gap / (N/3)", f"{q['gap']:.2f}, {q['shards_per_batch']:.1f} shards per batch"),
        ]
    )
