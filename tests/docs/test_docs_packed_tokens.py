"""Every runnable block of docs/how-to/packed-tokens.md runs as written, in order."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).parents[2] / "docs" / "how-to" / "packed-tokens.md"
MARK = "<!-- run by tests/docs/test_docs_packed_tokens.py -->\n```python\n"


def test_every_marked_block_of_the_page_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(re.escape(MARK) + r"(.*?)```", PAGE.read_text(), flags=re.S)
    assert len(blocks) == 7
    namespace: dict = {}
    for code in blocks:
        exec(compile(code, str(PAGE), "exec"), namespace)  # noqa: S102 - the page's own examples
    assert namespace["mix"].counts == (2800, 1200)
    assert namespace["max_seqlen"] <= 64 and len(namespace["rest"]) == len(namespace["loader"]) - 4
