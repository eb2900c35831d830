"""``fxplan launch`` run by the CLI's own :func:`fxplan.cli.main.main` inside the test process.

A launch test that starts ``python -m fxplan.cli.main launch`` pays for one more Python start-up
and import of torch and fxplan (about 4 CPU-seconds on the 2-core test machine) before torchrun
starts; the launcher itself only checks the plan and runs torchrun. Here the verb runs in the
test process, already warm, and torchrun and its workers are real processes as before. Their
output reaches the test through pytest's ``capfd`` (file-descriptor capture), returned as a
:class:`subprocess.CompletedProcess` like the subprocess call it replaces.

Hang guard (what the subprocess timeout was): after ``timeout`` seconds a ``SIGALRM`` raises
``SIGINT`` in this process, which the launch verb handles as a Ctrl-C (torchrun is interrupted,
or the supervisor ends every process of the attempt), and the call fails with
:class:`TimeoutError`.

:func:`one_rank` is the reference run of a one-device plan: the worker ``fxplan launch`` would
start, with the worker arguments the launch verb builds, run directly as rank 0 of a
one-process gloo group — no torchrun agent to start for one process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any, Mapping


def launch_here(capfd: Any, *args: str, env: Mapping[str, str] | None = None,
                timeout: int = 300) -> subprocess.CompletedProcess:
    """``fxplan launch ARGS`` in this process with ``env`` (default: this process's) as the
    environment; its exit status (``SystemExit``'s code where argparse refuses a flag) and
    everything written to stdout and stderr meanwhile."""
    from fxplan.cli.main import main

    fired: list[bool] = []

    def interrupt(_signum: int, _frame: object) -> None:
        fired.append(True)
        signal.raise_signal(signal.SIGINT)

    capfd.readouterr()  # what came before is not this launch's
    saved = dict(os.environ)
    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.alarm(timeout)
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        code = main(["launch", *args])
    except SystemExit as exit_:  # argparse refuses a flag as the command line would: status 2
        code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        os.environ.clear()
        os.environ.update(saved)
    out, err = capfd.readouterr()
    if fired:
        raise TimeoutError(f"fxplan launch {' '.join(args)}: no end in {timeout} s\n"
                           f"{out[-3000:]}\n{err[-3000:]}")
    return subprocess.CompletedProcess(["fxplan", "launch", *args], code, out, err)


def one_rank(launch_args: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    """The worker of ``fxplan launch LAUNCH_ARGS`` (its argv built by the launch verb's own
    :func:`fxplan.cli.torchrun_command.worker_command`) run as rank 0 of a one-process gloo
    group, with the thread count ``fxplan launch`` gives a CPU rank."""
    from fxplan.cli.launch_checks import settings_for
    from fxplan.cli.main import parse_args
    from fxplan.cli.torchrun_command import worker_command
    from fxplan.core.loopback import free_loopback_port

    args = parse_args(["launch", *launch_args])
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_loopback_port()), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *worker_command(args, settings_for(args))],
                          capture_output=True, text=True, timeout=timeout, env=env)
