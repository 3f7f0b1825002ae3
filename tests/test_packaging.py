"""The wheel holds every package: pyproject lists each folder with an ``__init__.py`` under the
mapped folders, in ``packages`` and in ``package-dir`` alike (setuptools does not find the
subpackages of a mapped folder, so a new one left out of the list is missing from the wheel while
an editable install still finds it on disk). ``.ci/wheel`` installs the built wheel itself."""

from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def packages_on_disk() -> set[str]:
    """``shardify.X.Y`` for each folder with an ``__init__.py`` under a top-level mapped folder."""
    found: set[str] = set()
    roots = {name: folder for name, folder in SETUPTOOLS["package-dir"].items() if name.count(".") <= 1}
    for name, folder in roots.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]))
    return found


def test_every_package_folder_is_packaged() -> None:
    on_disk = packages_on_disk()
    assert "shardify.reader.stages" in on_disk  # the walk sees nested packages
    assert on_disk - set(SETUPTOOLS["packages"]) == set(), "add these to pyproject's packages"
    assert set(SETUPTOOLS["packages"]) - on_disk == set(), "listed but no __init__.py"


def test_every_package_has_its_folder_mapped() -> None:
    mapping = SETUPTOOLS["package-dir"]
    assert set(mapping) == set(SETUPTOOLS["packages"])
    for name, folder in mapping.items():
        parent = name.rpartition(".")[0]
        if parent in mapping and parent != "shardify":  # a subpackage sits in its parent's folder, named as it is
            assert Path(folder) == Path(mapping[parent]) / name.rpartition(".")[2], name
        assert (ROOT / folder / "__init__.py").is_file(), name
