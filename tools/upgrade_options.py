"""Rewrite calls of ``ShardedDataset`` that use the deprecated keywords into the option groups.

``python tools/upgrade_options.py FILE.py ...`` rewrites each ``ShardedDataset(...)`` call in
place: ``shuffle_buffer=4, on_error="skip", drop_last=True`` becomes
``sampling=SamplingOptions(shuffle_buffer=4), decoding=DecodeOptions(on_error="skip"),
batching=BatchOptions(drop_last=True)`` (added to the group's call when the call gives that
group already), ``shuffling=ShuffleOptions(buffer=4)`` becomes
``sampling=SamplingOptions(shuffle_buffer=4)``, and imports the groups it used that the module does
not import yet (``from shardify.reader import ...`` at its top level: after its last shardify
import, or after its docstring and leading imports). ``--also NAME`` rewrites calls of your own
helpers that pass their keywords on to ``ShardedDataset`` too; ``--check`` only lists what it
would change (exit 1 if anything).
Values are copied as written (the source text of each argument), so formatting may need a look.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

from shardify.reader.deprecated import OLD_GROUPS, OLD_KEYWORDS
from shardify.reader.options import GROUPS

__all__ = ["upgrade_source"]


def _offsets(src: str) -> list[int]:
    starts = [0]
    for line in src.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def _group_call(node: ast.expr, cls: str) -> ast.Call | None:
    """``node`` when it is a literal ``cls(...)`` call of keyword arguments only, else None."""
    if isinstance(node, ast.Call) and not node.args and isinstance(node.func, ast.Name) and node.func.id == cls:
        return node
    return None


def upgrade_source(src: str, *, names: frozenset[str] = frozenset({"ShardedDataset"})) -> tuple[str, int]:
    """``(new source, calls rewritten)`` for the Python source ``src``.

    Each deprecated keyword becomes a field of its group, and each deprecated group
    (``shuffling=ShuffleOptions(...)``, ``errors=ErrorOptions(...)``, written as a literal call)
    the fields of the group it was folded into; a group the call gives already as a literal
    call gets the fields added to it. A deprecated group given as anything else is left as is."""
    lines = src.splitlines(keepends=True)
    starts = _offsets(src)

    def at(lineno: int, col: int) -> int:  # ast columns count UTF-8 bytes
        return starts[lineno - 1] + len(lines[lineno - 1].encode()[:col].decode())

    def seg(node: ast.AST) -> str:
        return ast.get_source_segment(src, node) or ""

    edits: list[tuple[int, int, str]] = []
    used: set[str] = set()
    calls = 0
    for node in ast.walk(ast.parse(src)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        if name not in names:
            continue
        by_group: dict[str, list[tuple[ast.keyword, list[str]]]] = {}
        for k in node.keywords:
            if k.arg in OLD_KEYWORDS:
                group, field = OLD_KEYWORDS[k.arg]
                by_group.setdefault(group, []).append((k, [f"{field}={seg(k.value)}"]))
            elif k.arg in OLD_GROUPS:
                cls, group, renames = OLD_GROUPS[k.arg]
                call = _group_call(k.value, cls.__name__)
                if call is not None and all(a.arg in renames for a in call.keywords):
                    fields = [f"{renames[a.arg]}={seg(a.value)}" for a in call.keywords]  # type: ignore[index]
                    by_group.setdefault(group, []).append((k, fields))
        if not by_group:
            continue
        calls += 1
        args = sorted([*node.args, *node.keywords], key=lambda a: (a.lineno, a.col_offset))
        given = {k.arg: k for k in node.keywords if k.arg in GROUPS}
        for group, olds in by_group.items():
            cls = GROUPS[group].__name__
            inner = ", ".join(field for _, fields in olds for field in fields)
            target = _group_call(given[group].value, cls) if group in given else None
            if group in given and target is None:
                continue  # the group is given as a variable: leave the old keywords (they still work)
            used.add(cls)
            gone = olds
            if target is not None:
                end = at(target.end_lineno, target.end_col_offset) - 1  # type: ignore[arg-type]
                edits.append((end, end, (", " if target.keywords else "") + inner))
            else:
                first = olds[0][0]
                span = (at(first.lineno, first.col_offset), at(first.end_lineno, first.end_col_offset))  # type: ignore[arg-type]
                edits.append((*span, f"{group}={cls}({inner})"))
                gone = olds[1:]
            for k, _ in gone:  # the others go, with the separator before them
                prev = args[args.index(k) - 1]
                edits.append((at(prev.end_lineno, prev.end_col_offset), at(k.end_lineno, k.end_col_offset), ""))  # type: ignore[arg-type]
    for a, b, text in sorted(edits, reverse=True):
        src = src[:a] + text + src[b:]
    return (_import(src, used) if used else src), calls


def _import(src: str, names: set[str]) -> str:
    """``src`` with ``from shardify.reader import NAMES`` for those of ``names`` no top-level shardify
    import binds yet: after its last top-level shardify import, or else after its leading
    docstring and imports (never before a docstring or a ``from __future__`` import)."""
    body = ast.parse(src).body
    have = {
        a.asname or a.name
        for n in body
        if isinstance(n, ast.ImportFrom) and not n.level and (n.module or "").split(".")[0] == "shardify"
        for a in n.names
    }  # the names they bind
    missing = sorted(names - have)
    if not missing:
        return src
    ours = [
        n
        for n in body
        if isinstance(n, ast.ImportFrom)
        and (n.module or "").split(".")[0] == "shardify"
        and not n.level
        or isinstance(n, ast.Import)
        and any(a.name.split(".")[0] == "shardify" for a in n.names)
    ]
    lead: list[ast.stmt] = []
    for i, n in enumerate(body):  # the docstring, then the imports before the first other statement
        if not (
            isinstance(n, (ast.Import, ast.ImportFrom))
            or i == 0
            and isinstance(n, ast.Expr)
            and isinstance(n.value, ast.Constant)
            and isinstance(n.value.value, str)
        ):
            break
        lead.append(n)
    after = ours[-1] if ours else lead[-1] if lead else None
    out = src.splitlines(keepends=True)
    at = (after.end_lineno or 0) if after is not None else 0
    if at and not out[at - 1].endswith("\n"):
        out[at - 1] += "\n"
    out.insert(at, f"from shardify.reader import {', '.join(missing)}\n")
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="NAME",
        help="a function of yours that passes its keywords on to ShardedDataset (repeatable)",
    )
    ap.add_argument("--check", action="store_true", help="list the files that would change; write nothing")
    args = ap.parse_args(argv)
    changed = 0
    for path in args.files:
        new, calls = upgrade_source(path.read_text(encoding="utf-8"), names=frozenset({"ShardedDataset", *args.also}))
        if calls:
            changed += 1
            print(f"{path}: {calls} call(s) {'to rewrite' if args.check else 'rewritten'}")
            if not args.check:
                path.write_text(new, encoding="utf-8")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
