"""The documentation's build hooks: the CLI reference holds every command's help, and the API
layout puts each package where pyproject's package-dir map does."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _hook(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", ROOT / "docs" / "hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_has_every_command_and_its_options() -> None:
    text = _hook("cli_reference").render()
    for words in (
        "shardify",
        "shardify convert",
        "shardify convert imagefolder",
        "shardify convert ids",
        "shardify convert listing",
        "shardify convert python",
        "shardify info",
        "shardify verify",
        "shardify show",
        "shardify bench",
        "shardify gc",
    ):
        assert f"`{words}`" in text, words
    assert "--shard-size" in text and "--raw-pixels" in text and "--sample-shards" in text


def test_cli_reference_replaces_only_its_marker() -> None:
    hook = _hook("cli_reference")
    assert hook.on_page_markdown("no marker", None, None, None) == "no marker"
    assert "`shardify gc`" in hook.on_page_markdown(f"a\n{hook.MARKER}\nb", None, None, None)


def test_api_layout_mirrors_the_package_dir_map(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hook = _hook("api_layout")
    monkeypatch.setattr(hook, "MIRROR", tmp_path / "api-src")
    top = hook.make_mirror() / "shardify"
    assert (top / "__init__.py").is_file() and not (top / "__init__.py").is_symlink()
    for sub in ("reader", "convert", "cli"):
        assert (top / sub / "__init__.py").resolve() == (ROOT / sub / "__init__.py").resolve()
    assert (top / "reader" / "plan" / "__init__.py").is_file()
