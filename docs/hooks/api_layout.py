"""MkDocs hook: lets mkdocstrings find the package as it installs. The source folders are
mapped onto ``shardify`` by pyproject's ``[tool.setuptools.package-dir]`` (``reader/`` is
``shardify.reader``), a layout griffe cannot see in the tree; before the build this hook makes
``build/api-src/shardify/`` with that layout (the top package's modules copied, its subpackages linked), for the
handler's
``paths``."""

from __future__ import annotations

import shutil
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
MIRROR = ROOT / "build" / "api-src"

__all__ = ["on_config", "make_mirror"]


def make_mirror() -> Path:
    """Build the mirror afresh; return the folder to put on griffe's search path."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    shutil.rmtree(MIRROR, ignore_errors=True)
    top = MIRROR / "shardify"
    top.mkdir(parents=True)
    for entry in (ROOT / mapping["shardify"]).glob("*.py"):  # copies: griffe resolves a linked
        shutil.copy2(entry, top / entry.name)  # __init__.py to its real folder
    for name, folder in mapping.items():
        parts = name.split(".")
        if len(parts) == 2:  # shardify.X; deeper packages sit inside their parent's folder
            (top / parts[1]).symlink_to(ROOT / folder, target_is_directory=True)
        elif not (ROOT / folder).resolve() == (ROOT / mapping[".".join(parts[:2])] / Path(*parts[2:])).resolve():
            raise RuntimeError(f"{name} = {folder!r} is not inside its parent's folder: teach this hook the layout")
    return MIRROR


def on_config(config):  # noqa: ANN001, ANN201 (MkDocs' hook signature)
    make_mirror()
    return config


# Also when MkDocs loads this hook, before any plugin's on_config: mkdocstrings' handler takes
# its search paths as they are when it starts, and in a fresh clone build/ does not exist yet.
make_mirror()
