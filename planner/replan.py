"""Replan a job for the cluster it has now: same model, same global batch, another device count.

    result = replan(plan, world=2)                       # the plan's cluster, 2 devices in all
    result = replan(plan, cluster="local-cpu:devices=8")  # or a cluster named outright
    result.new, result.replan_time_s, result.changes()

The new plan is :func:`fxplan.api.search` of the plan's model on the new cluster at the plan's
global batch ``B`` and sequence length — the one search path, nothing else. Keeping ``B`` keeps
the training the same: the loss of a step is the mean over the same ``B`` samples whatever the
split, so a smaller world runs the step as more (or larger) microbatches per replica,
``B = dp · microbatch · num_microbatches``, and the learning-rate schedule, data order and
optimizer state carry over unchanged. The search is deterministic (same graph, cluster, batch
→ same plan), so every rank could compute it; ``fxplan.worker`` lets rank 0 compute it and
broadcasts the result, so the ranks agree even if a solver time limit were hit.

``world``: the new cluster is the plan's cluster spec with ``devices=world``
(:func:`fxplan.cluster_specs.overrides.with_devices`: part of one node, or whole nodes).
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass
from typing import Any, Callable

from fxplan.core.plan import Plan

__all__ = ["Replan", "replan", "plan_brief", "report_replan"]


def plan_brief(plan: Plan) -> dict[str, Any]:
    """The summary of a plan that the events and ``fxplan replan --json`` carry."""
    step = plan.estimate.get("step_time_s")
    return {"summary": plan.summary, "world_size": plan.world_size, "cluster": plan.cluster,
            "pp": plan.pp, "dp": plan.dp, "tp": plan.tp, "batch": plan.batch,
            "microbatch": plan.config.microbatch_size,
            "num_microbatches": plan.config.num_microbatches,
            "predicted_step_time_s": None if step is None else float(step)}


@dataclass(frozen=True)
class Replan:
    """The old plan, the new one, and the search time."""

    old: Plan
    new: Plan
    replan_time_s: float   # the search (and the capture, unless this process has it cached)
    import_s: float = 0.0  # loading the search's modules (solvers), once per process
    cpu_s: float | None = None  # CPU time of the search in this process (what an idle core takes)

    def changes(self) -> list[str]:
        """What differs, one line each (degrees, batch split, predicted step time)."""
        old, new = plan_brief(self.old), plan_brief(self.new)
        lines = [f"cluster: {old['cluster']} ({old['world_size']} devices) → {new['cluster']} "
                 f"({new['world_size']} devices)"]
        degrees = [f"{k} {old[k]}→{new[k]}" for k in ("pp", "dp", "tp") if old[k] != new[k]]
        lines.append("degrees: " + (", ".join(degrees) or "unchanged"))
        lines.append(f"global batch {new['batch']} kept: {_split(old)} → {_split(new)} "
                     f"(per-replica accumulation {old['num_microbatches']} → "
                     f"{new['num_microbatches']} microbatches)")
        if old["summary"] != new["summary"]:
            lines.append(f"plan: {old['summary']} → {new['summary']}")
        lines.append(f"predicted step time: {_ms(old['predicted_step_time_s'])} → "
                     f"{_ms(new['predicted_step_time_s'])}")
        return lines

    def to_dict(self) -> dict[str, Any]:
        """``old``/``new`` briefs; ``replan_time_s``: capture of the model (cached in a process
        that captured it before) and search, with the search's phase times in ``timings_s``;
        ``replan_cpu_s``: the CPU time of the same (the wall time on an idle machine, whatever
        the load now); ``import_s``: the first import of the search's modules and solvers in
        this process, not counted in ``replan_time_s`` (0 once loaded); ``changes``."""
        return {"old": plan_brief(self.old), "new": plan_brief(self.new),
                "replan_time_s": self.replan_time_s, "replan_cpu_s": self.cpu_s,
                "import_s": self.import_s,
                "timings_s": {k: float(v) for k, v in self.new.timings.items()},
                "changes": self.changes()}


def report_replan(found: Replan, say: Callable[[str], None], events: Any) -> None:
    """Print the old and new plans and what changed, and log the ``replan`` event to
    ``events`` (an :class:`~fxplan.runtime.train.events.EventLog`; ``None``: print only) — the
    launcher's and the workers' one report."""
    say(f"replan: the job has {found.new.world_size} ranks, its plan is for "
        f"{found.old.world_size}: replanned in {found.replan_time_s * 1e3:.0f} ms "
        f"({_ms(found.cpu_s)} CPU; + {found.import_s * 1e3:.0f} ms loading the solvers) for the "
        "same model and global batch B = dp·microbatch·microbatches (the same training)")
    for line in found.changes():
        say(f"replan: {line}")
    if events is None:
        return
    info = found.to_dict()
    events.log("replan", old=info["old"], new=info["new"],
               replan_ms=round(found.replan_time_s * 1e3, 3),
               replan_cpu_ms=None if found.cpu_s is None else round(found.cpu_s * 1e3, 3),
               import_ms=round(found.import_s * 1e3, 3), timings_s=info["timings_s"],
               changes=info["changes"])


def _split(brief: dict[str, Any]) -> str:
    return f"dp {brief['dp']} × mb {brief['microbatch']} × {brief['num_microbatches']}"


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.4g} ms"


def replan(plan: Plan, cluster: str | None = None, *, world: int | None = None,
           **search_options: Any) -> Replan:
    """The plan of ``plan.model`` at ``plan.batch`` on ``cluster`` (or on the plan's cluster
    resized to ``world`` devices); module docstring. ``search_options`` go to
    :func:`fxplan.api.search`."""
    from fxplan.api import search
    from fxplan.cluster_specs.overrides import with_devices

    if (cluster is None) == (world is None):
        raise ValueError("replan: give exactly one of cluster= and world=")
    target = cluster if cluster is not None else with_devices(plan.cluster, int(world or 0))
    search_options.setdefault("progress", False)
    began = time.perf_counter()
    for module in ("fxplan.inter_op.driver", "fxplan.intra_op"):  # the solvers (ortools among
        importlib.import_module(module)  # them): loaded once per process, timed as import_s

    loaded, cpu = time.perf_counter(), time.process_time()
    new = search(plan.model, target, batch=plan.batch, seq=plan.seq, **search_options)
    return Replan(plan, new, time.perf_counter() - loaded, loaded - began,
                  time.process_time() - cpu)
