"""What a training run logs: throughput, FLOP rate, MFU and memory per step, and the summary.

With ``T`` the step time (wall clock of one optimizer step, forward + backward + clipping +
update, the slowest rank's), ``n`` ranks, ``B·s`` tokens in the global batch, and the FLOPs of
one step as the plan's estimate counts them (:mod:`fxplan.cost_model.step.estimate`: matrix products
only, ``M`` forward FLOPs of the global batch, ``M_r`` those the backward recomputes)::

    tokens_per_s_per_device = B·s / (n·T)
    tflops_per_device       = (3·M + M_r) / (n·T) / 1e12     hardware FLOPs: recompute counted
    mfu                     = 3·M / (n·T·P)                   model FLOPs: recompute not counted

``P`` is the device's dense peak FLOP/s for the training dtype (the cluster's device group,
``peak_tflops``). These are the definitions the estimate uses for its own ``tflops_per_device``
and ``mfu``, so measured and predicted compare directly.

Peak memory per rank: on CUDA ``torch.cuda.max_memory_allocated`` (the caching allocator's
peak of live tensors); on CPU the process's peak resident set size (``getrusage`` max RSS),
which includes the Python interpreter and torch's libraries (≈ 0.3 GiB here) — an upper bound
on what the model needs. The logged value is the largest over ranks; ``memory_pct`` divides it
by the device capacity the planner used (``capacity_gib`` of the plan's estimate).
"""

from __future__ import annotations

import json
import math
import resource
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import torch

from fxplan.runtime.train.events import read_json_lines

__all__ = ["GIB", "FlopCounts", "StepMetrics", "MetricsLog", "memory_measured_as",
           "peak_memory_gib", "peak_reserved_gib"]

GIB = 2**30


def peak_memory_gib(device: torch.device) -> float:
    """This process's peak memory (module docstring for what is measured)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


def peak_reserved_gib(device: torch.device) -> float | None:
    """The CUDA caching allocator's peak reserved memory (``max_memory_reserved``: what the
    process took from the driver for tensors); ``None`` on CPU, which has no such allocator."""
    if device.type == "cuda":
        return torch.cuda.max_memory_reserved(device) / GIB
    return None


def memory_measured_as(device: torch.device) -> str:
    """What :func:`peak_memory_gib` measures on ``device``, in words."""
    if device.type == "cuda":
        return "torch.cuda.max_memory_allocated"
    return "peak resident set size of the process (getrusage)"


@dataclass(frozen=True)
class FlopCounts:
    """FLOPs of one global step and the peak they are measured against."""

    model_flops: float       # 3·M
    hardware_flops: float    # 3·M + M_r
    peak_flops_per_device: float  # P, FLOP/s
    devices: int             # n

    def tflops_per_device(self, step_time_s: float) -> float:
        return self.hardware_flops / (self.devices * step_time_s) / 1e12

    def mfu(self, step_time_s: float) -> float:
        return self.model_flops / (self.devices * step_time_s * self.peak_flops_per_device)


@dataclass(frozen=True)
class StepMetrics:
    """One logged step (a line of ``metrics.jsonl``)."""

    step: int
    loss: float
    grad_norm: float
    lr: float
    step_time_s: float
    tokens_per_s_per_device: float
    tflops_per_device: float | None
    mfu: float | None
    peak_memory_gib: float
    memory_pct: float | None

    @classmethod
    def make(cls, *, step: int, loss: float, grad_norm: float, lr: float, step_time_s: float,
             tokens: int, devices: int, flops: FlopCounts | None, peak_memory_gib: float,
             capacity_gib: float | None) -> "StepMetrics":
        return cls(
            step=step, loss=loss, grad_norm=grad_norm, lr=lr, step_time_s=step_time_s,
            tokens_per_s_per_device=tokens / (devices * step_time_s),
            tflops_per_device=None if flops is None else flops.tflops_per_device(step_time_s),
            mfu=None if flops is None else flops.mfu(step_time_s),
            peak_memory_gib=peak_memory_gib,
            memory_pct=None if not capacity_gib else 100 * peak_memory_gib / capacity_gib,
        )

    def line(self) -> str:
        tflops = "n/a" if self.tflops_per_device is None else f"{self.tflops_per_device:.4f}"
        mfu = "n/a" if self.mfu is None else f"{100 * self.mfu:.2f}%"
        pct = "" if self.memory_pct is None else f" ({self.memory_pct:.1f}%)"
        return (f"step {self.step:>5}  loss {self.loss:.4f}  grad_norm {self.grad_norm:.3f}  "
                f"lr {self.lr:.3e}  time {self.step_time_s * 1e3:.1f} ms  "
                f"tokens/s/device {self.tokens_per_s_per_device:.1f}  TFLOP/s/device {tflops}  "
                f"MFU {mfu}  peak mem {self.peak_memory_gib:.3f} GiB{pct}")


class MetricsLog:
    """Rank 0's log: ``metrics.jsonl`` in the run directory, and lines or a progress bar.

    On a terminal the bar (``[#####.....] step/total``, the last loss and step time) is
    redrawn after every step and each logged step is printed above it; otherwise only the
    logged steps are printed, one plain line each."""

    def __init__(self, run_dir: str | Path, total_steps: int, stream: IO[str] | None = None,
                 *, resume_after: int | None = None) -> None:
        """``resume_after=N`` (a run resumed after step ``N``): ``metrics.jsonl`` keeps its
        lines of steps ≤ N (those after N, logged before an interruption, are dropped: they
        are run again; so is a line cut by a kill or a full disk) and the new steps are
        appended; otherwise it starts empty."""
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        kept = ""
        if resume_after is not None and self.path.is_file():
            kept = "".join(line + "\n" for line in read_json_lines(self.path)
                           if json.loads(line).get("step", 0) <= resume_after)
        self.path.write_text(kept)
        self.total = total_steps
        self.stream = stream or sys.stdout
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._bar_shown = False

    def print(self, text: str) -> None:
        self._clear_bar()
        print(text, file=self.stream, flush=True)

    def log(self, metrics: StepMetrics) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps(_finite(asdict(metrics))) + "\n")
        self.print(metrics.line())

    def progress(self, step: int, loss: float, step_time_s: float) -> None:
        if not self.tty:
            return
        width = 30
        done = int(width * step / self.total)
        bar = "#" * done + "." * (width - done)
        self.stream.write(f"\r[{bar}] {step}/{self.total}  loss {loss:.4f}  "
                          f"{step_time_s * 1e3:.1f} ms/step")
        self.stream.flush()
        self._bar_shown = True

    def _clear_bar(self) -> None:
        if self._bar_shown:
            self.stream.write("\r\033[K")
            self._bar_shown = False

    def close(self) -> None:
        if self._bar_shown:
            self.stream.write("\n")
            self.stream.flush()
            self._bar_shown = False

    def write_json(self, name: str, data: dict[str, Any]) -> Path:
        path = self.dir / name
        path.write_text(json.dumps(_finite(data), indent=2) + "\n")
        return path


def _finite(data: Any) -> Any:
    """JSON has no NaN or infinity: those become ``null`` (a diverged loss stays visible as
    ``null`` in the file and as ``nan`` in the printed line)."""
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    if isinstance(data, float) and not math.isfinite(data):
        return None
    return data
