"""The ``fxplan`` command line: one sub-command per module in :mod:`fxplan.cli`.

Each verb module exposes ``register(subparsers) -> argparse.ArgumentParser`` and sets
``run(args) -> int`` as the parser's ``func`` default. Verb modules keep heavy imports
(torch, ortools) inside ``run`` so that ``fxplan --help`` stays instant.

Errors a user can fix (a malformed cluster file, an unknown model, a configuration whose
degrees do not multiply out) derive from :class:`fxplan.core.errors.UserError`; they end the
command with exit code 2 and a
one-paragraph message. ``--debug`` shows the traceback instead; it is accepted anywhere
before a ``--`` (``fxplan --debug plan …`` and ``fxplan plan … --debug``), while a ``--debug``
after ``--`` belongs to torchrun (``fxplan launch … -- --debug``).

``fxplan --version`` prints fxplan's, torch's and Python's versions without importing torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
from typing import Any, Sequence

#: Verb modules under ``fxplan.cli``, in the order ``fxplan --help`` lists them.
VERBS: tuple[str, ...] = (
    "demo",
    "graph",
    "clusters",
    "profile",
    "estimate",
    "plan",
    "compare",
    "report",
    "explain",
    "diff",
    "export",
    "launch",
    "validate",
    "replan",
    "models",
    "doctor",
    "calibrate",
)

#: Verbs that run on any torch (or none): ``doctor`` reports the version as one of its checks.
UNCHECKED_VERBS: frozenset[str] = frozenset({"doctor"})

_DEBUG_HELP = "show tracebacks for errors (anywhere on the line, before `--`)"


def version_line() -> str:
    """``fxplan 0.1.0 (torch 2.13.0+cpu, Python 3.11.7)``, read from the installed packages'
    metadata, so that torch is not imported."""
    from importlib import metadata

    from fxplan import __version__

    try:
        torch = f"torch {metadata.version('torch')}"
    except metadata.PackageNotFoundError:
        torch = "torch not installed"
    return f"fxplan {__version__} ({torch}, Python {platform.python_version()})"


class _VersionAction(argparse.Action):
    """``--version``: print :func:`version_line` and exit 0 (computed only when asked)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(version_line())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fxplan",
        description="Auto-parallel planner and distributed-graph compiler for PyTorch.",
    )
    parser.add_argument("--version", action=_VersionAction,
                        help="print the versions of fxplan, torch and Python, and exit")
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb in VERBS:
        module = importlib.import_module(f"fxplan.cli.{verb}")
        verb_parser = module.register(sub)
        # After the verb too. SUPPRESS: a verb that was not given --debug leaves the value
        # the top-level parser set (`fxplan --debug plan …`) in place.
        verb_parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                                 help=_DEBUG_HELP)
    return parser


def parse_args(argv: Sequence[str], parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """``argv`` (without the program name) as a namespace; what follows ``--`` becomes
    ``torchrun_args`` (only ``fxplan launch`` takes them) and is not parsed, so a ``--debug``
    there is torchrun's."""
    parser = parser or build_parser()
    argv = list(argv)
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
    return args


def main(argv: Sequence[str] | None = None) -> int:
    from fxplan.core.errors import UserError

    parser = build_parser()
    args = parse_args(sys.argv[1:] if argv is None else argv, parser)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    try:
        if args.verb not in UNCHECKED_VERBS:
            from fxplan.core.torch_support import check_torch

            check_torch()
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # `fxplan ... | head` closed the pipe: not an error; silence the flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        if args.debug:
            raise
        return interrupted(args.verb)
    except (UserError, OSError, UnicodeError) as err:
        if args.debug:
            raise
        print(f"fxplan {args.verb}: error: {file_error(err)}", file=sys.stderr)
        return 2


def interrupted(verb: str) -> int:
    """Ctrl-C: one line on stderr and exit code 130 (128 + SIGINT), no traceback; exit hooks
    that would print one (a worker pool's atexit) are silenced by :func:`quiet_exit`."""
    print(f"fxplan {verb}: interrupted", file=sys.stderr, flush=True)
    quiet_exit()
    return 130


def quiet_exit() -> None:
    """After an interrupt, the interpreter's exit hooks must not print a second traceback:
    stderr goes to /dev/null from here on (the one line is already written)."""
    try:
        sys.stderr.flush()
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())
    except (OSError, ValueError):  # pragma: no cover - stderr already closed or replaced
        pass


def file_error(err: BaseException) -> str:
    """A user error's message; for an operating-system or decoding error, the file and what
    went wrong in words (``PermissionError`` → "permission denied: FILE")."""
    from fxplan.core.errors import UserError

    if isinstance(err, UserError):
        return str(err)
    if isinstance(err, UnicodeDecodeError):
        return (f"a file is not UTF-8 text ({err.reason} at byte {err.start}): expected a "
                "UTF-8 text file")
    if isinstance(err, OSError):
        name = err.filename if err.filename is not None else ""
        what = {PermissionError: "permission denied", IsADirectoryError: "is a directory, "
                "expected a file", NotADirectoryError: "a path component is not a directory",
                FileNotFoundError: "no such file or directory",
                FileExistsError: "already exists"}.get(type(err), err.strerror or str(err))
        return f"{name}: {what}" if name else f"{what} ({err})"
    return str(err)


def run_program() -> None:
    """The ``fxplan`` program (console script and ``python -m fxplan.cli.main``): :func:`main`,
    then exit with its code, without the interpreter's teardown (a second or more once torch
    is imported; :func:`fxplan.core.quick_exit.exit_now`). After Ctrl-C (130) the process
    leaves at once (``os._exit``, the streams flushed): an interrupt that lands again while the
    interpreter shuts down (an exit hook, a solver's thread) would otherwise end it by SIGINT
    with a traceback instead of one line and 130. No child is running by then: ``launch`` ends
    its torchrun before returning."""
    import signal

    try:
        code = main()
    except KeyboardInterrupt:  # between the verb's return and here
        verb = next((a for a in sys.argv[1:] if a in VERBS), "")
        code = interrupted(verb) if verb else 130
    if code == 130:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # pragma: no cover - closed or redirected
                pass
        os._exit(130)
    from fxplan.core.quick_exit import exit_now

    exit_now(code)   # as sys.exit, without the interpreter's teardown (fxplan.core.quick_exit)


if __name__ == "__main__":  # pragma: no cover
    run_program()
