"""Per-op-class efficiencies of a CPU, measured on the nodes of a model's own graph.

The roofline (:mod:`cost_model.compute.op_time`) prices a node of class ``c`` doing ``F`` FLOPs and
moving ``B`` bytes as, with the saturating curves of :mod:`cost_model.compute.efficiency`
(``e(w) = η_c · w / (w + w_half)``)::

    compute-bound class (matmul, attention, conv):  t − t_launch = (F + F_half) / (P · η_c)
    memory-bound class  (elementwise, norm, …):     t − t_launch = (B + B_half) / (M · η_c)

where ``P`` is the device's fp32 peak and ``M`` its memory bandwidth. Given measured forward
times ``t_i`` of a class's nodes (at the sizes the model really runs, every microbatch size
measured), the ``η_c`` that makes the class's priced total equal its measured total is the
ratio of sums::

    η_c = Σ_i (w_i + w_half) / (R · Σ_i (t_i − t_launch))          (R = P or M)

— a time-weighted fit: the nodes that take the time set the rate, and tiny nodes whose time is
all launch overhead weigh nothing. ``P``, ``M`` and ``t_launch`` must be measured in the same
run as the ``t_i`` (``benchmarks/op_class_calibration.py`` measures them with the rate probe's
own functions), so that ``η_c`` is a ratio of rates taken under the same machine load and the
stored efficiencies hold whatever rates a later probe reads.

:func:`time_graph_nodes` measures the ``t_i``: it runs a captured ``GraphModule`` node by node
(:class:`torch.fx.Interpreter`) on the calling thread and reads, for each node, the thread's
CPU time (``time.thread_time``) spent in the node's own call — its arguments already fetched —
with autograd recording as in training; the median over ``repeats`` runs of the graph.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from fxplan.cost_model.compute.efficiency import family_of, load_efficiency

__all__ = ["NodeSample", "fit_class_efficiency", "time_graph_nodes"]


@dataclass(frozen=True)
class NodeSample:
    """One node's measured forward seconds ``time_s`` with its work (FLOPs, bytes read +
    written) at the size it was measured, and its op class."""

    op_class: str
    flops: float
    bytes: float
    time_s: float


def fit_class_efficiency(samples: Iterable[NodeSample], *, peak_flops: float,
                         bandwidth_bytes_s: float, launch_s: float, backward: bool = False,
                         curves: Mapping[str, Mapping[str, float]] | None = None,
                         ) -> dict[str, dict[str, float]]:
    """``η_c`` per op class by the ratio of sums of the module docstring.

    ``backward=True``: the samples are the nodes' backward times, priced as
    :data:`cost_model.compute.op_time.BACKWARD` does — ``k`` kernels doing ``f·F`` FLOPs / ``b·B``
    bytes, each paying ``t_launch`` and the curve's ``w_half`` — and keyed by the class whose
    efficiency prices them (``priced_as``: dropout's backward is an elementwise kernel).
    ``curves`` maps a family to its ``half_flops``/``half_bytes`` (default: the data file's
    ``cpu`` entry). Returns, per class, ``efficiency``, the measured and kernel seconds summed
    (``measured_s``, ``kernel_s`` = Σ (t − k·t_launch)), the work summed (``work``) and the node
    count (``nodes``). A class whose kernel time sums to ≤ 0 (all launch overhead) is left out.
    """
    from fxplan.cost_model.compute.op_time import BACKWARD

    model = load_efficiency()
    halves = curves if curves is not None else model.devices["cpu"]
    sums: dict[str, list[float]] = {}
    for s in samples:
        rule = BACKWARD[s.op_class]
        op_class = (rule.priced_as or s.op_class) if backward else s.op_class
        family = family_of(op_class, model)
        if family is None or (s.flops <= 0 and s.bytes <= 0) or (backward and not rule.kernels):
            continue
        kernels = rule.kernels if backward else 1
        flops = s.flops * (rule.flops if backward else 1.0)
        nbytes = s.bytes * (rule.bytes if backward else 1.0)
        compute = model.families[family]["bound"] == "compute"
        work = (flops + kernels * halves[family]["half_flops"] if compute
                else nbytes + kernels * halves[family]["half_bytes"])
        row = sums.setdefault(op_class, [0.0, 0.0, 0.0, 0.0, 1.0 if compute else 0.0])
        row[0] += work
        row[1] += s.time_s
        row[2] += s.time_s - kernels * launch_s
        row[3] += 1
    out: dict[str, dict[str, float]] = {}
    for op_class, (work, measured, kernel, nodes, compute) in sums.items():
        if kernel <= 0:
            continue
        rate = peak_flops if compute else bandwidth_bytes_s
        out[op_class] = {"efficiency": work / (rate * kernel), "measured_s": measured,
                         "kernel_s": kernel, "work": work, "nodes": nodes}
    return out


def _new_grad_fns(value: Any, seen: set) -> list:
    """The autograd nodes reachable from the tensors in ``value`` that no earlier graph node
    reached (added to ``seen``): the backward of the node that produced ``value``, including
    the gradient accumulation of the parameters it was the first to use."""
    import torch

    stack = [t.grad_fn for t in torch.utils._pytree.tree_leaves(value)
             if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    found = []
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        found.append(fn)
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return found


def time_graph_nodes(gm: Any, args: tuple, *, repeats: int = 7,
                     ) -> tuple[dict[str, float], dict[str, float]]:
    """Median thread CPU seconds of each ``call_*`` node of ``gm`` run on ``args``: its
    forward, and its backward (module docstring) — the autograd nodes its forward created,
    each timed from its pre-hook to its hook while the graph's output (a scalar loss) is
    back-propagated; the graph is run twice first to warm up."""
    import torch.fx

    fwd: dict[str, list[float]] = {}
    bwd: dict[str, list[float]] = {}

    class _Timed(torch.fx.Interpreter):
        def run(self, *a: Any) -> Any:
            self.seen: set = set()
            self.owner: dict[Any, str] = {}
            return super().run(*a)

        def run_node(self, n: torch.fx.Node) -> Any:
            if not n.op.startswith("call_"):
                return super().run_node(n)
            with self._set_current_node(n):
                a, kw = self.fetch_args_kwargs_from_env(n)
                start = time.thread_time()
                result = getattr(self, n.op)(n.target, a, kw)
                fwd.setdefault(n.name, []).append(time.thread_time() - start)
            for fn in _new_grad_fns(result, self.seen):
                self.owner[fn] = n.name
            return result

    def one_step(interpreter: _Timed) -> None:
        loss = interpreter.run(*args)
        spent: dict[str, float] = {}
        begun: dict[Any, float] = {}

        def pre(fn: Any) -> Any:
            def hook(*_: Any) -> None:
                begun[fn] = time.thread_time()
            return hook

        def post(fn: Any) -> Any:
            def hook(*_: Any) -> None:
                name = interpreter.owner[fn]
                spent[name] = spent.get(name, 0.0) + time.thread_time() - begun.pop(fn)
            return hook

        # hooks are removed after the pass: the parameters' AccumulateGrad nodes outlive it
        handles = [h for fn in interpreter.owner
                   for h in (fn.register_prehook(pre(fn)), fn.register_hook(post(fn)))]
        try:
            loss.backward()
        finally:
            for h in handles:
                h.remove()
        for p in gm.parameters():   # as a training step's zero_grad(set_to_none=True)
            p.grad = None
        for name, seconds in spent.items():
            bwd.setdefault(name, []).append(seconds)

    interpreter = _Timed(gm)
    for _ in range(2):
        one_step(interpreter)
    fwd.clear()
    bwd.clear()
    for _ in range(repeats):
        one_step(interpreter)
    return ({name: statistics.median(ts) for name, ts in fwd.items()},
            {name: statistics.median(ts) for name, ts in bwd.items()})
