"""The answer of the intra-op search: placements per node and parameter, and their price."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from fxplan.core.placements import Partial, Placements, Replicate, Shard, format_placements
from fxplan.sharding.strategy import OpStrategy

__all__ = ["IntraOpSolution", "EdgeReshard"]


@dataclass(frozen=True)
class EdgeReshard:
    """A reshard the solver chose on a data edge (the runtime module that performs one is
    :class:`fxplan.passes.rewrite.reshard.Reshard`): the output of ``producer`` changes placements ``src → dst`` before operand ``operand``
    of ``consumer``; ``time_s`` per step (forward, and the gradient's way back)."""

    producer: str
    consumer: str
    operand: int
    src: Placements
    dst: Placements
    time_s: float

    @property
    def kinds(self) -> tuple[str, ...]:
        """Per mesh axis, the collective it takes (``-`` where the axis does not change)."""
        return tuple(_kind(a, b) for a, b in zip(self.src, self.dst))

    def __str__(self) -> str:
        return (f"{self.producer} → {self.consumer}[{self.operand}]: {format_placements(self.src)} → "
                f"{format_placements(self.dst)} ({', '.join(self.kinds)}; {self.time_s * 1e6:.1f} µs)")


def _kind(src: object, dst: object) -> str:
    if src == dst:
        return "-"
    if isinstance(src, Partial):
        return "all_reduce" if isinstance(dst, Replicate) else "reduce_scatter"
    if isinstance(dst, Replicate):
        return "all_gather"
    if isinstance(src, Shard) and isinstance(dst, Shard):
        return "all_to_all"
    return "local"


@dataclass(frozen=True)
class IntraOpSolution:
    """The chosen strategies and their predicted price.

    ``placements``: node name → :class:`OpStrategy` (operand placements, output placement);
    ``param_placements``: parameter name → compact placements such as ``"S(0)R"`` (a tied
    alias: the placement its module uses); :attr:`node_placements`: node name → output
    placements, compact. Seconds are per training step on one rank; ``memory_bytes`` per rank. ``status``:
    ``optimal`` or ``feasible`` (time limit), ``gap`` the relative optimality gap; ``fallbacks``
    lists the ops replicated for want of a rule. ``notes``: per node, what the rewrite must know
    (an interleaved weight layout, a masked vocabulary lookup); ``reshards``: every edge whose
    placements change; ``problem_size``: the problem before and after coarsening.
    """

    mesh: str
    placements: Mapping[str, OpStrategy]
    param_placements: Mapping[str, str]
    objective_s: float
    comm_s: float
    compute_s: float
    memory_bytes: float
    status: str
    gap: float
    backend: str
    fallbacks: tuple[str, ...]
    solve_time_s: float
    build_time_s: float = 0.0
    problem_size: str = ""
    notes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    reshards: tuple[EdgeReshard, ...] = ()

    @property
    def node_placements(self) -> dict[str, str]:
        return {name: format_placements(s.output) for name, s in self.placements.items()}

    def output_placement(self, node: str) -> str:
        return format_placements(self.placements[node].output)

    def input_placement(self, node: str, operand: int = 0) -> str:
        placements = self.placements[node].inputs[operand]
        return "-" if placements is None else format_placements(placements)

