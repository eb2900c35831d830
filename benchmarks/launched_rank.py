"""One rank of a plan set up as ``fxplan launch``'s worker sets it up, for the benchmarks that
time a launched step from inside (``step_phases.py``, ``gloo_in_situ.py``,
``pipeline_host.py``).

:func:`launched_rank` places the process as the launcher places its ranks
(:mod:`fxplan.runtime.launch.affinity`), runs it on one thread with the heap kept between steps
(:func:`fxplan.runtime.train.heap.keep_heap`), joins a gloo group over loopback and applies the plan
to its model (:func:`fxplan.runtime.apply.graph.apply_plan`) with a fixed batch of random tokens at
the plan's global batch; :func:`fxplan.core.loopback.free_loopback_port` gives the group a port;
:func:`add_measurement_arguments` and :func:`apply_autogroup_nice` the scripts' shared options.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass
class LaunchedRank:
    """The applied plan on this rank and its slice of the batch (``((tokens,), targets)``)."""

    plan: Any
    sharded: Any
    batch: tuple[tuple[torch.Tensor], torch.Tensor]


def launched_rank(rank: int, world: int, plan_file: str, port: int) -> LaunchedRank:
    """Place, join and apply as :mod:`fxplan.worker` does (module docstring)."""
    import torch.distributed as dist

    from fxplan.core.plan import Plan
    from fxplan.examples.model_spec import resolve_model
    from fxplan.runtime.launch.affinity import pin_rank
    from fxplan.runtime.apply.graph import apply_plan
    from fxplan.runtime.train.heap import keep_heap

    pin_rank(rank, world)   # as fxplan's worker places its ranks, before gloo starts threads
    torch.set_num_threads(1)
    keep_heap()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    plan = Plan.from_dict(json.loads(Path(plan_file).read_text()))
    bundle = resolve_model(plan.model)
    torch.manual_seed(0)
    vocab = getattr(bundle.config, "vocab", None) or bundle.config.vocab_size
    tokens, targets = (torch.randint(0, vocab, (plan.batch, plan.seq)) for _ in range(2))
    sharded = apply_plan(bundle.build("cpu"), plan, (tokens,))
    start, stop = sharded.replica_slice()
    return LaunchedRank(plan, sharded, ((tokens[start:stop],), targets[start:stop]))


def add_measurement_arguments(parser: argparse.ArgumentParser, *, out: bool = True) -> None:
    """``--autogroup-nice N`` (the session's scheduler autogroup nice, root: as the series
    run their launches) and, with ``out``, ``--out FILE`` (the results as JSON)."""
    parser.add_argument("--autogroup-nice", type=int, default=None,
                        help="set this session's scheduler autogroup nice first (root)")
    if out:
        parser.add_argument("--out", type=Path, help="write the results as JSON")


def apply_autogroup_nice(args: argparse.Namespace) -> None:
    """Set the autogroup nice ``--autogroup-nice`` asked for (nothing without it)."""
    if args.autogroup_nice is not None:
        Path("/proc/self/autogroup").write_text(str(args.autogroup_nice))
