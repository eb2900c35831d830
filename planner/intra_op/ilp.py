r"""The intra-op placement integer program (one-hot strategies, one-hot edges).

Given a :class:`~fxplan.intra_op.problem.Problem` (node prices ``c_v``, edge prices ``R_uv``,
memories ``m_v``, budget ``M``), the program is

    minimise    Σ_v Σ_s c_v[s]·x_{v,s}  +  Σ_{(u,v)} Σ_{i,j} R_uv[i,j]·e_{uv,ij}  +  const

    subject to  Σ_s x_{v,s} = 1                                ∀ v                    (1)
                Σ_j e_{uv,ij} = x_{u,i}                        ∀ (u,v), i             (2a)
                Σ_i e_{uv,ij} = x_{v,j}                        ∀ (u,v), j             (2b)
                Σ_v Σ_s m_v[s]·x_{v,s} ≤ M                                            (3)
                x ∈ {0,1};  e ∈ [0,1] (MIP) or e ∈ {0,1} (CP-SAT)

* (1) one strategy per node — :func:`add_strategy_vars` (a strategy whose price is infinite
  gets no variable, so it cannot be chosen).
* (2) edge consistency — :func:`add_edge_vars`. With ``x`` integral, (2a)+(2b) force
  ``e_{uv}`` to be the outer product of two one-hot vectors, so ``e`` may stay continuous in
  the MIP; the LP relaxation is integral on trees. An infinite ``R_uv[i,j]`` gets no variable,
  which forbids the pair.
* (3) memory under the budget — :func:`add_memory_constraint` (only when the budget can bind).
* objective — :func:`set_objective`.

Presolve (:func:`reduce_edge`): an edge whose prices are separable, ``R[i,j] = a_i + b_j``
(constant edges included), is folded into the two node prices and gets no variables at all;
on captured graphs most parameter and pass-through edges are of this kind.

The same encoding feeds HiGHS through ``ortools.math_opt`` (:mod:`.highs`) and CP-SAT
(:mod:`.cpsat`, prices scaled to integers); both implement :class:`LinearModel`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np

from fxplan.intra_op.problem import Problem

__all__ = ["LinearModel", "Encoding", "encode", "reduce_edge"]

Terms = list[tuple[float, Any]]


class LinearModel(Protocol):
    """What a backend offers the encoder: variables, linear rows and an objective."""

    def bool_var(self, name: str) -> Any: ...

    def unit_var(self, name: str) -> Any:
        """A variable in [0, 1]: continuous for a MIP, boolean for CP-SAT."""

    def add_eq(self, terms: Terms, rhs: float) -> None: ...

    def add_memory_le(self, terms: Terms, rhs: float) -> None:
        """``Σ coef·var ≤ rhs`` for the memory row (CP-SAT rounds it conservatively)."""

    def minimize(self, terms: Terms, constant: float) -> None: ...


@dataclass
class Encoding:
    """The variables of an encoded problem: ``x[v]`` maps strategy index → variable."""

    x: list[dict[int, Any]] = field(default_factory=list)
    num_edge_vars: int = 0
    objective: Terms = field(default_factory=list)
    constant: float = 0.0


def reduce_edge(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``(a, b)`` with ``cost[i, j] == a[i] + b[j]`` for all ``i, j`` (to 1e-12 relative), or
    ``None`` when the edge couples its endpoints (or has an infinite price)."""
    if not np.all(np.isfinite(cost)):
        return None
    a = cost[:, 0] - cost[0, 0]
    b = cost[0, :]
    scale = max(1.0, float(np.abs(cost).max()))
    if np.allclose(cost, a[:, None] + b[None, :], rtol=0.0, atol=1e-12 * scale):
        return a, b
    return None


def add_strategy_vars(problem: Problem, model: LinearModel, enc: Encoding, node_cost: list[np.ndarray]) -> None:
    """Family (1): a boolean per finite-priced strategy and ``Σ_s x_{v,s} = 1``."""
    for v in range(problem.num_nodes):
        finite = np.flatnonzero(np.isfinite(node_cost[v]))
        if finite.size == 0:
            name = problem.names[v]
            raise ValueError(f"node {name!r} has no strategy with a finite price")
        xs = {int(s): model.bool_var(f"x[{v},{s}]") for s in finite}
        model.add_eq([(1.0, var) for var in xs.values()], 1.0)
        enc.x.append(xs)
        enc.objective.extend((float(node_cost[v][s]), var) for s, var in xs.items() if node_cost[v][s] != 0.0)


def add_edge_vars(model: LinearModel, enc: Encoding, u: int, v: int, cost: np.ndarray) -> None:
    """Family (2): ``e_{uv,ij}`` for allowed pairs, rows sum to ``x_{u,i}``, columns to ``x_{v,j}``."""
    rows: dict[int, Terms] = {i: [] for i in enc.x[u]}
    cols: dict[int, Terms] = {j: [] for j in enc.x[v]}
    for i in enc.x[u]:
        for j in enc.x[v]:
            price = cost[i, j]
            if not np.isfinite(price):
                continue
            var = model.unit_var(f"e[{u},{v},{i},{j}]")
            enc.num_edge_vars += 1
            rows[i].append((1.0, var))
            cols[j].append((1.0, var))
            if price != 0.0:
                enc.objective.append((float(price), var))
    for i, terms in rows.items():
        model.add_eq(terms + [(-1.0, enc.x[u][i])], 0.0)
    for j, terms in cols.items():
        model.add_eq(terms + [(-1.0, enc.x[v][j])], 0.0)


def add_memory_constraint(problem: Problem, model: LinearModel, enc: Encoding) -> None:
    """Family (3): ``Σ m_v[s]·x_{v,s} ≤ M``, added only when the budget can bind."""
    if not problem.budget_binding():
        return
    terms = [
        (float(problem.node_memory[v][s]), var)
        for v, xs in enumerate(enc.x)
        for s, var in xs.items()
        if problem.node_memory[v][s] != 0.0
    ]
    model.add_memory_le(terms, float(problem.memory_budget))


def set_objective(model: LinearModel, enc: Encoding) -> None:
    """The objective: node prices on ``x``, coupled edge prices on ``e``, folded constants."""
    model.minimize(enc.objective, enc.constant)


def encode(problem: Problem, model: LinearModel) -> Encoding:
    """Write the whole program into ``model``; see the module docstring."""
    enc = Encoding(constant=problem.constant)
    node_cost = [c.copy() for c in problem.node_cost]
    coupled: list[tuple[int, int, np.ndarray]] = []
    for edge in problem.edges:
        split = reduce_edge(edge.cost)
        if split is None:
            coupled.append((edge.u, edge.v, edge.cost))
        else:
            node_cost[edge.u] = node_cost[edge.u] + split[0]
            node_cost[edge.v] = node_cost[edge.v] + split[1]
    add_strategy_vars(problem, model, enc, node_cost)
    for u, v, cost in coupled:
        add_edge_vars(model, enc, u, v, cost)
    add_memory_constraint(problem, model, enc)
    set_objective(model, enc)
    return enc


def read_choice(enc: Encoding, values: Sequence[dict[int, float]]) -> tuple[int, ...]:
    """The strategy whose ``x`` is largest per node (robust to 1e-9 solver noise)."""
    return tuple(max(vals, key=vals.__getitem__) for vals in values)
