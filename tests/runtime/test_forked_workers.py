"""Ranks forked from one server that imported torch (``fxplan.runtime.launch.forked_workers``):
which launches fork, what a forked rank runs, and a real launch either way training alike."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fxplan.runtime.launch import forked_workers
from fxplan.runtime.launch.forked_workers import FORK_ENV, forks_workers, run_module
from processes import descendants

WORKER = ("-u", "-m", "fxplan.worker", "plan.json", "--steps", "3")


def test_only_this_pythons_fxplan_worker_is_forked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FORK_ENV, raising=False)
    assert forks_workers(sys.executable, WORKER)
    assert forks_workers(sys.executable, ("-u", "-m", "fxplan.calibration.collectives_worker"))
    assert not forks_workers(sys.executable, ("-u", "-m", "my_trainer", "--steps", "3"))
    assert not forks_workers(sys.executable, ("-u", "-m"))
    assert not forks_workers(sys.executable, ("-u", "train.py"))
    assert not forks_workers("/usr/bin/python3-other", WORKER)
    assert not forks_workers(print, WORKER)          # a function entry point stays as it is
    monkeypatch.setenv(FORK_ENV, "0")
    assert not forks_workers(sys.executable, WORKER)
    monkeypatch.delenv(FORK_ENV)
    monkeypatch.setattr(forked_workers, "_cuda_devices", lambda: True)  # CUDA ranks: exec'd
    assert not forks_workers(sys.executable, WORKER)


def test_the_server_starts_before_torch_only_where_a_fork_is_sure(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The agent starts its ranks' server first thing only for ``-m`` a forked module, with
    forking on, ``OMP_NUM_THREADS`` set and no GPU device node; anything else waits for the
    first rank, as before (``forked_workers.early_start_applies``)."""
    agent = ["--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d",
             "--rdzv-endpoint=127.0.0.1:29500", "--local-addr=127.0.0.1"]
    monkeypatch.delenv(FORK_ENV, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(forked_workers, "GPU_DEVICE_NODES", (str(tmp_path / "no-such-node"),))
    applies = forked_workers.early_start_applies
    assert applies([*agent, "-m", "fxplan.worker", "plan.json", "--steps", "3"])
    assert applies([*agent, "--module", "fxplan.calibration.collectives_worker"])
    assert not applies([*agent, "-m", "my_trainer", "fxplan.worker"])
    assert not applies([*agent, "train.py", "-m", "fxplan.worker"])   # the script's own -m
    assert not applies([*agent, "--no-python", "-m", "fxplan.worker"])
    assert not applies([*agent, "--run-path", "-m", "fxplan.worker"])
    assert not applies([*agent, "-m"])
    worker = [*agent, "-m", "fxplan.worker", "plan.json"]
    monkeypatch.setenv(FORK_ENV, "0")
    assert not applies(worker)
    monkeypatch.delenv(FORK_ENV)
    monkeypatch.delenv("OMP_NUM_THREADS")       # torchrun would set it after the server started
    assert not applies(worker)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    (tmp_path / "nvidiactl").touch()            # a GPU machine: torch decides, later
    monkeypatch.setattr(forked_workers, "GPU_DEVICE_NODES", (str(tmp_path / "nvidiactl"),))
    assert not applies(worker)
    assert not forked_workers.start_server_early(worker)


@pytest.mark.parametrize("code", [0, 2, 3])
def test_a_forked_rank_runs_the_module_as_python_m_does(tmp_path: Path, code: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_module`` runs the module as ``__main__`` with ``sys.argv`` as ``-m`` gives it, and the
    module's ``raise SystemExit(main())`` ends the process with that code."""
    (tmp_path / "fake_rank.py").write_text(
        "import json, sys\n"
        "def main():\n"
        "    open(sys.argv[-1], 'w').write(json.dumps([__name__, sys.argv[1:]]))\n"
        f"    return {code}\n"
        "if __name__ == '__main__':\n"
        "    raise SystemExit(main())\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    frozen: list[bool] = []   # the rank's inherited heap is frozen (not this test process's)
    monkeypatch.setattr(forked_workers.gc, "freeze", lambda: frozen.append(True))
    out = tmp_path / "seen.json"
    with pytest.raises(SystemExit) as ended:
        run_module("fake_rank", "--steps", "3", str(out))
    assert ended.value.code == code and frozen == [True]
    assert json.loads(out.read_text()) == ["__main__", ["--steps", "3", str(out)]]


def test_the_launch_wrapper_swaps_only_the_worker_entry_point(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What torchrun's ``elastic_launch`` receives: ``run_module`` with the worker's module and
    arguments under the forkserver, anything else unchanged."""
    monkeypatch.delenv(FORK_ENV, raising=False)
    calls: list[tuple[object, object, tuple[str, ...]]] = []

    class Config:
        start_method = "spawn"

    def elastic_launch(config: Config, entrypoint: object):  # torch's signature, by keyword
        return lambda *args: calls.append((config.start_method, entrypoint, args))

    preload: list[list[str]] = []
    monkeypatch.setattr(forked_workers.multiprocessing, "set_forkserver_preload", preload.append)
    launch = forked_workers.forking_elastic_launch(elastic_launch)
    launch(config=Config(), entrypoint=sys.executable)(*WORKER)
    launch(config=Config(), entrypoint=sys.executable)("-u", "train.py")
    assert calls == [("forkserver", run_module, WORKER[2:]),
                     ("spawn", sys.executable, ("-u", "train.py"))]
    assert preload == [forked_workers.PRELOAD]


def test_the_preloaded_modules_import_and_leave_the_ranks_modules_to_run_as_main() -> None:
    """In a fresh interpreter, as the server: every module of ``PRELOAD`` imports (the server
    skips one that fails, silently), and none of them imports a rank's own module, which
    runpy would otherwise find in ``sys.modules`` and warn about on every rank."""
    code = ("import importlib, sys\n"
            "from fxplan.runtime.launch.forked_workers import PRELOAD, FORKED_MODULES\n"
            "for name in PRELOAD:\n"
            "    importlib.import_module(name)\n"
            "print(sorted(FORKED_MODULES & set(sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]", done.stdout


def _plan(tmp_path: Path) -> Path:
    from fxplan import search

    plan = search("gpt-tiny:dropout=0,seq=16", "local-cpu:devices=2", batch=4, seq=16,
                  progress=False, constraints={"pp": 1, "tp": 1})
    return plan.save(tmp_path / "plan.json")


def _rank_commands(pid: int) -> set[str]:
    """The command lines of the processes below ``pid``."""
    lines = set()
    for child in descendants(pid) - {pid}:
        try:
            lines.add(Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return lines


@pytest.mark.multirank
def test_a_launch_trains_alike_with_forked_and_started_ranks(tmp_path: Path) -> None:
    """Two real launches of one dp=2 plan: with the ranks forked from the server (the default)
    and with ``FXPLAN_FORK_WORKERS=0`` (one interpreter per rank). Both end with code 0, seen
    while running as a forkserver's children and as ``python -u -m fxplan.worker`` processes, and log the
    same losses."""
    from rt_trainer_cases import make_token_file

    plan = _plan(tmp_path)
    tokens = make_token_file(str(tmp_path / "tokens.bin"))
    losses, seen = {}, {}
    for fork in ("1", "0"):
        run_dir = tmp_path / f"run{fork}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "fxplan.cli.main", "launch", str(plan), "--data", tokens,
             "--steps", "3", "--optimizer", "sgd", "--lr", "0.3", "--run-dir", str(run_dir)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, FORK_ENV: fork})
        commands: set[str] = set()
        while proc.poll() is None:
            commands |= _rank_commands(proc.pid)
            time.sleep(0.1)
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, out[-3000:] + err[-3000:]
        seen[fork] = commands
        losses[fork] = [json.loads(line)["loss"]
                        for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("multiprocessing.forkserver" in line for line in seen["1"]), seen["1"]
    assert not any("-u -m fxplan.worker" in line for line in seen["1"]), seen["1"]
    assert any("-u -m fxplan.worker" in line for line in seen["0"]), seen["0"]
    assert len(losses["1"]) == 3 and losses["1"] == losses["0"]
