"""Intra-op solver backends compared: HiGHS (math_opt) vs CP-SAT vs the exact chain DP.

Instances (``fxplan.intra_op.synthetic``): chains and transformer-like DAGs (a chain with a
residual skip edge every 3 nodes) of increasing size, K strategies per node, with and without a
binding memory budget; plus the real coarsened problem of one GPT block (the planner's own
case). Each backend gets ``--time-limit`` seconds; a backend that does not apply (the DP on a
DAG) or is skipped for size prints ``-``. Objectives are compared with the best one found.

    .venv/bin/python benchmarks/solver_backends.py [--quick] [--time-limit 60]

Prints a Markdown table (the one in docs/benchmarks.md, "Intra-op solver backends").
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from dataclasses import dataclass
from typing import Callable

from fxplan.intra_op import IntraOpInfeasible, Problem, solve_problem
from fxplan.intra_op.synthetic import random_chain, random_dag


@dataclass
class Instance:
    name: str
    build: Callable[[], Problem]
    backends: tuple[str, ...]


def _synthetic(quick: bool) -> list[Instance]:
    sizes = [100, 1000] if quick else [100, 1000, 2000, 5000]
    out = []
    for n in sizes:
        for tight in (False, True):
            tag = "budget" if tight else "free"
            cpsat = ("cpsat",) if n <= 1000 else ()
            dp = ("dp",) if (n <= 2000 or not tight) else ()
            out.append(Instance(f"chain n={n} K=4 {tag}",
                                lambda n=n, t=tight: random_chain(n, 4, seed=n, tight_memory=t),
                                ("highs", *cpsat, *dp)))
            out.append(Instance(f"DAG n={n} K=4 {tag}",
                                lambda n=n, t=tight: random_dag(n, 4, seed=n, tight_memory=t),
                                ("highs", *cpsat)))
        if n <= 1000:
            out.append(Instance(f"DAG n={n} K=8 budget", lambda n=n: random_dag(n, 8, seed=n, tight_memory=True),
                                ("highs", "cpsat")))
    return out


def _gpt_block(mesh_shape: tuple[int, ...], names: tuple[str, ...], merge: bool) -> Callable[[], Problem]:
    def build() -> Problem:
        import torch

        from fxplan.cluster_specs import Cluster
        from fxplan.cost_model.comm.mesh import LogicalMesh
        from fxplan.api import capture
        from fxplan.intra_op.build import build_problem, op_graph
        from fxplan.intra_op.coarsen import coarsen
        from fxplan.intra_op.mesh_cost import MeshCost

        graph = capture("gpt:layers=4,hidden=4096,heads=32,vocab=51200,seq=2048", batch=8, seq=2048,
                        dtype=torch.bfloat16)
        nodes = max(1, (mesh_shape[0] * mesh_shape[-1]) // 8)
        mesh = LogicalMesh(Cluster.load(f"dgx-a100-80g:nodes={nodes}"), mesh_shape, names)
        built = build_problem(graph, op_graph(graph, mesh.shape), MeshCost(mesh), follow=merge)
        return coarsen(built.problem, built.followers).problem

    return build


def _real(quick: bool) -> list[Instance]:
    cases = [((8,), ("tp",), True), ((8,), ("tp",), False)]
    if not quick:
        cases.append(((8, 8), ("dp", "tp"), True))
    return [Instance(f"GPT block {'×'.join(map(str, s))} {'merged' if m else 'unmerged'}",
                     _gpt_block(s, n, m), ("highs", "cpsat", "dp")) for s, n, m in cases]


def _run(problem: Problem, backend: str, limit: float) -> tuple[str, float, float]:
    start = time.perf_counter()
    try:
        result = solve_problem(problem, backend, limit)
    except IntraOpInfeasible:
        return "infeasible", float("nan"), time.perf_counter() - start
    except ValueError as err:  # the DP on a problem that is not a chain
        return f"n/a ({type(err).__name__})", float("nan"), 0.0
    status = result.status if result.status == "optimal" else f"{result.status}, gap {result.gap:.2%}"
    return status, result.objective, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per solve")
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
          f"time limit {args.time_limit:g} s per solve\n")
    print("| instance | problem | backend | status | objective (rel. to best) | time (s) |")
    print("|---|---|---|---|---|---|")
    for inst in _synthetic(args.quick) + _real(args.quick):
        problem = inst.build()
        rows = [(b, *_run(problem, b, args.time_limit)) for b in inst.backends]
        best = min((r[2] for r in rows if r[2] == r[2]), default=float("nan"))
        size = problem.size_summary().split(" (")[0]
        for backend, status, objective, seconds in rows:
            rel = "-" if objective != objective else f"{objective / best:.6f}" if best else f"{objective:.3g}"
            print(f"| {inst.name} | {size} | {backend} | {status} | {rel} | {seconds:.3f} |", flush=True)


if __name__ == "__main__":
    main()
