"""Where a manifest or index may send a reader (:mod:`shardify.locations`): under its own folder,
a local one after resolving links, or under a prefix the user allows."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shardify.errors import LocationError
from shardify.locations import check_in_folder, check_location


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """``ds/{a.tar, in -> ds/a.tar, out -> other/b.tar, sub/c.tar}``, ``other/b.tar``, ``alias -> ds``."""
    (tmp_path / "ds" / "sub").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    for name in ("ds/a.tar", "other/b.tar", "ds/sub/c.tar"):
        (tmp_path / name).write_bytes(b"x")
    os.symlink(tmp_path / "ds" / "a.tar", tmp_path / "ds" / "in")
    os.symlink(tmp_path / "other" / "b.tar", tmp_path / "ds" / "out")
    os.symlink(tmp_path / "ds", tmp_path / "alias")
    return tmp_path


@pytest.mark.parametrize("name", ["a.tar", "in", "sub/c.tar", "sub/../a.tar", "missing.tar"])
def test_a_local_file_in_the_folder_passes(tree: Path, name: str) -> None:
    check_location(str(tree / "ds" / "train.json"), str(tree / "ds" / name))
    check_location(str(tree / "alias" / "train.json"), str(tree / "alias" / name))  # a link to the folder


@pytest.mark.parametrize("name", ["out", "../other/b.tar", "/etc/passwd", "../../../../../../etc/passwd"])
def test_a_local_file_out_of_the_folder_is_refused_naming_it_and_where_it_is(tree: Path, name: str) -> None:
    url = os.path.join(tree / "ds", name)
    with pytest.raises(LocationError, match="refuses to read") as e:
        check_location(str(tree / "ds" / "train.json"), url)
    assert url in str(e.value) and str(tree / "ds" / "train.json") in str(e.value)
    if name == "out":
        assert f"(which is {tree / 'other' / 'b.tar'})" in str(e.value)


def test_an_allowed_prefix_passes_resolved_as_well(tree: Path) -> None:
    out = str(tree / "ds" / "out")
    check_in_folder(str(tree / "ds"), out, allow=(str(tree / "other"),))
    check_in_folder(str(tree / "ds"), out, allow=(f"file://{tree / 'other'}/",))
    with pytest.raises(LocationError):
        check_in_folder(str(tree / "ds"), out, allow=(str(tree / "oth"),))  # a prefix of the name is not a folder


@pytest.mark.parametrize(
    "url, ok",
    [
        ("https://h/data/ds/train-000000.tar", True),
        ("https://h/data/ds/sub/x.tar", True),
        ("https://h/data/other/x.tar", False),
        ("https://h/data/ds/../other/x.tar", False),
        ("https://h/data/ds/%2e%2e/other/x.tar", False),
        ("https://other/data/ds/x.tar", False),
        ("file:///etc/passwd", False),
        ("/etc/passwd", False),
    ],
)
def test_a_remote_index_keeps_to_its_scheme_host_and_folder(url: str, ok: bool) -> None:
    index = "https://h/data/ds/train.json?token=a/b"
    if ok:
        check_location(index, url)
    else:
        with pytest.raises(LocationError, match="refuses to read"):
            check_location(index, url)
