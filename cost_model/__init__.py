"""The cost model: what a plan costs, in seconds and bytes.

``estimate(graph, cluster, config, batch=…)`` predicts one training step of a captured graph
on a :class:`~cluster_specs.Cluster` under a :class:`ParallelConfig` and returns an
:class:`Estimate` (step time and breakdown, tokens/s, TFLOP/s per device, MFU, memory per
stage, fits). Its parts: :mod:`cost_model.compute.op_time` (op times), :mod:`cost_model.comm.collectives`
(communication), :mod:`cost_model.memory.breakdown` and :mod:`cost_model.memory.activations` (bytes),
:mod:`cost_model.step.layer_costs` (cached per-layer profiles), :mod:`cost_model.step.simulator`
(pipeline timelines and the step). See ``docs/cost_model.md``.

``estimate`` is both a submodule and the function it defines; the package exports the
function (``import cost_model.estimate as module`` still reaches the module).
"""

from __future__ import annotations

from fxplan.core.config import ParallelConfig
from fxplan.core.config_error import CostModelError
from fxplan.cost_model.step.estimate import Estimate, estimate

__all__ = ["CostModelError", "Estimate", "ParallelConfig", "estimate"]
