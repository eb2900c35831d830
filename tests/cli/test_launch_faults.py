"""What real clusters do to a run, done to real ``fxplan launch`` processes on 2 CPU ranks: the
launcher killed outright, a second launch into a running or finished run's directory, the
last line of ``metrics.jsonl``/``events.jsonl`` cut, another model's checkpoint, a hung rank,
a data hook that yields the wrong thing, a checkpoint write that runs out of room.

Faults inside a rank are injected with ``FXPLAN_FAULT=WHERE:RANK:STEP:ATTEMPT[:ACTION]``
(``fxplan.worker``): ``stop`` SIGSTOPs the rank (a hung rank), ``fsize`` sets its
``RLIMIT_FSIZE`` to 4 KiB with ``SIGXFSZ`` ignored, so that the checkpoint's file writes fail
with ``EFBIG`` in the kernel as they would with ``ENOSPC`` on a full disk (no small file system
can be mounted here). Time limits only guard against hangs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch_here import launch_here
from processes import alive, descendants

MODEL = "gpt-tiny:dropout=0,seq=16"
STEPS = ("--steps", "4", "--checkpoint-every", "2")


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    from fxplan import search

    return search(MODEL, "local-cpu:devices=2", batch=4, seq=16, progress=False).save(
        tmp_path_factory.mktemp("faults") / "plan.json")


def _env(fault: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "FXPLAN_FAULT"}
    if fault:
        env["FXPLAN_FAULT"] = fault
    return env


def _steps(run_dir) -> list[int]:
    return [json.loads(line)["step"]
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _events(run_dir) -> list[str]:
    path = run_dir / "events.jsonl"
    return [json.loads(line)["kind"] for line in path.read_text().splitlines()] \
        if path.exists() else []


def _one_paragraph(done: subprocess.CompletedProcess, words: str) -> None:
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert words in done.stderr, done.stderr[-3000:]
    assert done.stderr.count(words) == 1 and "Traceback" not in done.stdout + done.stderr
    assert done.stderr.strip().count("\n") == 0, done.stderr[-3000:]


@pytest.mark.multirank
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc for the launch's processes")
def test_killing_the_launcher_ends_every_process_and_frees_the_run_dir(plan, tmp_path, capfd):
    """A launch is SIGKILLed mid-run: torchrun and both workers end with it (before: they
    trained on with parent pid 1); while it ran, a second launch into its directory was refused
    (before: both ran, one overwriting the other's files); once it is gone the directory's lock
    is free again and ``--overwrite`` starts afresh."""
    run_dir = tmp_path / "run"
    with open(tmp_path / "first.log", "w") as out:
        first = subprocess.Popen([sys.executable, "-m", "fxplan.cli.main", "launch", str(plan),
                                  "--data", "synthetic", "--steps", "100000", "--run-dir",
                                  str(run_dir)], stdout=out, stderr=subprocess.STDOUT, env=_env())
    family: set[int] = set()
    try:
        deadline = time.monotonic() + 240  # hang guard
        while first.poll() is None and time.monotonic() < deadline and not (
                (run_dir / "metrics.jsonl").is_file() and _steps(run_dir)):
            time.sleep(0.2)
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        family = descendants(first.pid) - {first.pid}
        assert len(family) >= 3, family  # torchrun and two workers
        second = launch_here(capfd, str(plan), "--data", "synthetic", "--steps", "2",
                             "--run-dir", str(run_dir), timeout=120)
        _one_paragraph(second, "is in use by another fxplan launch")
        assert f"pid {first.pid}" in second.stderr
        first.kill()
        first.wait()
        deadline = time.monotonic() + 60  # hang guard: they are gone in a few seconds
        while any(map(alive, family)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in family if alive(pid)], "orphans of the killed launcher"
    finally:
        if first.poll() is None:
            first.kill()
        for pid in family:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    third = launch_here(capfd, str(plan), "--data", "synthetic", "--steps", "2", "--run-dir",
                        str(run_dir), "--overwrite")
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert "--overwrite: removed the previous run's metrics.jsonl" in third.stdout
    assert _steps(run_dir) == [1, 2]


@pytest.mark.multirank
def test_a_finished_or_cut_run_dir_is_refused_resumed_or_overwritten(plan, tmp_path, capfd):
    """A run dies at step 3 (step-2 committed) and the last lines of ``metrics.jsonl`` and
    ``events.jsonl`` are cut, as a kill or a full disk leaves them. Launching into it again
    without a flag is refused and changes nothing (before: metrics.jsonl truncated, summary
    overwritten); ``--resume`` goes on from step 2 (before: every attempt failed on the cut
    line with JSONDecodeError); ``--overwrite`` starts afresh."""
    run_dir = tmp_path / "run"
    args = (str(plan), "--data", "synthetic", *STEPS, "--run-dir", str(run_dir))
    died = launch_here(capfd, *args, env=_env("step:0:3:0"))
    assert died.returncode != 0 and _steps(run_dir) == [1, 2, 3], died.stdout[-3000:]
    with open(run_dir / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 4, "loss": 5.1')  # a line cut mid-write
    (run_dir / "events.jsonl").write_text('{"kind": "restart", "time": 1, "att')
    before = (run_dir / "metrics.jsonl").read_bytes()

    again = launch_here(capfd, *args)
    _one_paragraph(again, "holds a previous run")
    assert "--resume" in again.stderr and "--overwrite" in again.stderr
    assert (run_dir / "metrics.jsonl").read_bytes() == before

    resumed = launch_here(capfd, *args, "--resume")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "going on at step 3" in resumed.stdout
    assert _steps(run_dir) == [1, 2, 3, 4]
    assert _events(run_dir) == ["resume"]  # the cut line is dropped, the new one kept

    fresh = launch_here(capfd, str(plan), "--data", "synthetic", "--steps", "2",
                        "--checkpoint-every", "2", "--run-dir", str(run_dir), "--overwrite")
    assert fresh.returncode == 0, fresh.stdout[-3000:] + fresh.stderr[-3000:]
    assert _steps(run_dir) == [1, 2] and _events(run_dir) == []
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["latest", "step-2"]


@pytest.mark.multirank
def test_another_models_checkpoint_is_refused_before_any_worker(plan, tmp_path, capfd):
    """A checkpoint of gpt-tiny resumed by a plan of a wider gpt-tiny: refused by the launcher
    from the manifest's model fingerprint (before: "manifest and file hashes verified", then
    every rank failed loading with missing or mismatched keys)."""
    from fxplan import search

    run_dir = tmp_path / "run"
    saved = launch_here(capfd, str(plan), "--data", "synthetic", "--steps", "2",
                        "--checkpoint-every", "2", "--run-dir", str(run_dir))
    assert saved.returncode == 0, saved.stdout[-3000:] + saved.stderr[-3000:]
    manifest = json.loads((run_dir / "checkpoints" / "step-2" / "fxplan-manifest.json")
                          .read_text())
    assert manifest["model"] == MODEL and len(manifest["model_fingerprint"]) == 64
    assert len(manifest["plan_fingerprint"]) == 64
    wider = "gpt-tiny:dropout=0,seq=16,hidden=96"
    other = search(wider, "local-cpu:devices=2", batch=4, seq=16, progress=False).save(
        tmp_path / "wider.json")
    done = launch_here(capfd, str(other), "--data", "synthetic", "--steps", "4", "--run-dir",
                       str(tmp_path / "run2"), "--resume", str(run_dir))
    _one_paragraph(done, "holds the parameters of model")
    assert wider in done.stderr and "running:" not in done.stdout
    assert not (tmp_path / "run2" / "metrics.jsonl").exists()


@pytest.mark.multirank
def test_a_hung_rank_ends_its_attempt_and_the_run_goes_on(plan, tmp_path, capfd):
    """Rank 1 SIGSTOPs itself after step 3: rank 0 waits in the next collective. The launcher
    sees no step for ``--step-timeout`` seconds, logs a ``stall`` event, ends the attempt and
    restarts it from step 2 (before: nothing happened for the process group's 30 minutes)."""
    run_dir = tmp_path / "run"
    done = launch_here(capfd, str(plan), "--data", "synthetic", "--steps", "6",
                       "--checkpoint-every", "2", "--run-dir", str(run_dir),
                       "--max-restarts", "1", "--step-timeout", "10",
                       env=_env("step:1:3:0:stop"), timeout=400)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "FXPLAN_FAULT: rank 1 stops itself at step 3" in out
    assert "rank(s) 1 finished no step for" in out and "a rank is hung" in out
    assert _events(run_dir) == ["stall", "restart", "resume"]
    stall = json.loads((run_dir / "events.jsonl").read_text().splitlines()[0])
    assert stall["ranks"] == [1] and stall["last_step"] == 2 and stall["timeout_s"] == 10
    assert _steps(run_dir) == [1, 2, 3, 4, 5, 6]


@pytest.mark.multirank
def test_what_only_a_worker_sees_is_reported_once_without_a_restart(plan, tmp_path, capfd):
    """A data hook that returns no iterable and a checkpoint write that fails for lack of room:
    one paragraph from the launcher, exit 2, no restart spent (before: a traceback per rank,
    exit 1, and every restart failed the same way)."""
    hook = tmp_path / "hook.py"
    hook.write_text("def build(**context):\n    return 42\n")
    run_dir = tmp_path / "hook"
    done = launch_here(capfd, str(plan), "--data", f"{hook}:build", "--steps", "2",
                       "--run-dir", str(run_dir), "--max-restarts", "2")
    _one_paragraph(done, "build(**context) returned int; expected an iterable")
    assert "ranks 0, 1:" in done.stderr and "restart" not in _events(run_dir)

    run_dir = tmp_path / "full"
    done = launch_here(capfd, str(plan), "--data", "synthetic", *STEPS, "--run-dir",
                       str(run_dir), "--max-restarts", "2", env=_env("save:1:2:0:fsize"))
    _one_paragraph(done, "writing it failed: file too large")
    assert "step-2" in done.stderr and _events(run_dir) == []
    assert not (run_dir / "checkpoints" / "step-2").exists()  # never committed


@pytest.mark.multirank
def test_a_worker_error_after_the_graph_rewrite_leaves_no_leaked_lock_warning(tmp_path, capfd):
    """The graph rewrite's example values run a ``torch.fx.Interpreter``, whose (disabled) tqdm
    bar takes a multiprocessing lock: a rank that then stops on an error releases it as it
    leaves, so that the launcher's paragraph is not followed by the resource tracker's
    "leaked semaphore objects" warning."""
    from fxplan import search
    from fxplan.core.torch_support import torch_has

    if not torch_has("dtensor_view_sharding"):
        pytest.skip("the graph rewrite with tp needs torch >= 2.12")
    # selective recompute of the written-out attention: the plan runs as the graph rewrite
    plan = search(MODEL, "local-cpu:devices=2", batch=4, seq=16, progress=False,
                  constraints={"tp": 2, "recompute": "selective"}).save(tmp_path / "plan.json")
    hook = tmp_path / "hook.py"
    hook.write_text("def build(**context):\n    return 42\n")
    done = launch_here(capfd, str(plan), "--data", f"{hook}:build", "--steps", "2",
                       "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert "build(**context) returned int; expected an iterable" in done.stderr, done.stderr
    assert "leaked semaphore" not in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("case", ["empty", "odd", "short", "vocab", "fifo", "run-dir-file",
                                  "run-dir-read-only"])
def test_bad_data_and_run_dirs_are_refused_before_the_workers_start(plan, tmp_path, capfd, case):
    """Token files that cannot feed gpt-tiny (vocabulary 512, seq 16, uint16 ids), a FIFO as
    data, a regular file or an unwritable directory as ``--run-dir``: one paragraph, exit 2,
    no torchrun started (before: a traceback per rank and exit 1)."""
    import numpy as np

    data, run_dir = tmp_path / "tokens.bin", tmp_path / "run"
    ids = np.arange(64, dtype=np.uint16) % 200
    expected = {"empty": "is empty", "odd": "not a whole number of uint16 ids",
                "short": "fewer than one sample", "vocab": "id 600 at token 40 is not below",
                "fifo": "is a FIFO (named pipe), not a regular file",
                "run-dir-file": "is a regular file: expected a directory",
                "run-dir-read-only": "cannot be written"}[case]
    if case == "run-dir-read-only" and os.geteuid() == 0:  # root writes any mode-555 dir …
        if not os.path.isdir("/sys/kernel"):
            pytest.skip("root writes into a read-only directory")
        run_dir = Path("/sys/kernel")  # … but not into sysfs
    if case == "empty":
        data.write_bytes(b"")
    elif case == "odd":
        data.write_bytes(ids.tobytes() + b"\0")
    elif case == "short":
        data.write_bytes(ids[:10].tobytes())
    elif case == "vocab":
        ids[40] = 600
        data.write_bytes(ids.tobytes())
    elif case == "fifo":
        os.mkfifo(data)
    else:
        data.write_bytes(ids.tobytes())
        if case == "run-dir-file":
            run_dir.write_text("not a directory")
        elif not run_dir.exists():
            run_dir.mkdir()
            run_dir.chmod(0o555)
    done = launch_here(capfd, str(plan), "--data", str(data), "--steps", "2", "--run-dir",
                       str(run_dir), timeout=120)
    _one_paragraph(done, expected)
    assert "running:" not in done.stdout
