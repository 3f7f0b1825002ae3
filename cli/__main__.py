"""``main(argv) -> int``: parse, run one command, and turn library errors into a line and an exit code.

``python -m shardify.cli`` runs it; ``entrypoint`` is the ``shardify`` console script.

The commands live one module per side of the library: :mod:`~shardify.cli.convert` (the
writer), :mod:`~shardify.cli.inspect` (``info``, ``verify``, ``keys``, ``show``: a finished dataset),
:mod:`~shardify.cli.benchcmd` (``bench``: the reader) and :mod:`~shardify.cli.maintain` (``gc``).
Each adds its parser and sets ``run``; only :func:`main` prints errors. Importing this module
does not import torch: only ``bench`` and ``show`` load the reader.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from shardify import __version__
from shardify.cli import benchcmd, convert, inspect, maintain
from shardify.cli.common import EXIT_ERROR, EXIT_USAGE, FORMATTER, UsageError
from shardify.errors import ShardifyError, SplitRequiredError
from shardify.suggest import closest

__all__ = ["main", "entrypoint", "build_parser", "GROUPS"]

GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("convert", ("convert",)),
    ("inspect a finished dataset", ("info", "verify", "keys", "show")),
    ("read it as training does", ("bench",)),
    ("maintain", ("gc",)),
)
"""``shardify --help`` lists the commands under these headings, by what the user wants to do."""

_EXAMPLES = """examples:
  shardify convert imagefolder ~/data/imagenet/train out/imagenet --split train
  shardify info out/imagenet
  shardify verify out/imagenet
  shardify bench out/imagenet --split train
  shardify show out/imagenet --split validation -o sheet.png

`shardify COMMAND --help` shows each command's options and examples."""


def _grouped_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> str:
    """The commands' one-line helps under :data:`GROUPS`' headings, as ``--help`` shows them."""
    helps = {a.dest: a.help or "" for a in sub._choices_actions}
    width = max(len(n) for n in helps) + 2
    listed = [n for _, names in GROUPS for n in names]
    if sorted(listed) != sorted(helps):  # a command added without a heading would be hidden
        raise RuntimeError(f"GROUPS lists {sorted(listed)}, the parser has {sorted(helps)}")
    blocks = []
    for title, names in GROUPS:
        blocks.append(title + ":\n" + "\n".join(f"  {n:<{width}}{helps[n]}" for n in names))
    return "\n\n".join(blocks)


def build_parser() -> argparse.ArgumentParser:
    """The ``shardify`` parser: each command's own, its ``run`` in ``set_defaults``."""
    parser = argparse.ArgumentParser(
        prog="shardify",
        usage="%(prog)s [-h] [--version] COMMAND ...",
        description="Pack datasets into tar shards; stream them into PyTorch.",
        formatter_class=FORMATTER,
    )
    parser.add_argument("--version", action="version", version=f"shardify {__version__}")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help=argparse.SUPPRESS, prog="shardify"
    )
    convert.add_parser(sub)
    inspect.add_parsers(sub)
    benchcmd.add_parser(sub)
    maintain.add_parser(sub)
    parser.epilog = _grouped_commands(sub) + "\n\n" + _EXAMPLES
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv``; return the exit code (see :data:`shardify.cli.common.EXIT_OK`)."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        _command_parser(parser, args).error(_unrecognized(_command_parser(parser, args), unknown))
    try:
        code: int = args.run(args)
        sys.stdout.flush()  # here, so a closed pipe is met inside the try
        return code
    except BrokenPipeError:  # `shardify info --json | head`: the reader left; stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush cannot fail again
        return 128 + 13  # what a tool killed by SIGPIPE returns
    except SplitRequiredError as e:
        return _error(f"{e.where}: it has several splits ({', '.join(e.splits)}); choose one with --split", EXIT_USAGE)
    except UsageError as e:
        return _error(str(e), EXIT_USAGE)
    except ShardifyError as e:
        return _error(str(e), EXIT_ERROR)
    except ValueError as e:  # option values the parser could not check (sizes, ranges)
        return _error(str(e), EXIT_USAGE)
    except KeyboardInterrupt:
        print("shardify: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command ``args`` ran, so an error shows that command's usage."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(args, subs[0].dest, None) if subs else None
        if chosen not in (subs[0].choices if subs else {}):
            return parser
        parser = subs[0].choices[chosen]


def _unrecognized(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    """argparse's message for arguments no option takes, with the closest option of each mistyped one."""
    options = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    hints = []
    for arg in unknown:
        if arg.startswith("-"):
            meant = closest(arg.split("=", 1)[0], options)
            if meant:
                hints.append(f"{arg.split('=', 1)[0]}: did you mean {meant}?")
    return f"unrecognized arguments: {' '.join(unknown)}" + ("; " + "; ".join(hints) if hints else "")


def _error(message: str, code: int) -> int:
    print(f"shardify: error: {message}", file=sys.stderr)
    return code


def entrypoint() -> None:
    """The console script."""
    sys.exit(main())


if __name__ == "__main__":  # python -m shardify.cli
    entrypoint()
