"""What a backend returns for a :class:`~fxplan.intra_op.problem.Problem`."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["SolverResult", "OPTIMAL", "FEASIBLE"]

OPTIMAL = "optimal"  # proven optimal (within the solver's gap tolerance)
FEASIBLE = "feasible"  # a feasible choice, optimality not proven (time limit)


@dataclass(frozen=True)
class SolverResult:
    """One strategy index per problem node, priced exactly by ``Problem.evaluate``.

    ``bound`` is the best proven lower bound on the optimum; ``gap`` is
    ``(objective − bound) / max(|objective|, tiny)`` (0 when proven optimal).
    """

    choice: tuple[int, ...]
    objective: float
    memory: float
    bound: float
    status: str
    backend: str
    solve_time_s: float

    @property
    def gap(self) -> float:
        if self.status == OPTIMAL:
            return 0.0
        if not math.isfinite(self.bound):
            return math.inf
        return max(0.0, self.objective - self.bound) / max(abs(self.objective), 1e-30)
