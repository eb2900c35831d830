"""Keep a CPU rank's heap between steps, so that a step does not fault its pages in again.

glibc's ``malloc`` serves a tensor of at least ``M_MMAP_THRESHOLD`` bytes (128 KiB, raised
dynamically up to 32 MiB as such blocks are freed) with a fresh ``mmap`` and unmaps it on
free, and gives the free top of its heap back to the kernel once it exceeds
``M_TRIM_THRESHOLD`` (twice the dynamic mmap threshold). A training step frees its
activations at the end of the backward, so by default the next step's forward faults a large
part of them in again: each first touch of a 4 KiB page is a minor fault, the kernel zeroing
the page, missing the caches. Measured on gpt-tiny at batch 16 (``benchmarks/
local_cpu_calibration.py --first-touch``, 2026-11-24 (`613a7a6`)): 1511–3552 faults a step, 1.74 µs
each, about 3–5 ms of a 32 ms step, and a varying share from step to step.

:func:`keep_heap` sets, before the rank allocates its model::

    M_MMAP_THRESHOLD = 32 MiB    (glibc's largest: every smaller block comes from the heap)
    M_TRIM_THRESHOLD = 1 GiB     (the free top of the heap stays mapped)
    M_TOP_PAD        = 0

so that the second step reuses the first step's pages: no faults in the steady state (the
same settings measured 0 faults a step). What it costs: the resident set stays at the step's
peak between steps instead of falling back, which is what the peak-memory figure measures
anyway. A user's own ``MALLOC_*_`` environment variables (glibc's tunables for the same
settings) win: then nothing is set. Where the C library is not glibc there is no ``mallopt``
of this meaning and the heap is left as it is, with a fallback line saying so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

__all__ = ["MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES", "glibc_version", "keep_heap",
           "set_malloc"]

#: ``mallopt`` parameter numbers (glibc's ``malloc.h``) by :func:`set_malloc`'s names.
_PARAMETERS = {"trim": -1, "top_pad": -2, "mmap": -3}   # M_TRIM_THRESHOLD, M_TOP_PAD, …
#: glibc's largest mmap threshold on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``), bytes.
MMAP_THRESHOLD_BYTES = 32 * 2**20
#: Free heap kept mapped before glibc trims it, bytes.
TRIM_THRESHOLD_BYTES = 2**30
#: The environment variables by which a user sets the same (glibc tunables' old names).
USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")


#: What a rank whose heap is not kept does (the fallback lines' tail).
_NOT_KEPT = ("the heap is trimmed between steps as the C library does, and each step faults "
             "its activations' pages in again")


def glibc_version() -> str:
    """The C library's name and version where it is glibc (``"glibc 2.36"``), else ``""``."""
    try:
        version = os.confstr("CS_GNU_LIBC_VERSION") or ""   # AttributeError off POSIX
    except (AttributeError, ValueError, OSError):
        return ""
    return version if version.startswith("glibc") else ""


def keep_heap() -> str | None:
    """Keep this process's heap between steps (module docstring). Returns ``None`` when the
    settings are made or the user's own ``MALLOC_*_`` variables are kept, else the fallback
    line saying why the heap is left as the C library has it."""
    if any(name in os.environ for name in USER_SETTINGS):
        return None
    if not glibc_version():
        return f"[heap] the C library is not glibc: {_NOT_KEPT}"
    failed = set_malloc(mmap=MMAP_THRESHOLD_BYTES, trim=TRIM_THRESHOLD_BYTES, top_pad=0)
    return f"[heap] {failed}: {_NOT_KEPT}" if failed else None


def set_malloc(**params: int) -> str | None:
    """Set glibc's malloc parameters by name, bytes: ``mmap`` (``M_MMAP_THRESHOLD``), ``trim``
    (``M_TRIM_THRESHOLD``), ``top_pad`` (``M_TOP_PAD``), in the order given. ``None`` when all
    are set, else what failed (glibc only: see :func:`glibc_version`)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    for name, value in params.items():
        if libc.mallopt(_PARAMETERS[name], value) != 1:
            return f"glibc's mallopt({name}={value}) failed"
    return None
