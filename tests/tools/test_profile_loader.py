"""tools/profile_loader.py on a tiny dataset: every stage is timed and the table prints."""

from __future__ import annotations

import importlib.util
from pathlib import Path

TOOLS = Path(__file__).parents[2] / "tools"


def test_profile_loader_times_every_stage(image_dataset: Path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(TOOLS))
    spec = importlib.util.spec_from_file_location("profile_loader", TOOLS / "profile_loader.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    r = module.profile(image_dataset, workers=[0, 2], batch_size=4, size=16, batches=3, repeat=1, limit=8)
    stages = r["stages"]
    for name in ("read_us", "decode_us", "decode_augment_us", "collate_ms", "header_draw_us", "pack_ms"):
        assert stages[name] > 0, name
    for row in r["loaders"]:
        assert row["cpu_path_img_s"] > 0 and row["device_worker_side_img_s"] > 0 and row["main_ms_per_batch"] >= 0
    table = module.format_profile(r)
    assert "device decode, worker: header parse" in table and "| 2 |" in table
