"""Elastic and fault-tolerant ``fxplan launch`` with real torchruns and real processes on CPU/gloo
(docs/elastic.md): (b) a worker SIGKILLed while a checkpoint is being saved → fxplan starts a
fresh torchrun, which resumes from the last committed checkpoint; (c) a 4-rank run stopped and
resumed with 2 ranks (replanned); (d) a 2-rank run (the 4-rank plan, replanned) stopped and
resumed with 4 ranks. Every step after the resume has the uninterrupted 4-rank run's loss within
float tolerance (same global batch, same data order: only the all-reduce order differs).

Faults are injected with ``FXPLAN_FAULT=WHERE:RANK:STEP:ATTEMPT`` (``fxplan.worker``): the rank
SIGKILLs itself, as a failing node would."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from launch_here import launch_here

MODEL = "gpt-tiny:dropout=0,seq=16"
STEPS = ("--steps", "4", "--checkpoint-every", "2", "--optimizer", "adamw", "--lr", "3e-3")


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    from fxplan import search

    root = tmp_path_factory.mktemp("elastic")
    return {world: search(MODEL, f"local-cpu:devices={world}", batch=8, seq=16,
                          progress=False).save(root / f"plan{world}.json") for world in (2, 4)}


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    from rt_trainer_cases import make_token_file

    return make_token_file(str(tmp_path_factory.mktemp("tokens") / "tokens.bin"))


def launch(*args: str, fault: str | None = None, capfd=None) -> subprocess.CompletedProcess:
    """``fxplan launch ARGS`` with ``FXPLAN_FAULT=fault`` (none if None): in this process
    (:mod:`launch_here`) when given a test's ``capfd``, else as a subprocess."""
    env = {k: v for k, v in os.environ.items() if k != "FXPLAN_FAULT"}
    if fault:
        env["FXPLAN_FAULT"] = fault
    if capfd is not None:
        return launch_here(capfd, *args, env=env)
    return subprocess.run([sys.executable, "-m", "fxplan.cli.main", "launch", *args],
                          capture_output=True, text=True, timeout=300, env=env)


def losses(run_dir) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == sorted({row["step"] for row in rows}), rows
    return {row["step"]: row["loss"] for row in rows}


def events(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(plans, tokens, tmp_path_factory):
    """The 4-rank run that nothing interrupts: losses of steps 1–4."""
    run_dir = tmp_path_factory.mktemp("whole") / "run"
    done = launch(str(plans[4]), "--data", tokens, *STEPS, "--run-dir", str(run_dir))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not (run_dir / "events.jsonl").exists()  # nothing happened
    return losses(run_dir)


def same_losses(got: dict[int, float], want: dict[int, float]) -> None:
    assert sorted(got) == sorted(want), (got, want)
    worst = max(abs(got[s] - want[s]) for s in want)
    print(f"max |Δloss| over steps {sorted(want)}: {worst:.3g}")
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)


@pytest.mark.multirank
def test_b_sigkill_during_a_save_restarts_and_resumes_from_the_last_checkpoint(
        plans, tokens, uninterrupted, tmp_path, capfd):
    """Rank 1 of attempt 0 dies as the checkpoint of step 4 is being written: the step-2
    checkpoint stays the newest committed one (the failure costs one interval), every process of
    attempt 0 is ended, attempt 1 (a fresh torchrun on a new port) resumes from step 2 with the
    saved optimizer state and generators and trains steps 3–4 with the uninterrupted losses."""
    run_dir = tmp_path / "run"
    done = launch(str(plans[2]), "--data", tokens, *STEPS, "--run-dir", str(run_dir),
                  "--max-restarts", "2", fault="save:1:4:0", capfd=capfd)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "FXPLAN_FAULT: rank 1 kills itself at step 4 (save) of attempt 0" in out
    ports = [line.split("--rdzv-endpoint=")[1].split()[0] for line in done.stdout.splitlines()
             if "--rdzv-endpoint=" in line]
    assert len(ports) == 2, done.stdout  # attempt 0 and the restart
    kinds = [event["kind"] for event in events(run_dir)]
    assert kinds == ["restart", "resume"], kinds  # same world: no replan
    restart, resume = events(run_dir)
    assert restart["attempt"] == 1 and restart["exit_code"] != 0, restart
    assert restart["checkpoint_step"] == 2 and restart["last_step"] == 4, restart
    assert restart["steps_redone"] == 2  # at most one interval lost
    assert resume["checkpoint_step"] == 2 and resume["next_sample"] == 16, resume
    assert resume["samples_skipped"] == 0 and resume["samples_replayed"] == 0, resume
    assert "resumed parameters, optimizer state and data position from" in out
    assert "random generators not restored" not in out  # same ranks: RNG restored too
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()
                  if not p.name.startswith("step-4.tmp")) == ["latest", "step-2", "step-4"]
    same_losses(losses(run_dir), uninterrupted)


def _stopped(capfd, plan, tokens, run_dir, *extra: str) -> None:
    """A run killed at step 3 (rank 0, after the update), not restarted: step-2 is committed."""
    done = launch(str(plan), "--data", tokens, *STEPS, "--run-dir", str(run_dir), *extra,
                  fault="step:0:3:0", capfd=capfd)
    assert done.returncode != 0, done.stdout[-3000:]
    assert (run_dir / "checkpoints" / "step-2").is_dir()
    assert not (run_dir / "checkpoints" / "step-4").exists()


@pytest.mark.multirank
def test_c_four_ranks_stopped_resume_on_two_replanned(plans, tokens, uninterrupted, tmp_path,
                                                      capfd):
    """Case (c): two devices are gone. ``fxplan launch plan4.json --nproc-per-node 2`` is not
    refused: the launch replans for 2 ranks (same global batch), the workers load the 4-rank
    checkpoint resharded and go on at step 3 with the uninterrupted losses; metrics.jsonl steps
    go on."""
    run_dir = tmp_path / "run"
    _stopped(capfd, plans[4], tokens, run_dir)
    done = launch(str(plans[4]), "--data", tokens, *STEPS, "--run-dir", str(run_dir),
                  "--nproc-per-node", "2", "--resume", str(run_dir), capfd=capfd)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "replanning for 2 ranks" in done.stdout
    assert "replan: new plan written to" in done.stdout  # by the launcher: the world is known
    replan, resume = events(run_dir)
    assert replan["kind"] == "replan" and resume["kind"] == "resume", (replan, resume)
    assert replan["old"]["world_size"] == 4 and replan["new"]["world_size"] == 2, replan
    assert replan["old"]["batch"] == replan["new"]["batch"] == 8
    assert replan["new"]["dp"] * replan["new"]["microbatch"] * \
        replan["new"]["num_microbatches"] == 8
    assert replan["replan_ms"] > 0 and replan["new"]["predicted_step_time_s"] > 0
    print(f"replan 4→2 in the launcher: {replan['replan_ms']:.0f} ms {replan['timings_s']}")
    assert resume["checkpoint_step"] == 2 and resume["samples_skipped"] == 0 \
        and resume["samples_replayed"] == 0, resume
    assert "random generators not restored" in out  # 4 ranks saved, 2 resume
    same_losses(losses(run_dir), uninterrupted)


@pytest.mark.multirank
def test_d_two_ranks_stopped_resume_on_four(plans, tokens, uninterrupted, tmp_path, capfd):
    """Case (d): devices are added. The 4-rank plan run under ``--elastic`` on 2 ranks — the
    workers read their world and replan (rank 0 searches, broadcasts) — is stopped, then
    launched on the 4 ranks of its plan: it loads the 2-rank checkpoint resharded to the 4-rank
    plan and goes on with the uninterrupted losses."""
    run_dir = tmp_path / "run"
    _stopped(capfd, plans[4], tokens, run_dir, "--nproc-per-node", "2", "--elastic", "1:1")
    replan = events(run_dir)[0]
    assert replan["kind"] == "replan" and replan["new"]["world_size"] == 2, replan
    print(f"replan 4→2 in the worker: {replan['replan_ms']:.0f} ms {replan['timings_s']}")
    assert (run_dir / "plans" / "plan-world2.json").is_file()  # written by rank 0
    done = launch(str(plans[4]), "--data", tokens, *STEPS, "--run-dir", str(run_dir),
                  "--resume", str(run_dir), capfd=capfd)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    kinds = [event["kind"] for event in events(run_dir)]
    assert kinds == ["replan", "resume"], kinds  # the first (2-rank) run's replan, the resume
    assert events(run_dir)[1]["checkpoint_step"] == 2
    same_losses(losses(run_dir), uninterrupted)


@pytest.mark.multirank
def test_torchruns_own_restart_works_too(plans, tokens, uninterrupted, tmp_path, capfd):
    """torchrun's own ``--max-restarts`` (after ``--``): the restarted workers meet on a store
    namespace of their own (``fxplan.runtime.launch.process_group``; without it they read the dead
    workers' gloo addresses and fail in connectFullMesh), go on from the newest checkpoint and
    give the uninterrupted losses."""
    run_dir = tmp_path / "run"
    done = launch(str(plans[2]), "--data", tokens, *STEPS, "--run-dir", str(run_dir),
                  "--", "--max-restarts=1", fault="step:1:3:0", capfd=capfd)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "connectFullMesh" not in out
    restart, resume = events(run_dir)
    assert (restart["kind"], restart["by"], restart["attempt"]) == ("restart", "torchrun", 1)
    assert resume["kind"] == "resume" and resume["checkpoint_step"] == 2, resume
    same_losses(losses(run_dir), uninterrupted)
