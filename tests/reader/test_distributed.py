"""A real 2-process torch.distributed (gloo) run: equal batch counts, no hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    import torch.distributed as dist
    from shardify.reader import BatchOptions, ShardedDataset, make_loader

    rank, root, rdv, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method="file://" + rdv, rank=rank, world_size=2)
    result = {}
    for drop_last in (False, True):
        batching = BatchOptions(drop_last=drop_last)
        ds = ShardedDataset(root, batch_size=3, fields=("cls",), shuffle=True, seed=4, batching=batching)
        loader = make_loader(ds, num_workers=2)
        for epoch in range(2):
            ds.set_epoch(epoch)
            seen, steps = [], torch.zeros(1)
            for batch in loader:
                step = torch.ones(1)
                dist.all_reduce(step)  # would hang if one rank had fewer batches
                steps += step
                seen += batch.tolist()
            result[f"{drop_last}-{epoch}"] = {"len": len(ds), "steps": int(steps), "seen": seen}
    dist.barrier()
    with open(out, "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
""")


def test_two_ranks_gloo_unequal_shards_fewer_than_ranks_times_workers(counting_dataset, tmp_path):
    root = counting_dataset([7, 2, 13])  # 3 shards < 2 ranks x 2 workers
    script = tmp_path / "rank.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), str(root), str(tmp_path / "rdv"), str(tmp_path / f"out{r}.json")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=90)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outputs)
    res = [json.loads((tmp_path / f"out{r}.json").read_text()) for r in range(2)]
    for name in res[0]:
        a, b = res[0][name], res[1][name]
        assert a["len"] == b["len"] and len(a["seen"]) == len(b["seen"])
        assert a["steps"] == b["steps"] == 2 * a["len"]  # every step all_reduced by both ranks
        union = a["seen"] + b["seen"]
        if name.startswith("False"):
            assert sorted(set(union)) == list(range(22)) and len(union) == 22  # 11 per rank, no pad needed
        else:
            assert len(set(union)) == len(union) and 22 - len(union) < 2 * 3
    assert res[0]["False-0"]["seen"] != res[0]["False-1"]["seen"]
