"""The tools' shared harness: the corpora they read (:mod:`benchlib.corpus`), memory from
``/proc`` (:mod:`benchlib.memory`), and best-of/median timing with the common JSON and
markdown output (:mod:`benchlib.timing`). ``tools/`` is on ``sys.path`` when a tool runs as
``python tools/<tool>.py``, so a tool imports ``from benchlib import corpus``."""

from __future__ import annotations

__all__: list[str] = []
