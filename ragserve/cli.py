"""``ragserve`` command line. Each sub-command lives in ``ragserve/commands/<name>.py`` with a ``register``."""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import NoReturn

# Order is the order of `ragserve --help`.
COMMAND_MODULES = ["index", "index_dense", "live", "search", "info", "eval_run", "serve", "eval", "corpus", "attention",
                   "models", "memory"]


class CliError(Exception):
    """A user error: printed as one line on stderr, exit status 2."""


def output_path(path: str | Path, what: str = "output") -> Path:
    """``path`` as a file to write, its parent folders created (every command's output paths behave alike);
    CliError when it names a folder or its folder cannot be made."""
    p = Path(path)
    if p.is_dir():
        raise CliError(f"{what} {p} is a directory; give a file name")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CliError(f"cannot create the folder of {what} {p}: {e.strerror or e}") from None
    return p


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the CLI's error style: one line naming where to look next, exit 2 (no usage block).
    Sub-command parsers inherit it (``add_subparsers`` makes parsers of the parent's class)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}; see '{self.prog} --help'\n")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="ragserve", description="Exact BM25 retrieval and RAG on CPU, GPU and FPGA.")
    from ragserve import __version__
    parser.add_argument("--version", action="version", version=f"ragserve {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(f"ragserve.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CliError as e:
        print(f"ragserve {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"ragserve {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
