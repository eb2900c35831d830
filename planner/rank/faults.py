"""Faults injected into a rank for tests (``FXPLAN_FAULT``): killed, stopped or its file size
capped at a given step."""

from __future__ import annotations

import os

__all__ = ["FAULT_ENV", "FAULT_FILE_BYTES", "inject_fault"]


#: ``FXPLAN_FAULT=WHERE:RANK:STEP:ATTEMPT[:ACTION]`` (tests only): at step STEP of attempt
#: ATTEMPT, after the update (``step``) or as the checkpoint save begins (``save``), rank RANK
#: does ACTION: ``kill`` (default) SIGKILLs itself as a failing node would; ``stop`` SIGSTOPs
#: itself as a hung rank would; ``fsize`` caps the size of any file it writes from then on at
#: :data:`FAULT_FILE_BYTES` (``RLIMIT_FSIZE``, ``SIGXFSZ`` ignored: a write past it fails with
#: ``EFBIG``, as a write to a full disk fails with ``ENOSPC``).
FAULT_ENV = "FXPLAN_FAULT"


FAULT_FILE_BYTES = 4096


def inject_fault(step: int, rank: int, attempt: int, where: str) -> None:
    """Test fault injection (:data:`FAULT_ENV`)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    at, *fields = spec.split(":")
    action = fields.pop() if len(fields) == 4 else "kill"
    if at != where or [int(n) for n in fields] != [rank, step, attempt]:
        return
    import signal

    what = {"kill": "kills itself", "stop": "stops itself", "fsize": "caps its file size"}
    print(f"{FAULT_ENV}: rank {rank} {what[action]} at step {step} ({where}) of attempt "
          f"{attempt}", flush=True)
    if action == "fsize":
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (FAULT_FILE_BYTES, FAULT_FILE_BYTES))
    else:
        os.kill(os.getpid(), signal.SIGSTOP if action == "stop" else signal.SIGKILL)
