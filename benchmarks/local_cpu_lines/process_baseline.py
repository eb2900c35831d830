"""The resident set of a rank before any model exists: the fixed part of its peak. The formulas are
in ``local_cpu_calibration.py``'s docstring."""

from __future__ import annotations

from fxplan.core.loopback import free_loopback_port

__all__ = ["process_baseline_gib"]


def process_baseline_gib() -> float:
    """Resident set of a process that imported torch and fxplan's runtime and joined a gloo
    group, before any model exists: the fixed part of a rank's peak (``ru_maxrss``), GiB."""
    import subprocess
    import sys

    code = ("import resource, torch, torch.distributed as dist, fxplan.worker, "
            "fxplan.runtime.apply.graph;"
            f"dist.init_process_group('gloo', init_method='tcp://127.0.0.1:{free_loopback_port()}', "
            "rank=0, world_size=1);"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1]) * 1024 / 2**30
