"""A run directory belongs to one run at a time and is never overwritten without being asked.

``fxplan launch`` claims ``--run-dir`` before any process starts (:func:`claim_run_dir`):

* it must be a directory it can write: a regular file or a directory without write permission
  is refused with what it is;
* it is locked: ``RUN_DIR/.fxplan-launch.lock`` held with ``flock`` by the launcher for the
  whole run (every attempt of ``--max-restarts``). A second launch into the same directory is
  refused with the holder's pid, host and start time. The kernel drops the lock when the
  launcher's process ends, however it ends, so a crashed launch leaves nothing to clean up; the
  file stays (removing it would let a third launch lock a new file while the second still
  holds the old one). On a multi-node launch each node's launcher locks its own file
  (``.fxplan-launch.lock.<host>``): the nodes of one run share the directory;
* a directory that holds a previous run (any of :data:`RUN_FILES`) is refused unless
  ``--resume`` (go on from its newest checkpoint; ``metrics.jsonl`` keeps the steps up to it)
  or ``--overwrite`` (the previous run's files, and only those, are removed first) is given.
  A supervised launch (``--max-restarts``/``--elastic``) of a directory holding a committed
  checkpoint resumes it (:func:`fxplan.cli.elastic.resume_newest`): a requeued job goes on.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import time
from pathlib import Path
from typing import IO, Iterator

from fxplan.cli.run_config import LaunchError
from fxplan.core.files import not_regular

__all__ = ["LOCK", "RUN_FILES", "claim_run_dir", "previous_run"]

LOCK = ".fxplan-launch.lock"
#: What a run writes into its directory (``fxplan.worker``, the supervisor, the replan).
RUN_FILES = ("metrics.jsonl", "summary.json", "run_config.json", "events.jsonl", "checkpoints",
             "plans", "trace")


def previous_run(run_dir: Path) -> list[str]:
    """The entries of :data:`RUN_FILES` present in ``run_dir`` (an empty ``checkpoints/`` or
    ``plans/`` counts as nothing), each with what it holds."""
    found = []
    for name in RUN_FILES:
        path = run_dir / name
        if path.is_dir():
            inside = sorted(p.name for p in path.iterdir())
            if inside:
                shown = ", ".join(inside[:3]) + (" …" if len(inside) > 3 else "")
                found.append(f"{name}/ ({shown})")
        elif path.exists():
            if name == "metrics.jsonl":
                lines = sum(1 for line in path.read_bytes().splitlines() if line.strip())
                found.append(f"{name} ({lines} line{'s' if lines != 1 else ''})")
            else:
                found.append(name)
    return found


def _writable(run_dir: Path) -> None:
    """Refuse a path that is no directory or one this user cannot write (checked by creating
    the directory and a file in it)."""
    kind = not_regular(run_dir)
    if run_dir.is_file() or kind:
        raise LaunchError(f"--run-dir {run_dir} is {kind or 'a regular file'}: expected a "
                          "directory (created if missing) for metrics.jsonl, summary.json and "
                          "checkpoints/; give another path")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".fxplan-write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise LaunchError(f"--run-dir {run_dir} cannot be written ({err.strerror or err}): a "
                          "run writes its metrics and checkpoints there; give a directory you "
                          "can write") from None


def _lock(run_dir: Path, per_host: bool) -> IO[str]:
    """The locked lock file, or :class:`LaunchError` naming the launch that holds it."""
    name = f"{LOCK}.{socket.gethostname()}" if per_host else LOCK
    handle = open(run_dir / name, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise LaunchError(f"--run-dir {run_dir} is in use by another fxplan launch ({holder}): "
                          "a run directory belongs to one run at a time; wait for that run to "
                          "end, or give another --run-dir") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()} since "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    handle.flush()
    return handle


@contextlib.contextmanager
def claim_run_dir(run_dir: str | Path, *, resume: bool, overwrite: bool,
                  per_host: bool = False) -> Iterator[Path]:
    """Hold ``run_dir`` for one launch (module docstring); ``resume``: the launch goes on from
    a checkpoint (``--resume``), ``overwrite``: ``--overwrite``."""
    run_dir = Path(run_dir)
    if resume and overwrite:
        raise LaunchError("--resume and --overwrite: one goes on with the run directory, the "
                          "other starts it afresh; give one")
    _writable(run_dir)
    handle = _lock(run_dir, per_host)
    try:
        found = previous_run(run_dir)
        if found and overwrite:
            for name in RUN_FILES:
                path = run_dir / name
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                elif path.exists() or path.is_symlink():
                    path.unlink()
            print(f"--overwrite: removed the previous run's {', '.join(found)} from {run_dir}",
                  flush=True)
        elif found and not resume:
            raise LaunchError(
                f"--run-dir {run_dir} holds a previous run ({'; '.join(found)}): it is not "
                "overwritten without being asked. Give --resume to go on from its newest "
                "checkpoint, --overwrite to remove that run's files and start afresh, or "
                "another --run-dir")
        yield run_dir
    finally:
        handle.close()  # releases the lock
