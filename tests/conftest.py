"""Shared test set-up: ``tests/helpers`` on ``sys.path`` (the ``rt_*`` modules the runtime,
API and rewrite-pass tests import, and the gloo workers load by name), the multi-rank
tests' one gloo worker pool per test session, and the markers' guard.

Markers (``pyproject.toml``): ``multirank`` on every test that starts several real processes
(the gloo pool of :func:`rank_pool` — marked here, by the fixture —, torchrun through
``fxplan launch``, ``multiprocessing``), ``browser`` on the tests that run chromium, ``slow`` on
single-process tests that take a minute or more. ``make test-fast`` deselects ``multirank``
and ``browser``; under that selection a test that starts torchrun or a ``multiprocessing``
child without the marker fails, naming the marker it lacks, so the fast loop stays fast.
"""

from __future__ import annotations

import os
import subprocess
import sys
from multiprocessing.process import BaseProcess
from typing import Any

import pytest

HELPERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers")
if HELPERS not in sys.path:
    sys.path.insert(0, HELPERS)

from rt_pool import THREAD_LIMIT, RankPool  # noqa: E402

_POOL: RankPool | None = None


@pytest.fixture
def rank_pool():
    """The session's 4-rank gloo pool, started at first use; restarted if a test broke it or
    its workers have piled up more than ``THREAD_LIMIT`` threads (``rt_pool`` docstring)."""
    global _POOL
    if _POOL is not None and not _POOL.broken and _POOL.threads() > THREAD_LIMIT:
        _POOL.close()
        _POOL = None
    if _POOL is None or _POOL.broken:
        _POOL = RankPool(world=4)
    yield _POOL


def pytest_sessionfinish(session, exitstatus):
    global _POOL
    if _POOL is not None and not _POOL.broken:
        codes = _POOL.close()
        if any(code != 0 for code in codes):
            print(f"\nrank pool workers exited with {codes}", file=sys.stderr)
        _POOL = None


def pytest_collection_modifyitems(config, items):
    """Every test that uses the gloo pool starts real processes: ``multirank``, and
    ``rank_pool``, which ``make test-oldest`` keeps (the pool's ranks, unlike torchrun's, start
    in one place)."""
    for item in items:
        if "rank_pool" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.multirank)
            item.add_marker(pytest.mark.rank_pool)


#: A child process whose command line holds one of these starts a multi-process launch.
_LAUNCHERS = ("fxplan.runtime.launch.torchrun", "torch.distributed.run", "torchrun")


def _launches(argv: Any) -> bool:
    """Whether a command line starts torchrun, or ``fxplan launch`` that will."""
    words = [str(w) for w in argv] if isinstance(argv, (list, tuple)) else str(argv).split()
    if any(os.path.basename(w) in _LAUNCHERS or w in _LAUNCHERS for w in words):
        return True
    verb = any(w.endswith("fxplan.cli.main") or os.path.basename(w) == "fxplan" for w in words)
    return verb and "launch" in words and "--print-command" not in words


@pytest.fixture(autouse=True)
def _multirank_guard(request, monkeypatch):
    """Under a selection that leaves ``multirank`` out, an unmarked test may start no torchrun
    and no ``multiprocessing`` child (module docstring)."""
    markexpr = request.config.getoption("markexpr", "") or ""
    if "not multirank" not in markexpr or request.node.get_closest_marker("multirank"):
        yield
        return
    name = request.node.nodeid

    def refuse(what: str) -> None:
        raise AssertionError(f"{name} starts {what}: mark it @pytest.mark.multirank "
                             "(tests/conftest.py)")

    popen_init = subprocess.Popen.__init__

    def guarded_popen(self, args, *rest, **kwargs):  # type: ignore[no-untyped-def]
        if _launches(args):
            refuse(f"a multi-process launch ({' '.join(map(str, args))[:120]})")
        popen_init(self, args, *rest, **kwargs)

    def guarded_start(self):  # type: ignore[no-untyped-def]
        refuse(f"a multiprocessing child ({type(self).__name__})")

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded_popen)
    monkeypatch.setattr(BaseProcess, "start", guarded_start)
    yield
