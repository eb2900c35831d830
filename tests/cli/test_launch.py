"""``fxplan launch``: real torchruns of a GPT plan on 4 CPU ranks (training from a token file,
resuming after a re-plan), and the refusals that happen before any process starts. Command
and argument checks without torchrun: ``tests/planner/test_cli_launch.py``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

MODEL = "gpt-tiny:dropout=0,seq=16"


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    """The planner's plan for gpt-tiny on 4 local CPU ranks."""
    from fxplan import search

    plan = search(MODEL, "local-cpu:devices=4", batch=8, seq=16, progress=False)
    return plan.save(tmp_path_factory.mktemp("launch") / "plan.json")


def launch(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fxplan.cli.main", "launch", *args],
                          capture_output=True, text=True, timeout=timeout)


def _descendants(pid: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parents[int(entry)] = int(handle.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    found, grew = {pid}, True
    while grew:
        new = {child for child, parent in parents.items() if parent in found} - found
        found |= new
        grew = bool(new)
    return found


def _listening(pids: set[int]) -> set[str]:
    """``ADDR:PORT`` (hex, as /proc/net/tcp{,6} write them) of LISTEN sockets of ``pids``."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.add(fields[1])
    return found


LOOPBACK = ("0100007F:", "00000000000000000000000001000000:")  # 127.0.0.1, ::1


def test_launch_trains_50_steps_from_a_token_file_on_loopback_only(plan_file, tmp_path):
    """A real torchrun on 4 CPU ranks: 50 steps from a token file; the loss falls, every
    metric is logged, the summary is written, and while it runs every listening socket of the
    launch's processes is bound to loopback (read from /proc/net/tcp and tcp6)."""
    from rt_trainer_cases import make_token_file

    tokens = make_token_file(str(tmp_path / "tokens.bin"))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fxplan.cli.main", "launch", str(plan_file), "--data", tokens,
         "--steps", "50", "--lr", "3e-3", "--warmup-steps", "5", "--log-every", "10",
         "--run-dir", str(run_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sockets: set[str] = set()
    while proc.poll() is None:
        sockets |= _listening(_descendants(proc.pid))
        time.sleep(0.1)
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert sockets, "no listening socket seen while the launch ran"
    assert all(address.startswith(LOOPBACK) for address in sockets), sockets
    assert stdout.startswith("running: ") and "fxplan.runtime.torchrun" in stdout.splitlines()[0]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [10, 20, 30, 40, 50]
    for key in ("step", "loss", "grad_norm", "lr", "tokens_per_s_per_device",
                "tflops_per_device", "mfu", "peak_memory_gib", "memory_pct"):
        assert all(isinstance(row[key], (int, float)) for row in rows), key
    assert rows[-1]["loss"] < rows[0]["loss"], rows
    assert rows[-1]["lr"] == pytest.approx(3e-4)
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("predicted_step_time_s", "measured_step_time_s", "predicted_peak_memory_gib",
                "measured_peak_memory_gib", "plan"):
        assert summary[key] is not None, key
    assert re.search(r"^step time +[\d.]+ +[\d.]+ ms$", stdout, re.M), stdout
    assert re.search(r"^step +50 +loss \S+ +grad_norm \S+ +lr \S+ .* MFU \S+%", stdout, re.M)
    assert "terminate called" not in stderr  # clean exits


def test_fewer_processes_than_the_plan_replan_instead_of_refusal(plan_file, capsys):
    """``--nproc-per-node 2`` for a 4-rank plan: not refused; torchrun starts 2 processes and
    the launch replans for them (docs/elastic.md; run for real in test_launch_elastic.py)."""
    from fxplan.cli.main import main

    assert main(["launch", str(plan_file), "--data", "synthetic", "--nproc-per-node", "2",
                 "--print-command"]) == 0
    out = capsys.readouterr().out
    assert "replanning for 2 ranks" in out and "replan: degrees:" in out
    assert "--nproc-per-node=2" in out.splitlines()[-1]


def test_plan_for_another_model_refused(plan_file):
    done = launch(str(plan_file), "--data", "synthetic", "--model", MODEL + ",layers=3", "--dry-run")
    assert done.returncode == 2
    assert "was made for model" in done.stderr and "re-plan" in done.stderr


def test_plan_for_another_cluster_refused(plan_file, tmp_path):
    data = json.loads(plan_file.read_text())
    data["cluster_fingerprint"] = "0" * 64
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    done = launch(str(other), "--data", "synthetic", "--dry-run")
    assert done.returncode == 2
    assert "was made for cluster" in done.stderr


def test_training_goes_on_after_a_replan_for_fewer_devices(plan_file, tmp_path):
    """Train 3 steps on 4 ranks and save; re-plan for 2 ranks (two devices gone); resume there
to step 5 (``--steps`` is the total).

    The resumed run starts from the saved parameters and optimizer state, resharded into the
    new mesh: its first loss is below the first run's last printed loss (which was measured
    before that run's last update), not back at the initial loss.
    """
    from fxplan import search

    ckpt = tmp_path / "ckpt"
    first = launch(str(plan_file), "--data", "synthetic", "--steps", "3", "--save", str(ckpt),
                   "--run-dir", str(tmp_path / "run1"))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    before = [float(x) for x in re.findall(r"^step +\d+ +loss (\S+)", first.stdout, re.M)]
    assert "saved parameters, optimizer state and data position" in first.stdout

    smaller = search(MODEL, "local-cpu:devices=2", batch=8, seq=16, progress=False)
    second_plan = smaller.save(tmp_path / "plan2.json")
    second = launch(str(second_plan), "--data", "synthetic", "--steps", "5", "--resume", str(ckpt),
                    "--run-dir", str(tmp_path / "run2"))
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    after = [float(x) for x in re.findall(r"^step +\d+ +loss (\S+)", second.stdout, re.M)]
    assert "resumed parameters, optimizer state and data position" in second.stdout
    assert "random generators not restored" in second.stdout  # 4 ranks saved, 2 resume
    assert len(after) == 2  # steps 4 and 5 of --steps 5 in all
    assert after[0] < before[-1] < before[0], (before, after)
    assert "terminate called" not in first.stderr + second.stderr


def test_resume_from_a_missing_checkpoint_is_refused_before_start(plan_file, tmp_path):
    done = launch(str(plan_file), "--data", "synthetic", "--resume", str(tmp_path / "nowhere"),
                  "--dry-run")
    assert done.returncode == 2
    assert "no such checkpoint directory" in done.stderr


def test_resumed_launch_continues_at_the_next_sample(plan_file, tmp_path):
    """Two real launches: 4 steps with a checkpoint every 2, then a resume from ``step-2`` into
    another run directory gives steps 3 and 4 with the first run's losses exactly (metrics.jsonl
    holds full floats), and its metrics start at step 3."""
    from rt_trainer_cases import make_token_file

    tokens = make_token_file(str(tmp_path / "tokens.bin"))
    common = ("--data", tokens, "--steps", "4", "--optimizer", "sgd", "--lr", "0.3",
              "--checkpoint-every", "2")
    first = launch(str(plan_file), *common, "--run-dir", str(tmp_path / "run1"))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    checkpoints = tmp_path / "run1" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step-2", "step-4"]
    assert (checkpoints / "latest").read_text().strip() == "step-4"
    second = launch(str(plan_file), *common, "--run-dir", str(tmp_path / "run2"),
                    "--resume", str(checkpoints / "step-2"))
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "going on at step 3 (global sample 16)" in second.stdout

    def losses(run: str) -> dict[int, float]:
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return {row["step"]: row["loss"] for row in map(json.loads, lines)}

    whole, resumed = losses("run1"), losses("run2")
    assert sorted(resumed) == [3, 4], resumed
    print("max |Δloss| steps 3–4:", max(abs(whole[s] - resumed[s]) for s in (3, 4)))
    assert [resumed[3], resumed[4]] == [whole[3], whole[4]], (whole, resumed)
    assert sorted(p.name for p in (tmp_path / "run2" / "checkpoints").iterdir()) == \
        ["latest", "step-4"]
