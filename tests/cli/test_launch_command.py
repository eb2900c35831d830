"""``fxplan launch`` arguments, run config, torchrun command and sbatch script: in-process,
no torchrun started (the real launch is ``tests/runtime/test_launch.py``)."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from fxplan.cli.main import main

MODEL = "gpt-tiny:dropout=0,seq=16"


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """Plans for one node of 4 CPU ranks and for 2 nodes of 2."""
    import fxplan

    folder = tmp_path_factory.mktemp("plans")
    one = fxplan.search(MODEL, "local-cpu:devices=4", batch=8, seq=16, progress=False)
    two = fxplan.search(MODEL, "local-cpu:devices=2,nodes=2", batch=8, seq=16, progress=False)
    return str(one.save(folder / "one.json")), str(two.save(folder / "two.json"))


def launch(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["launch", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_single_node_command_rendezvous_on_loopback(plans, capsys, tmp_path):
    code, out, err = launch(capsys, plans[0], "--data", "synthetic", "--steps", "3",
                            "--run-dir", str(tmp_path / "run"), "--print-command")
    assert code == 0, err
    words = shlex.split(out)
    assert "OMP_NUM_THREADS=1" in words and "GLOO_SOCKET_IFNAME=lo" in words
    assert words[words.index("-m") + 1] == "fxplan.runtime.launch.torchrun"
    assert "--nnodes=1" in words and "--nproc-per-node=4" in words
    assert "--local-addr=127.0.0.1" in words and "--standalone" not in words
    assert any(w.startswith("--rdzv-endpoint=127.0.0.1:") for w in words)
    worker = words[words.index("fxplan.worker"):]
    assert worker[worker.index("--steps") + 1] == "3"
    assert not (tmp_path / "run").exists()  # printing runs nothing


def test_nodes_and_processes_come_from_the_plans_cluster(plans, capsys):
    code, out, err = launch(capsys, plans[1], "--data", "synthetic", "--rdzv-endpoint",
                            "node0:29500", "--node-rank", "1", "--print-command")
    assert code == 0, err
    assert "--nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=node0:29500 " \
           "--node-rank=1" in out
    assert "-m torch.distributed.run" in out


def test_multi_node_without_endpoint_is_refused(plans, capsys):
    code, out, err = launch(capsys, plans[1], "--data", "synthetic", "--print-command")
    assert code == 2 and out == ""
    assert "runs on 2 nodes × 2 processes: a multi-node launch needs --rdzv-endpoint" in err
    code, _, err = launch(capsys, plans[1], "--data", "synthetic", "--nnodes", "2")
    assert code == 2 and "multi-node launch needs --rdzv-endpoint" in err


def test_nnodes_other_than_the_plans_replan_in_the_workers(plans, capsys):
    """More nodes than the plan's cluster: not refused; the workers replan for 2·4 ranks."""
    code, out, err = launch(capsys, plans[0], "--data", "synthetic", "--nnodes", "2",
                            "--rdzv-endpoint", "node0:29500", "--print-command")
    assert code == 0, err
    assert "2 node(s) × 4 process(es) = 8 ranks" in out and "replanning for 8 ranks" in out
    assert "--nnodes=2 --nproc-per-node=4" in out


def test_max_restarts_and_elastic_commands(plans, capsys, tmp_path):
    """``--max-restarts``: torchrun's own restarts off, a rendezvous id per attempt, the
    attempt number and --auto-resume for the workers; ``--elastic`` on many nodes:
    ``--nnodes=MIN:MAX``."""
    run = str(tmp_path / "run")
    code, out, err = launch(capsys, plans[0], "--data", "synthetic", "--run-dir", run,
                            "--max-restarts", "2", "--print-command")
    assert code == 0, err
    words = shlex.split(out)
    assert "FXPLAN_ATTEMPT=0" in words and "--max-restarts=0" in words
    assert [w for w in words if w.startswith("--rdzv-id=fxplan-")][0].endswith("-0")
    assert words.index("--max-restarts=0") < words.index("fxplan.worker") < \
        words.index("--auto-resume")
    code, out, err = launch(capsys, plans[1], "--data", "synthetic", "--elastic", "1:4",
                            "--rdzv-endpoint", "node0:29500", "--print-command")
    assert code == 0, err
    assert "--nnodes=1:4 --nproc-per-node=2" in out and "--auto-resume" in out


def test_restartable_launch_resumes_a_run_dir_with_a_checkpoint(plans, capsys, tmp_path):
    """Under --max-restarts, a run directory holding a committed checkpoint is resumed (a
    re-run job goes on), checked before start as any --resume."""
    import json

    from fxplan.runtime.checkpoint.manifest import commit_checkpoint

    staging = tmp_path / "run" / "checkpoints" / "step-2.tmp-x"
    staging.mkdir(parents=True)
    (staging / "train_state.json").write_text(json.dumps({"step": 2}))
    commit_checkpoint(staging, staging.with_name("step-2"), {"step": 2})
    code, out, err = launch(capsys, plans[0], "--data", "synthetic", "--steps", "4",
                            "--run-dir", str(tmp_path / "run"), "--max-restarts", "1",
                            "--print-command")
    assert code == 0, err
    assert f"resume: {tmp_path / 'run' / 'checkpoints' / 'step-2'}" in out
    words = shlex.split(out.splitlines()[-1])
    assert words[words.index("--resume") + 1] == str(tmp_path / "run")
    code, _, err = launch(capsys, plans[0], "--data", "synthetic", "--steps", "2",
                          "--run-dir", str(tmp_path / "run"), "--max-restarts", "1")
    assert code == 2 and "nothing to train" in err


def test_slurm_script_requeues_and_takes_the_nodes_it_gets(plans, capsys, tmp_path):
    script = tmp_path / "train.sbatch"
    code, _, err = launch(capsys, plans[1], "--data", "synthetic", "--slurm", str(script),
                          "--max-restarts", "3", "--elastic", "1:4")
    assert code == 0, err
    text = script.read_text()
    assert "#SBATCH --nodes=1-4" in text and "#SBATCH --requeue" in text
    assert '--nnodes="${SLURM_JOB_NUM_NODES}" --nproc-per-node=2' in text
    assert '--rdzv-id="${SLURM_JOB_ID}-${SLURM_RESTART_COUNT:-0}"' in text
    assert '-lt 3 ]; then scontrol requeue "$SLURM_JOB_ID"' in text and "--auto-resume" in text
    checked = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize("args, expected", [
    (["--elastic", "2:4"], "the rendezvous is on loopback"),
    (["--elastic", "4:2"], "expected MIN:MAX node counts with 1 ≤ MIN ≤ MAX"),
    (["--elastic", "x"], "expected MIN:MAX node counts"),
    (["--max-restarts", "-1"], "--max-restarts -1: expected an integer ≥ 0"),
    (["--max-restarts", "1", "--", "--max-restarts=3"], "use fxplan's --max-restarts N"),
])
def test_bad_elastic_flags_are_refused(plans, capsys, args, expected):
    code, _, err = launch(capsys, plans[0], "--data", "synthetic", "--print-command", *args)
    assert code == 2 and expected in err, err


def test_torchrun_flags_pass_after_double_dash(plans, capsys):
    code, out, err = launch(capsys, plans[0], "--data", "synthetic", "--print-command", "--",
                            "--max-restarts=0", "--log-dir", "logs")
    assert code == 0, err
    words = shlex.split(out)
    assert words.index("--max-restarts=0") < words.index("fxplan.worker")
    assert words[words.index("--log-dir") + 1] == "logs"
    code, _, err = launch(capsys, plans[0], "--data", "synthetic", "--print-command", "--",
                          "--nproc_per_node=8")
    assert code == 2 and "torchrun flag --nproc_per_node=8 after `--`" in err


def test_slurm_script_passes_bash_n(plans, capsys, tmp_path):
    script = tmp_path / "train.sbatch"
    code, out, err = launch(capsys, plans[1], "--data", "synthetic", "--steps", "5",
                            "--slurm", str(script), "--", "--max-restarts=0")
    assert code == 0, err
    assert f"sbatch {script}" in out
    text = script.read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=1" in text
    assert "--nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d" in text
    assert '--rdzv-endpoint="${head_node}:${rdzv_port}"' in text and "srun " in text
    assert "--max-restarts=0" in text and "--steps 5" in text
    checked = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize("args, expected", [
    (["--steps", "0"], "--steps = 0: expected an integer ≥ 1"),
    (["--steps", "-3"], "--steps = -3: expected an integer ≥ 1"),
    (["--lr", "nan"], "--lr = nan: expected a finite number > 0"),
    (["--lr=-1e-3"], "--lr = -0.001: expected a finite number > 0"),
    (["--grad-clip", "-1"], "--grad-clip = -1.0: expected a finite number ≥ 0"),
    (["--warmup-steps", "10", "--steps", "5"], "warmup_steps = 10 ≥ steps = 5"),
    (["--min-lr", "1", "--lr", "0.1"], "is above the learning rate 0.1"),
])
def test_bad_training_values_are_refused(plans, capsys, args, expected):
    code, _, err = launch(capsys, plans[0], "--data", "synthetic", "--print-command", *args)
    assert code == 2 and expected in err, err


def test_data_is_required_and_checked(plans, capsys, tmp_path):
    code, _, err = launch(capsys, plans[0], "--print-command")
    assert code == 2 and "no training data" in err
    code, _, err = launch(capsys, plans[0], "--data", str(tmp_path / "none.bin"), "--print-command")
    assert code == 2 and "no such file" in err
    code, _, err = launch(capsys, plans[0], "--data", str(tmp_path), "--print-command")
    assert code == 2 and "is a directory" in err


def test_run_config_then_flags(plans, capsys, tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('[data]\npath = "synthetic"\n[training]\nsteps = 7\nseed = 4\n'
                      '[optimizer]\nname = "sgd"\nlr = 0.05\n[lr_scheduler]\nwarmup_steps = 2\n')
    code, out, err = launch(capsys, plans[0], "--config", str(config), "--lr", "0.2",
                            "--print-command")
    assert code == 0, err
    worker = shlex.split(out)
    flags = dict(zip(worker[::1], worker[1::1]))
    assert flags["--steps"] == "7" and flags["--seed"] == "4" and flags["--optimizer"] == "sgd"
    assert flags["--lr"] == "0.2" and flags["--warmup-steps"] == "2" and flags["--data"] == "synthetic"
    config.write_text("[training]\nstep = 3\n")
    code, _, err = launch(capsys, plans[0], "--config", str(config), "--data", "synthetic",
                          "--print-command")
    assert code == 2 and "unknown key 'step' in [training]" in err
    config.write_text('[training]\nsteps = "ten"\n')
    code, _, err = launch(capsys, plans[0], "--config", str(config), "--data", "synthetic",
                          "--print-command")
    assert code == 2 and f"steps in {config} = 'ten': expected an integer ≥ 1" in err


@pytest.mark.parametrize("flag, expected", [((), "auto"), (("--path", "graph"), "graph"),
                                            (("--path", "module"), "module")])
def test_path_reaches_the_worker(plans, capsys, tmp_path, flag, expected):
    """``--path`` (as ``fxplan.plan(path=...)``) is passed to every worker, which hands it to
    ``apply_plan``; the worker's own parser reads it back."""
    from fxplan.rank.args import parse_args

    code, out, err = launch(capsys, plans[0], "--data", "synthetic", *flag,
                            "--run-dir", str(tmp_path / "run"), "--print-command")
    assert code == 0, err
    words = shlex.split(out)
    worker = words[words.index("fxplan.worker") + 1:]
    assert worker[worker.index("--path") + 1] == expected
    assert parse_args(worker).path == expected


def test_path_from_run_config_and_bad_values(plans, capsys, tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('[data]\npath = "synthetic"\n[training]\npath = "graph"\n')
    code, out, err = launch(capsys, plans[0], "--config", str(config), "--run-dir",
                            str(tmp_path / "run"), "--print-command")
    assert code == 0, err
    words = shlex.split(out)
    assert words[words.index("--path") + 1] == "graph"
    config.write_text('[data]\npath = "synthetic"\n[training]\npath = "fast"\n')
    code, out, err = launch(capsys, plans[0], "--config", str(config), "--print-command")
    assert code == 2 and "auto, module or graph" in err, err
    with pytest.raises(SystemExit) as exit_:
        main(["launch", plans[0], "--data", "synthetic", "--path", "fast"])
    assert exit_.value.code == 2
    assert "invalid choice: 'fast'" in capsys.readouterr().err


def test_cpu_affinity_flag_reaches_the_ranks(plans, capsys, tmp_path):
    """``--cpu-affinity none`` is handed to the ranks as ``FXPLAN_CPU_AFFINITY``; without the
    flag nothing is set (the worker's default, ``auto``), and a wrong mode is refused."""
    code, out, err = launch(capsys, plans[0], "--data", "synthetic", "--print-command",
                            "--cpu-affinity", "none")
    assert code == 0, err
    assert "FXPLAN_CPU_AFFINITY=none" in shlex.split(out)
    code, out, err = launch(capsys, plans[0], "--data", "synthetic", "--print-command")
    assert code == 0 and "FXPLAN_CPU_AFFINITY" not in out
    with pytest.raises(SystemExit) as refused:
        launch(capsys, plans[0], "--data", "synthetic", "--cpu-affinity", "numa")
    assert refused.value.code == 2
    script = tmp_path / "job.sbatch"
    code, _, err = launch(capsys, plans[1], "--data", "synthetic", "--slurm", str(script),
                          "--cpu-affinity", "none")
    assert code == 0, err
    assert "FXPLAN_CPU_AFFINITY=none" in script.read_text()


def test_a_rank_other_than_0_keeps_its_runtime_log_lines_to_itself(caplog):
    """Rank 0 prints every rank's fallbacks once (after the first step) and its own log lines
    as they come; the worker of another rank cuts its ``fxplan.runtime`` logger off, so its
    copies are not printed once per rank."""
    import logging

    from fxplan.core.fallbacks import record_fallback
    from fxplan.worker import quiet_runtime_log

    runtime = logging.getLogger("fxplan.runtime")
    handlers, propagate = list(runtime.handlers), runtime.propagate
    with caplog.at_level(logging.WARNING):
        try:
            for rank in (0, 1):
                quiet_runtime_log(rank)
                record_fallback(None, f"[here] a line rank {rank} logs")
        finally:
            runtime.handlers[:], runtime.propagate = handlers, propagate
    assert caplog.messages == ["fxplan runtime fallback: [here] a line rank 0 logs"]
