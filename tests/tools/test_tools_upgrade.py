"""tools/upgrade_options.py rewrites deprecated ShardedDataset keywords into groups that read the same."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shardify.convert import ShardWriter

ROOT = Path(__file__).resolve().parents[2]

OLD = '''"""A training script of before."""
import os
from shardify.reader import ShardedDataset


def make(root):
    return ShardedDataset(root, batch_size=2, shuffle=True, shuffle_buffer=8,
                          on_error="skip", shuffle_block=2,
                          fields=("cls",), collate_fn=list)


def mine(root, **kw):
    return ShardedDataset(root, batch_size=2, fields=("cls",), **kw)


def via_mine(root):
    return mine(root, verify=True, samples_per_epoch=3)
'''


def _load(src: str, name: str) -> dict[str, object]:
    scope: dict[str, object] = {"__name__": name}
    exec(compile(src, name, "exec"), scope)
    return scope


def test_the_rewritten_calls_read_as_the_old_ones(tmp_path):
    root = tmp_path / "ds"
    with ShardWriter(root, split="train", samples_per_shard=3) as w:
        for i in range(6):
            w.write({"cls": i})
    script = tmp_path / "train.py"
    script.write_text(OLD)
    check = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "upgrade_options.py"), "--check", str(script)],
        capture_output=True,
        text=True,
    )
    assert (
        check.returncode == 1 and script.read_text() == OLD and "1 call(s) to rewrite" in check.stdout
    )  # mine() needs --also
    subprocess.run(
        [sys.executable, str(ROOT / "tools" / "upgrade_options.py"), "--also", "mine", str(script)],
        check=True,
        capture_output=True,
    )
    new = script.read_text()
    assert "sampling=SamplingOptions(shuffle_buffer=8, shuffle_block=2)" in new
    assert 'decoding=DecodeOptions(on_error="skip")' in new and "batching=BatchOptions(collate_fn=list)" in new
    assert "mine(root, decoding=DecodeOptions(verify=True), sampling=SamplingOptions(samples_per_epoch=3))" in new
    assert "from shardify.reader import BatchOptions, DecodeOptions, SamplingOptions\n" in new
    with pytest.warns(DeprecationWarning):
        before = _load(OLD, "old")
        old_ds, old_mine = before["make"](root), before["via_mine"](root)  # type: ignore[operator]
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        after = _load(new, "new")
        new_ds, new_mine = after["make"](root), after["via_mine"](root)  # type: ignore[operator]
    assert old_ds.options == new_ds.options and old_mine.options == new_mine.options
    assert [list(b) for b in old_ds] == [list(b) for b in new_ds]


def _upgrade_source() -> Callable[..., tuple[str, int]]:
    spec = importlib.util.spec_from_file_location("upgrade_options", ROOT / "tools" / "upgrade_options.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.upgrade_source


def _bound(src: str) -> dict[str, str]:
    """Each name a top-level ``from shardify... import`` binds -> its module."""
    return {
        a.asname or a.name: n.module
        for n in ast.parse(src).body
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("shardify")
        for a in n.names
    }


LOCAL = '''"""A script that imports shardify only where it reads."""

from __future__ import annotations

import sys


def read(root):
    from shardify.reader import ShardedDataset

    return ShardedDataset(root, batch_size=2, fields=("cls",), collate_fn=list)
'''


def test_the_import_goes_after_the_docstring_and_future_imports():
    """With no top-level shardify import, the groups' import is not put before the docstring
    (which it would turn into a plain string) nor before ``from __future__`` (a SyntaxError)."""
    new, calls = _upgrade_source()(LOCAL)
    assert calls == 1 and "batching=BatchOptions(collate_fn=list)" in new
    compile(new, "local.py", "exec")
    tree = ast.parse(new)
    assert ast.get_docstring(tree) == "A script that imports shardify only where it reads."
    assert _bound(new) == {"BatchOptions": "shardify.reader"}
    assert new.index("from shardify.reader import BatchOptions\n") > new.index("import sys\n")


IMPORTED = '''import textwrap
from shardify.reader import (ShardedDataset,
                             ShuffleOptions)

CHILD = textwrap.dedent("""
from shardify.reader import ShardedDataset
print(ShardedDataset)
""")


def read(root):
    return ShardedDataset(root, batch_size=2, shuffle_buffer=8, on_error="skip")
'''


def test_groups_already_imported_are_not_imported_again_and_strings_are_left_alone():
    """An import line inside a string is not the module's: the new import goes after the real
    (parenthesised) one, only for the groups not bound yet, and the string is unchanged."""
    new, calls = _upgrade_source()(IMPORTED)
    assert calls == 1 and 'sampling=SamplingOptions(shuffle_buffer=8), decoding=DecodeOptions(on_error="skip")' in new
    compile(new, "imported.py", "exec")
    assert _bound(new) == {
        "ShardedDataset": "shardify.reader",
        "ShuffleOptions": "shardify.reader",
        "SamplingOptions": "shardify.reader",
        "DecodeOptions": "shardify.reader",
    }
    assert new.count("import ShardedDataset") == 1 and new.count("ShuffleOptions)") == 1
    assert 'CHILD = textwrap.dedent("""\nfrom shardify.reader import ShardedDataset\nprint(ShardedDataset)\n""")' in new
    assert new.index("from shardify.reader import DecodeOptions, SamplingOptions\n") < new.index("CHILD")


MERGED = """from shardify.reader import BatchOptions, ShardedDataset, ShuffleOptions

SHUFFLE = ShuffleOptions(buffer=3)


def read(root):
    return ShardedDataset(root, batch_size=2, batching=BatchOptions(collate_fn=list), drop_last=True,
                          shuffling=ShuffleOptions(buffer=8, block=2), errors=ErrorOptions())


def kept(root):
    return ShardedDataset(root, batch_size=2, shuffling=SHUFFLE)
"""


def test_old_keywords_join_a_group_given_and_old_groups_become_their_new_group():
    new, calls = _upgrade_source()(MERGED)
    assert calls == 1
    assert "batch_size=2, batching=BatchOptions(collate_fn=list, drop_last=True),\n" in new
    assert "sampling=SamplingOptions(shuffle_buffer=8, shuffle_block=2), decoding=DecodeOptions())" in new
    assert "shuffling=SHUFFLE" in new  # a group in a variable is left for the warning to name
    compile(new, "merged.py", "exec")


DEPRECATION_TESTS = ("tests/reader/test_options.py", "tests/tools/test_tools_upgrade.py")
"""The tests of the old keywords themselves: they pass them on purpose, under ``pytest.warns``."""


def _scripts(path: Path) -> Iterator[tuple[str, str]]:
    """``(where, Python source)``: a ``.py`` file and each string in it that is a script calling
    ``ShardedDataset`` (run in a child process), or each ``python`` example of a Markdown file."""
    text = path.read_text(encoding="utf-8")
    name = str(path.relative_to(ROOT))
    if path.suffix == ".md":
        for m in re.finditer(r"^ *```python\n(.*?)^ *```", text, re.S | re.M):
            yield f"{name}:{text.count(chr(10), 0, m.start()) + 1}", textwrap.dedent(m.group(1))
        return
    yield name, text
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "ShardedDataset(" in node.value:
            try:
                ast.parse(textwrap.dedent(node.value))
            except SyntaxError:  # prose, not a script
                continue
            yield f"{name}:{node.lineno} (a script in a string)", textwrap.dedent(node.value)


def test_no_test_tool_or_doc_example_calls_shardeddataset_with_an_old_keyword():
    """The warning filter catches an old keyword in the code the suite runs; this also sees the
    tests skipped here (GPU, S3), the tools and the examples in README.md and docs/, by asking the
    upgrade tool what it would rewrite (a keyword passed in a dict is the filter's to catch)."""
    upgrade = _upgrade_source()
    files = [
        p
        for p in sorted(
            [*(ROOT / "tests").rglob("*.py"), *(ROOT / "tools").rglob("*.py"), *(ROOT / "examples").glob("*.py")]
        )
        if str(p.relative_to(ROOT)) not in DEPRECATION_TESTS
    ]
    files += [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    assert len(files) > 100
    old = [where for path in files for where, src in _scripts(path) if upgrade(src)[1]]
    assert old == [], "these call ShardedDataset with a deprecated keyword: run tools/upgrade_options.py on them"
