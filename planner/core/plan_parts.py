"""The pieces of a :class:`~fxplan.core.plan.Plan` besides its config and placements: the
device mesh's axes, the pipeline stages' layer ranges, the solver's status, the plan file's
format version and the error for a bad plan.

The mesh is ``pp × dp × tp`` (:data:`MESH_AXES`, slowest first), so rank
``r = (pp_i · dp + dp_i) · tp + tp_i``. A plan with ``pp`` pipeline ranks and ``v`` virtual
stages per rank has ``pp · v`` :class:`StageAssignment` s; stage ``i`` runs on pipeline rank
``i mod pp`` and holds repeated blocks ``[start_i, stop_i)`` with ``start_0 = 0``,
``start_{i+1} = stop_i`` (:func:`check_stage_ranges`).
"""

from __future__ import annotations

from dataclasses import dataclass

from fxplan.core.errors import UserError

__all__ = ["MESH_AXES", "PLAN_FORMAT_VERSION", "PlanError", "SolverInfo", "StageAssignment",
           "check_stage_ranges"]

#: Version 2: ``config`` is one :class:`ParallelConfig` (text form), placements a typed map.
PLAN_FORMAT_VERSION = 2

#: The device mesh's axes, slowest first: ``rank = (pp_i · dp + dp_i) · tp + tp_i``.
MESH_AXES: tuple[str, ...] = ("pp", "dp", "tp")


class PlanError(UserError):
    """A plan file that is malformed, from another version, or for another model/cluster."""


@dataclass(frozen=True)
class StageAssignment:
    """Pipeline stage ``index`` runs repeated blocks ``layers[0] … layers[1]-1``.

    With an interleaved or zero-bubble schedule there are ``pp · v`` stages; stage ``i`` runs
    on pipeline rank ``i mod pp`` (under ``zbv`` on the V's rank,
    :meth:`~fxplan.core.schedule.Schedule.placement`).
    """

    index: int
    layers: tuple[int, int]
    has_embedding: bool = False
    has_head: bool = False

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]


@dataclass(frozen=True)
class SolverInfo:
    """The intra-op solver's run: its backend, status, relative optimality gap and time."""

    backend: str = "none"
    status: str = "not-run"  # optimal | feasible | time-limit | not-run
    gap: float = 0.0
    time_s: float = 0.0


def check_stage_ranges(stages: tuple[StageAssignment, ...]) -> None:
    """Stages numbered 0, 1, … in order, holding non-empty, contiguous layer ranges from layer
    0; the embedding on the first stage only and the head on the last only."""
    start = 0
    last = len(stages) - 1
    for i, stage in enumerate(stages):
        if stage.index != i:
            raise PlanError(f"stages[{i}].index is {stage.index}, expected {i}")
        a, b = stage.layers
        if a != start or b < a or (b == a and last > 0):
            raise PlanError(f"stages[{i}].layers is [{a}, {b}], expected [{start}, stop] with "
                            f"stop > {start} (stages hold contiguous, non-empty layer ranges "
                            "from layer 0)")
        start = b
        if stage.has_embedding != (i == 0) or stage.has_head != (i == last):
            raise PlanError(f"stages[{i}]: has_embedding={stage.has_embedding}, has_head="
                            f"{stage.has_head}; expected the embedding on stage 0 and the head "
                            f"on stage {last} only")
