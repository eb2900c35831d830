"""The supervisor of ``fxplan launch --max-restarts`` with plain Python processes standing in for
torchrun: a failed attempt's whole process group is ended before the next starts, each restart
is an event with the checkpoint it resumes from, and the restarts are bounded."""

from __future__ import annotations

import os
import sys
import time

from fxplan.runtime.train.events import read_events
from fxplan.runtime.launch.supervisor import group_members, last_logged_step, supervise

#: Attempt 0 starts a grandchild that would outlive it (sleeps 60 s), writes its pid, exits 3;
#: later attempts exit with the code in argv[2].
CHILD = """
import os, subprocess, sys, time
attempt = int(os.environ["FXPLAN_ATTEMPT"])
if attempt == 0:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    open(sys.argv[1], "w").write(str(sleeper.pid))
    sys.exit(3)
sys.exit(int(sys.argv[2]))
"""


def _factory(tmp_path, later_code: int):
    pid_file = tmp_path / "grandchild.pid"
    seen: list[int] = []

    def make(attempt: int):
        seen.append(attempt)
        if attempt == 1:  # attempt 0's group must be gone by now
            pid = int(pid_file.read_text())
            assert not os.path.exists(f"/proc/{pid}") or \
                open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z", pid
        return ({"FXPLAN_ATTEMPT": str(attempt)},
                [sys.executable, "-c", CHILD, str(pid_file), str(later_code)])
    return make, seen


def test_a_failed_attempt_is_ended_whole_and_restarted(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step-4").mkdir(parents=True)
    (run_dir / "checkpoints" / "step-4" / "fxplan-manifest.json").write_text("{}")
    (run_dir / "checkpoints" / "step-6.tmp-abc").mkdir()  # an interrupted save: not committed
    (run_dir / "metrics.jsonl").write_text("".join(f'{{"step": {s}}}\n' for s in (1, 2, 3, 4, 5))
                                           + '{"step": 6, "lo')  # a line cut by the crash
    make, seen = _factory(tmp_path, 0)
    lines: list[str] = []
    assert supervise(make, max_restarts=2, run_dir=run_dir, say=lines.append) == 0
    assert seen == [0, 1]
    events = read_events(run_dir)
    assert [e["kind"] for e in events] == ["restart"]
    assert events[0] | {"time": 0} == {
        "kind": "restart", "time": 0, "attempt": 1, "exit_code": 3, "checkpoint_step": 4,
        "last_step": 5, "steps_redone": 1, "restarts_left": 1}
    assert any("resuming from checkpoint step 4 (steps 5–5 are done again)" in x for x in lines)


def test_restarts_are_bounded(tmp_path):
    make, seen = _factory(tmp_path, 5)
    lines: list[str] = []
    assert supervise(make, max_restarts=2, run_dir=tmp_path, say=lines.append) == 5
    assert seen == [0, 1, 2]
    events = read_events(tmp_path)
    assert [(e["attempt"], e["exit_code"], e["checkpoint_step"]) for e in events] == \
        [(1, 3, None), (2, 5, None)]
    assert "restarts left" not in lines[-1] and "giving up" in lines[-1]


def test_group_members_sees_a_live_group_and_not_a_finished_one():
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not group_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert group_members(proc.pid) == [proc.pid]
    finally:
        proc.kill()
        proc.wait()
    assert group_members(proc.pid) == []
    assert last_logged_step("/nonexistent") is None
