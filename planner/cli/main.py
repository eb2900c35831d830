"""The ``fxplan`` command line: one sub-command per module in :mod:`fxplan.cli`.

Each verb module exposes ``register(subparsers) -> argparse.ArgumentParser`` and sets
``run(args) -> int`` as the parser's ``func`` default. Verb modules keep heavy imports
(torch, ortools) inside ``run`` so that ``fxplan --help`` stays instant.

Errors a user can fix (a malformed cluster file, an unknown model, a configuration whose
degrees do not multiply out) derive from :class:`fxplan.core.errors.UserError`; they end the
command with exit code 2 and a
one-paragraph message. ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Sequence

#: Verb modules under ``fxplan.cli``, in the order ``fxplan --help`` lists them.
VERBS: tuple[str, ...] = (
    "demo",
    "graph",
    "clusters",
    "profile",
    "estimate",
    "plan",
    "export",
    "launch",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fxplan",
        description="Auto-parallel planner and distributed-graph compiler for PyTorch.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb in VERBS:
        module = importlib.import_module(f"fxplan.cli.{verb}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from fxplan.core.errors import UserError

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    after: list[str] | None = None
    if "--" in argv:  # `fxplan launch plan.json … -- TORCHRUN_FLAGS`: the rest is passed on
        cut = argv.index("--")
        argv, after = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    if after is not None:
        if not hasattr(args, "torchrun_args"):
            parser.error(f"arguments after `--` ({' '.join(after)}): only `fxplan launch` takes "
                         "them (torchrun flags)")
        args.torchrun_args = after
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # `fxplan ... | head` closed the pipe: not an error; silence the flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (UserError, FileNotFoundError) as err:
        if args.debug:
            raise
        print(f"fxplan {args.verb}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
