"""Type-check the library as it installs: ``python tools/typecheck.py`` (run by ``.ci/run``).

The source folders map onto ``shardify`` through pyproject's package-dir table (``reader/`` is
``shardify.reader``), a layout mypy cannot see in the tree; the docs build has the same problem
and the same answer: ``build/api-src/shardify`` mirrors the installed layout (the API-docs hook
makes it), and mypy checks that, with the settings in pyproject's ``[tool.mypy]``. Extra
arguments go to mypy.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def mirror() -> Path:
    """``build/api-src``, made afresh by the docs' own hook (one definition of the layout)."""
    spec = importlib.util.spec_from_file_location("api_layout", ROOT / "docs" / "hooks" / "api_layout.py")
    if spec is None or spec.loader is None:
        raise RuntimeError("docs/hooks/api_layout.py not found")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # it builds the mirror as it loads, as MkDocs loads it
    return Path(module.MIRROR)


def main(argv: list[str] | None = None) -> int:
    src = mirror()
    cmd = [
        sys.executable,
        "-m",
        "mypy",
        "--config-file",
        str(ROOT / "pyproject.toml"),
        "-p",
        "shardify",
        *(argv if argv is not None else sys.argv[1:]),
    ]
    return subprocess.run(cmd, cwd=src, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
