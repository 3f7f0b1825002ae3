"""MkDocs hook: renders ``shardify ... --help`` for every command and subcommand into the CLI
reference page at build time, from the parser itself (``shardify.cli.__main__.build_parser``),
so the page cannot drift from the code. A page asks for it with a line holding only
``<!-- cli-reference -->``."""

from __future__ import annotations

import argparse
import os

MARKER = "<!-- cli-reference -->"

__all__ = ["on_page_markdown", "render"]


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    """The parser's subcommands in the order they were added, with their parsers."""
    found = []
    for action in parser._actions:  # argparse keeps no public list of subparsers
        if isinstance(action, argparse._SubParsersAction):
            seen = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:  # aliases share a parser
                    seen.add(id(sub))
                    found.append((name, sub))
    return found


def _walk(parser: argparse.ArgumentParser, words: list[str], level: int) -> list[str]:
    """``parser``'s help under a heading of ``level``; its commands' after it, the top's at its level."""
    out = [f"{'#' * level} `{' '.join(words)}`", "", "```text", parser.format_help().rstrip(), "```", ""]
    for name, sub in _subcommands(parser):
        out += _walk(sub, [*words, name], level if len(words) == 1 else level + 1)
    return out


def render() -> str:
    """Every command's ``--help``, as Markdown headings and text blocks."""
    from shardify.cli.__main__ import build_parser  # deferred: the hook module loads before the site

    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: a fixed width gives a stable page
    return "\n".join(_walk(build_parser(), ["shardify"], 3))


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001 (MkDocs' hook signature)
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render())
