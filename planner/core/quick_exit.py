"""Leave a finished process without the interpreter's teardown.

A process that imported torch (and with it dynamo, sympy, OR-Tools, …) spends a second or more
after its last line on the interpreter's finalization: every module's namespace is cleared and
the garbage collector walks what they held. None of it is output or state that outlives the
process. Measured on the 2-core test machine (2026-11-28, commit 9648a8d): ``fxplan plan`` of
gpt-tiny took 1.2–1.4 s from its last line to its exit, 0.03 s leaving by :func:`exit_now`.
Every CLI run and every torchrun agent of ``fxplan launch`` pays it once.

:func:`exit_now` keeps what an exit must still do, in the interpreter's order, and skips the
rest:

1. where a non-daemon thread still runs (the interpreter would wait for it), it exits as
   :func:`sys.exit` does — nothing is skipped;
2. every :mod:`atexit` handler runs (logging's flush and close, multiprocessing's finalizers,
   :func:`weakref.finalize` callbacks such as a ``TemporaryDirectory``'s removal);
3. every file object still open for writing is flushed (the teardown would flush it when it
   collects it), then stdout and stderr;
4. ``os._exit(code)``.

What is skipped are destructors of objects still alive at exit; a file object's flush is the
one of them whose loss would show (a file left short), hence step 3.
"""

from __future__ import annotations

import atexit
import gc
import io
import os
import sys
import threading

__all__ = ["exit_now"]


def _other_threads_running() -> bool:
    """A non-daemon thread other than this one is alive (the interpreter would join it)."""
    return any(t.is_alive() and not t.daemon and t is not threading.current_thread()
               for t in threading.enumerate())


#: the file objects that hold written bytes in a buffer of their own
_BUFFERED = (io.BufferedWriter, io.BufferedRandom, io.BufferedRWPair, io.TextIOWrapper)


def _flush_open_files() -> None:
    """Flush every open, writable file object (buffered writers and text wrappers). Matched by
    their type's own classes, not ``isinstance``, which asks every object on the heap for its
    ``__class__`` (a deprecated torch name answers with a warning)."""
    for obj in gc.get_objects():
        if issubclass(type(obj), _BUFFERED):
            try:
                if not obj.closed and obj.writable():
                    obj.flush()
            except (OSError, ValueError):   # a broken pipe, a detached buffer: as teardown
                pass


def exit_now(code: int | None = 0) -> None:
    """End the process with exit status ``code`` (``None``: 0) as :func:`sys.exit` would,
    without the interpreter's teardown (module docstring). Does not return."""
    status = 0 if code is None else code
    if not isinstance(status, int) or _other_threads_running():
        sys.exit(code)
    atexit._run_exitfuncs()
    _flush_open_files()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed, or replaced by None
            pass
    os._exit(status & 0xFF)
