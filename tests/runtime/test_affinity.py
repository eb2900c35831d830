"""Where a CPU rank is pinned (:mod:`fxplan.runtime.launch.affinity`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fxplan.runtime.launch.affinity import AFFINITY_ENV, pin_rank, rank_cores


def test_a_block_of_cores_each_when_every_rank_can_have_one():
    cores = [0, 1, 2, 3, 4, 5, 6]
    assert [rank_cores(r, 3, cores) for r in range(3)] == [[0, 1], [2, 3], [4, 5]]
    assert [rank_cores(r, 2, [4, 9]) for r in range(2)] == [[4], [9]]   # the allowed ids


def test_round_robin_when_ranks_outnumber_cores():
    """A tensor-parallel group (consecutive ranks) lands on different cores."""
    assert [rank_cores(r, 4, [0, 1]) for r in range(4)] == [[0], [1], [0], [1]]
    assert [rank_cores(r, 5, [2, 3]) for r in range(5)] == [[2], [3], [2], [3], [2]]


def test_bad_rank_is_refused():
    with pytest.raises(ValueError, match="local rank 4 is not in 0..3"):
        rank_cores(4, 4, [0, 1])
    with pytest.raises(ValueError, match="no cores"):
        rank_cores(0, 1, [])


def _run(code: str, **env: str) -> str:
    """``code`` in a fresh interpreter (pinning changes the process), its stdout."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120, check=True)
    return done.stdout.strip()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity")
def test_pin_rank_sets_the_mask_and_says_where():
    allowed = sorted(os.sched_getaffinity(0))
    world = len(allowed) + 1               # more ranks than cores: round robin
    code = ("import os; from fxplan.runtime.launch.affinity import pin_rank; "
            f"note, fallback = pin_rank({world - 1}, {world}); "
            "print(sorted(os.sched_getaffinity(0)), note, fallback)")
    out = _run(code)
    expected = allowed[(world - 1) % len(allowed)]
    assert out.startswith(f"[{expected}] [affinity] CPU ranks pinned ({world} local ranks on "
                          f"{len(allowed)} cores, round robin): local rank {world - 1} on core "
                          f"{expected}")
    assert out.endswith("None")


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity")
def test_opting_out_and_a_wrong_mode_leave_the_mask_alone():
    allowed = sorted(os.sched_getaffinity(0))
    code = ("import os; from fxplan.runtime.launch.affinity import pin_rank; "
            "note, fallback = pin_rank(0, 64); print(sorted(os.sched_getaffinity(0)), '|', note, "
            "'|', fallback)")
    mask, note, fallback = _run(code, **{AFFINITY_ENV: "none"}).split(" | ")
    assert mask == str(allowed) and "the scheduler places the ranks" in note
    assert fallback == "None"
    mask, note, fallback = _run(code, **{AFFINITY_ENV: "numa"}).split(" | ")
    assert mask == str(allowed) and note == "None"
    assert "FXPLAN_CPU_AFFINITY='numa' is not one of auto, core, none" in fallback


def test_torchrun_environment_is_the_default(monkeypatch):
    """Without arguments the rank and world come from torchrun's variables."""
    monkeypatch.setenv(AFFINITY_ENV, "none")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    note, fallback = pin_rank()
    assert note is not None and fallback is None


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity")
def test_auto_leaves_a_core_per_rank_to_the_scheduler_and_core_pins_it():
    """By default only time-shared ranks are pinned; ``core`` pins a core-per-rank job too."""
    allowed = sorted(os.sched_getaffinity(0))
    code = ("import os; from fxplan.runtime.launch.affinity import pin_rank; "
            f"note, fallback = pin_rank(0, {len(allowed)}); "
            "print(sorted(os.sched_getaffinity(0)), '|', note, '|', fallback)")
    mask, note, fallback = _run(code).split(" | ")
    assert mask == str(allowed) and fallback == "None"
    assert note == (f"[affinity] {len(allowed)} local ranks on {len(allowed)} cores, a core "
                    "each: not pinned (the scheduler places them; --cpu-affinity core pins)")
    mask, note, fallback = _run(code, **{AFFINITY_ENV: "core"}).split(" | ")
    assert mask == str(allowed[:1]) and fallback == "None"
    assert note.endswith(f"local rank 0 on core {allowed[0]}")
