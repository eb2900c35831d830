"""The driver the published-table benchmarks share (``megatron_table.py``, ``h100_table.py``).

Each of those scripts compares :func:`fxplan.cost_model.step.estimate` with a published table of
Megatron runs. What a published row leaves out — the microbatch size, the interleaving and
(for the H100 table) the recompute policy — is chosen by the same rule in both:

- interleaving ``v`` (:func:`chunk_choices`): every ``v`` (up to the script's
  ``max_chunks``, or ``l/p`` where it sets none) with ``l`` divisible by ``p·v``, when the
  microbatch count ``B/(d·mb)`` is a multiple of ``p`` (Megatron's interleaved schedule
  requires both); else ``v = 1``, the plain 1F1B schedule;
- interleaving, microbatch size and recompute (:func:`fastest_fit`): the fastest estimate
  that fits in memory over those candidates.

A row is any object with ``layers tp pp dp batch`` and ``implied_step_time_s`` (the step
time ``F/(n·X)`` its published TFLOP/s per GPU ``X`` imply); the scripts define their own
(their FLOP conventions differ).

Run as ``python benchmarks/<name>.py`` this folder is on ``sys.path``; the tests load the
scripts by file path, and the scripts put their own folder on ``sys.path`` to import this one.
"""

from __future__ import annotations

import csv
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

__all__ = ["Prediction", "chunk_choices", "fastest_fit", "read_rows", "with_matmul_efficiency"]

R = TypeVar("R")


def read_rows(path: Path, make: Callable[[dict[str, str]], R]) -> list[R]:
    """Every row of the CSV file ``path``, as ``make(row as a dict of strings)``."""
    with path.open() as handle:
        return [make(record) for record in csv.DictReader(handle)]


def with_matmul_efficiency(cluster: Any, efficiency: float) -> Any:
    """``cluster`` with every device group's ``compute_efficiency.matmul`` set to
    ``efficiency`` (a what-if of the probes; the overrides syntax reaches no nested key)."""
    from fxplan.cluster_specs import Cluster

    spec = cluster.to_dict()
    for group in spec["device_groups"]:
        group.setdefault("compute_efficiency", {})["matmul"] = efficiency
    return Cluster.from_dict(spec, source=f"{cluster.name} with matmul {efficiency:g}")


def chunk_choices(row: Any, microbatches: int, max_chunks: int | None) -> tuple[int, ...]:
    """The interleavings ``v`` the rule of the module docstring tries, in increasing order;
    ``max_chunks=None``: up to one layer per virtual stage (``v = l/p``, Megatron-Core's
    ``--num-layers-per-virtual-pipeline-stage 1``)."""
    if row.pp == 1 or microbatches % row.pp:
        return (1,)
    top = max_chunks if max_chunks is not None else row.layers // row.pp
    return tuple(v for v in range(1, top + 1) if row.layers % (row.pp * v) == 0)


@dataclass(frozen=True)
class Prediction:
    """The fastest fitting estimate of one published row and the choices that gave it;
    ``seconds`` is how long the ``estimates`` (the candidates priced) took."""

    row: Any
    microbatch: int
    chunks: int
    recompute: str
    estimate: Any
    seconds: float
    estimates: int

    @property
    def error(self) -> float:
        """(predicted − published) / published step time."""
        return self.estimate.step_time_s / self.row.implied_step_time_s - 1

    @property
    def error_points(self) -> float:
        """Predicted − published MFU in percentage points (rows with a published ``mfu``)."""
        return (self.estimate.mfu - self.row.mfu) * 100


def fastest_fit(row: Any, price: Callable[[Any], Any], *, microbatches: Iterable[int],
                max_chunks: int | None, recompute: Iterable[str] = ("full",),
                **fields: Any) -> Prediction:
    """Estimate ``row`` for each microbatch size in ``microbatches`` (those dividing
    ``B/d``), each policy in ``recompute`` and each ``v`` of :func:`chunk_choices`, and keep
    the fastest that fits. ``price(config)`` returns the estimate of a
    :class:`~fxplan.core.config.ParallelConfig`; ``fields`` are its fields beyond the
    degrees, microbatch, schedule and recompute (``zero_stage=1``, …)."""
    from fxplan.core.schedule import Schedule
    from fxplan.cost_model import ParallelConfig

    best, priced = None, 0
    start = time.perf_counter()
    for policy in recompute:
        for mb in microbatches:
            if row.batch % (row.dp * mb):
                continue
            for v in chunk_choices(row, row.batch // (row.dp * mb), max_chunks):
                schedule = Schedule("interleaved", v) if v > 1 else Schedule("1f1b")
                config = ParallelConfig(dp=row.dp, tp=row.tp, pp=row.pp, microbatch_size=mb,
                                        schedule=schedule, recompute=policy, **fields)
                result, priced = price(config), priced + 1
                if result.fits and (best is None or result.step_time_s < best[3].step_time_s):
                    best = (mb, v, policy, result)
    if best is None:
        raise RuntimeError(f"{row}: no interleaving, microbatch size and recompute policy fits")
    return Prediction(row, *best, time.perf_counter() - start, priced)
