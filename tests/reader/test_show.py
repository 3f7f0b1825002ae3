"""``shardify show``: a PNG contact sheet of the data, or a text summary without images."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from shardify.cli import EXIT_OK, main
from shardify.reader.io.sources import resolve_source
from shardify.reader.sample import transforms as T
from shardify.reader.show import contact_sheet, spread_positions


@pytest.mark.parametrize(
    "total, n, expected",
    [
        (10, 4, [0, 2, 5, 7]),
        (3, 8, [0, 1, 2]),
        (1, 1, [0]),
        (100, 1, [0]),
    ],
)
def test_spread_positions(total: int, n: int, expected: list[int]) -> None:
    assert spread_positions(total, n) == expected


def _tiles(img: np.ndarray, *, cols: int, rows: int, per_cell: int, tile: int) -> list[np.ndarray]:
    """The image tiles of a sheet, cell by cell (the layout of show.contact_sheet: gap 4, caption 26)."""
    gap, cell_h = 4, tile + 26
    cell_w = per_cell * tile + (per_cell - 1) * gap
    out = []
    for r in range(rows):
        for c in range(cols):
            x0, y0 = gap + c * (cell_w + gap), gap + r * (cell_h + gap)
            out += [img[y0 : y0 + tile, x0 + j * (tile + gap) : x0 + j * (tile + gap) + tile] for j in range(per_cell)]
    return out


def test_cli_writes_a_sheet_whose_tiles_differ(image_dataset: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "sheet.png"
    assert main(["show", str(image_dataset), "-n", "9", "--tile", "32", "-o", str(out)]) == EXIT_OK
    assert "3x3 grid" in capsys.readouterr().out
    img = np.asarray(Image.open(out).convert("RGB"))
    width = 3 * 32 + 4 * 4
    assert img.shape == (3 * (32 + 26) + 4 * 4, width, 3)
    tiles = _tiles(img, cols=3, rows=3, per_cell=1, tile=32)
    assert all(t.std() > 0 for t in tiles)  # each holds a picture, not the background
    assert len({t.tobytes() for t in tiles}) == 9  # nine different samples


def test_augmented_views_differ_and_match_the_loader(image_dataset: Path) -> None:
    source = resolve_source(image_dataset)
    transform = T.imagenet_train(32)
    sheet = contact_sheet(source, n=2, transform=transform, views=3, tile=32, columns=1)
    assert sheet.image is not None and sheet.image.size == (4 * 32 + 3 * 4 + 2 * 4, 2 * (32 + 26) + 3 * 4)
    views = _tiles(np.asarray(sheet.image), cols=1, rows=2, per_cell=4, tile=32)[1:4]
    assert len({v.tobytes() for v in views}) == 3  # three epochs, three different crops
    key, label = sheet.cells[0]
    assert label in {"a (0)", "b (1)", "c (2)"}
    from shardify.reader.io.stream import ShardReader
    from shardify.reader.plan.shuffle import sample_rng

    data = next(
        iter(ShardReader([source.shards[0].url], [source.shards[0].nsamples], skip_damaged=False).read(0, 0, 1))
    )
    assert data["__key__"] == key
    expected = T.run_image_transform(transform, data["jpg"], rng=sample_rng(0, 1, key))  # epoch 1's view
    assert np.array_equal(views[1], expected.permute(1, 2, 0).numpy())  # the loader's draw for this key and epoch


def test_split_without_images_gets_a_text_summary(tmp_path: Path, capsys) -> None:
    from shardify.convert.options import ConvertOptions
    from shardify.convert.write.run import convert_ids

    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        torch.save(torch.zeros(2, 5), data / f"id{i}.pt")
    (tmp_path / "p.json").write_text('{"train": ["id0", "id1", "id2"]}')
    (tmp_path / "l.json").write_text('{"id0": 0, "id1": 1, "id2": 2}')
    convert_ids(
        data,
        tmp_path / "out",
        partition=tmp_path / "p.json",
        labels=tmp_path / "l.json",
        options=ConvertOptions(workers=1, progress=False, fsync=False),
    )
    assert main(["show", str(tmp_path / "out"), "-o", str(tmp_path / "x.png")]) == EXIT_OK
    out = capsys.readouterr()
    assert "no images" in out.out and "Tensor (2, 5) torch.float32" in out.out and "cls=0" in out.out
    assert "wrote no picture" in out.err and not (tmp_path / "x.png").exists()
