"""Import every module of the installed ``shardify`` package, from outside the checkout.

    python tools/check_install.py

Run by ``.ci/wheel`` in a fresh venv holding only the built wheel: a subpackage missing from the
wheel, or a module that needs an optional extra at import, fails here. Modules that need an extra
say so by raising ``ImportError`` naming the extra; those are listed, not failed.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def main() -> int:
    import shardify

    origin = Path(shardify.__file__).resolve()
    if "site-packages" not in origin.parts:
        print(f"shardify imported from {origin}, not from an installed wheel", file=sys.stderr)
        return 1
    names = [m.name for m in pkgutil.walk_packages(shardify.__path__, "shardify.")]
    failed: list[str] = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 (each failure is reported, then the run fails)
            failed.append(f"{name}: {type(e).__name__}: {e}")
    print(f"imported {len(names) - len(failed)} of {len(names)} modules from {origin.parent}")
    for line in failed:
        print("  FAILED", line, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
