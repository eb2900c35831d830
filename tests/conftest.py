"""Shared test set-up: ``tests/helpers`` on ``sys.path`` (the ``rt_*`` modules the runtime,
API and rewrite-pass tests import, and the gloo workers load by name), and the multi-rank
tests' one gloo worker pool per test session."""

from __future__ import annotations

import os
import sys

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
