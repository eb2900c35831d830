"""``fxplan validate``: a plan launched for a few steps, its predictions against the measurements.

The plan runs under ``fxplan launch`` (real torchrun, nccl on GPUs, gloo on CPU ranks) on
synthetic data (or the data ``--data`` names) for ``steps`` steps; the first ``warmup`` steps
are not timed. Per rank ``r`` of pipeline stage ``s(r) = ⌊r / (world/pp)⌋``:

* **step time** — predicted: the plan's ``step_time_s`` (one optimizer step, the same on every
  rank); measured: the median of the rank's own step times after the warm-up (wall clock of
  forward, backward, clipping and update, the device synchronised).
* **peak memory** — on CUDA two figures, each against its counterpart in the stage's memory
  breakdown (``memory_breakdown_gib``): *allocated* (``max_memory_allocated``) against the
  tensors the model prices, ``total − cuda_context − nccl − fragmentation − reserved``, and
  *reserved* (``max_memory_reserved``, what the caching allocator took) against those tensors
  plus the allocator's ``fragmentation``. The CUDA context and NCCL buffers are outside the
  allocator; ``fxplan calibrate`` measures them. On CPU one figure: the process's peak
  resident set against the stage's whole ``total`` (interpreter, torch and gloo are the spec's
  ``reserved`` process baseline).

``error = predicted / measured − 1``. The validation fails (exit 1) when any rank's step-time
error exceeds ``tolerance`` or a memory error exceeds ``memory_tolerance`` in magnitude.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from fxplan.calibration.collectives import CalibrationError
from fxplan.core.plan import Plan

__all__ = ["RankCheck", "Validation", "compare", "launch", "read_losses"]


@dataclass(frozen=True)
class RankCheck:
    """Predicted against measured for one rank (``None`` where a figure does not apply)."""

    rank: int
    stage: int
    predicted_step_s: float
    measured_step_s: float
    predicted_memory_gib: float
    measured_memory_gib: float
    predicted_reserved_gib: float | None = None
    measured_reserved_gib: float | None = None

    @staticmethod
    def _error(predicted: float | None, measured: float | None) -> float | None:
        if predicted is None or measured is None or measured <= 0:
            return None
        return predicted / measured - 1.0

    @property
    def step_error(self) -> float:
        return self._error(self.predicted_step_s, self.measured_step_s) or 0.0

    @property
    def memory_error(self) -> float:
        return self._error(self.predicted_memory_gib, self.measured_memory_gib) or 0.0

    @property
    def reserved_error(self) -> float | None:
        return self._error(self.predicted_reserved_gib, self.measured_reserved_gib)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "step_error": self.step_error, "memory_error": self.memory_error,
                "reserved_error": self.reserved_error}


@dataclass
class Validation:
    """A validation run: per-rank checks, the loss curve and the verdict."""

    plan: str
    device: str
    memory_measured_as: str
    steps: int
    warmup: int
    tolerance: float
    memory_tolerance: float
    ranks: list[RankCheck] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)

    @property
    def failures(self) -> list[str]:
        """What is off by more than the tolerances, one line each (empty: passed)."""
        out = []
        for r in self.ranks:
            if abs(r.step_error) > self.tolerance:
                out.append(f"rank {r.rank}: step time off by {r.step_error:+.1%} "
                           f"(tolerance ±{self.tolerance:.0%})")
            for what, err in (("peak memory", r.memory_error), ("reserved memory", r.reserved_error)):
                if err is not None and abs(err) > self.memory_tolerance:
                    out.append(f"rank {r.rank}: {what} off by {err:+.1%} "
                               f"(tolerance ±{self.memory_tolerance:.0%})")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan, "device": self.device,
                "memory_measured_as": self.memory_measured_as, "steps": self.steps,
                "warmup": self.warmup, "tolerance": self.tolerance,
                "memory_tolerance": self.memory_tolerance,
                "ranks": [r.to_dict() for r in self.ranks], "losses": self.losses,
                "failures": self.failures, "passed": not self.failures}


def _stage_memory(plan: Plan, stage: int, cuda: bool) -> tuple[float, float | None]:
    """(predicted peak to compare, predicted allocator reserve or None) of ``stage``, GiB."""
    estimate = plan.estimate
    breakdowns: Sequence[Mapping[str, float]] = estimate.get("memory_breakdown_gib") or []
    peaks: Sequence[float] = estimate.get("peak_memory_gib") or []
    if stage < len(breakdowns):
        b = breakdowns[stage]
        total = float(b.get("total", peaks[stage] if stage < len(peaks) else math.nan))
        if not cuda:
            return total, None
        tensors = total - sum(float(b.get(k, 0.0)) for k in
                              ("cuda_context", "nccl", "fragmentation", "reserved"))
        return tensors, tensors + float(b.get("fragmentation", 0.0))
    if stage < len(peaks):
        return float(peaks[stage]), None
    raise CalibrationError(f"the plan's estimate has no memory for stage {stage}: re-plan it "
                           "with this fxplan (`fxplan plan … -o PLAN.json`)")


def compare(plan: Plan, summary: Mapping[str, Any], losses: Sequence[float], *, warmup: int,
            tolerance: float, memory_tolerance: float) -> Validation:
    """The per-rank comparison of a finished launch's ``summary.json`` (module docstring)."""
    ranks = summary.get("ranks") or []
    if not ranks:
        raise CalibrationError("the launch's summary.json has no per-rank measurements: it was "
                               "written by an older fxplan; launch the plan again")
    cuda = str(summary.get("memory_measured_as", "")).startswith("torch.cuda")
    predicted_step = float(plan.estimate["step_time_s"])
    per_stage = max(1, len(ranks) // max(1, plan.pp))
    out = Validation(plan.summary, "cuda" if cuda else "cpu", str(summary.get("memory_measured_as")),
                     int(summary.get("steps", 0)), warmup, tolerance, memory_tolerance,
                     losses=list(losses))
    for rank, row in enumerate(ranks):
        times = row["step_times_s"]
        timed = times[warmup:] or times[-1:]
        stage = min(rank // per_stage, plan.pp - 1)
        memory, reserve = _stage_memory(plan, stage, cuda)
        out.ranks.append(RankCheck(rank, stage, predicted_step, statistics.median(timed), memory,
                                   float(row["peak_memory_gib"]), reserve,
                                   row.get("peak_reserved_gib")))
    return out


def read_losses(run_dir: Path) -> list[float]:
    """The loss of every step in ``metrics.jsonl`` (a cut last line is skipped)."""
    losses = []
    path = run_dir / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else ():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "loss" in record:
            losses.append(float(record["loss"]))
    return losses


def launch(plan_path: Path, run_dir: Path, steps: int, extra: Sequence[str] = (),
           timeout_s: float | None = None, *, output_to_stderr: bool = False) -> dict[str, Any]:
    """``fxplan launch PLAN --steps N --run-dir DIR EXTRA…`` in a child process (``--data
    synthetic`` unless ``extra`` names the data; the launch's own output passed through, to
    stderr with ``output_to_stderr``, so that a JSON report owns stdout); its ``summary.json``."""
    data = [] if "--data" in extra else ["--data", "synthetic"]
    cmd = [sys.executable, "-m", "fxplan.cli.main", "launch", str(plan_path), *data,
           "--steps", str(steps), "--run-dir", str(run_dir), *extra]
    try:
        done = subprocess.run(cmd, timeout=timeout_s,
                              stdout=2 if output_to_stderr else None)   # file descriptor 2
    except subprocess.TimeoutExpired as err:
        raise CalibrationError(f"the validation launch did not finish in {timeout_s:.0f} s") from err
    summary = run_dir / "summary.json"
    if done.returncode != 0 or not summary.exists():
        raise CalibrationError(f"the validation launch of {plan_path} failed (exit "
                               f"{done.returncode}); its output above says why")
    return json.loads(summary.read_text())
