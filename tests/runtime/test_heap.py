"""A CPU rank keeps its heap between steps (:mod:`fxplan.runtime.heap`): the second step
faults no pages in again. Counts page faults, not time."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from fxplan.runtime import heap

STEPS = textwrap.dedent("""
    import resource
    import torch
    torch.set_num_threads(1)
    w = torch.randn(256, 256, requires_grad=True)

    def step():
        x = torch.randn(4096, 256)
        h = [x]
        for _ in range(6):
            h.append(torch.tanh(h[-1] @ w))
        h[-1].sum().backward()

    def faults():   # over 10 steps after 15 (glibc settles its free lists in the first)
        for _ in range(15):
            step()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(10):
            step()
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    default = faults()
    from fxplan.runtime.heap import keep_heap
    assert keep_heap() is None
    print(default, faults())
""")


def _faults() -> tuple[int, int]:
    """Page faults of 10 steps with glibc's defaults, then with the heap kept (one process)."""
    env = {k: v for k, v in os.environ.items() if k not in heap.USER_SETTINGS}
    out = subprocess.run([sys.executable, "-c", STEPS], capture_output=True, text=True,
                         env=env, timeout=120, check=True)
    default, kept = out.stdout.split()[-2:]
    return int(default), int(kept)


@pytest.mark.skipif(not heap.glibc_version(), reason="glibc's mallopt")
def test_a_kept_heap_faults_no_pages_in_again() -> None:
    # 7 activations of 4 MiB (1024 pages) each per step, above glibc's initial 128 KiB mmap
    # threshold; faults over 10 steps after 15: kept, at most two activations' pages in all
    # (measured 0 in most runs), by default thousands a step (measured 7,000–30,000 in all)
    default, kept = _faults()
    assert kept <= 2048, kept
    assert default > kept + 4096, (default, kept)


def test_the_users_malloc_settings_win(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    assert heap.keep_heap() is None            # nothing set, nothing to report
