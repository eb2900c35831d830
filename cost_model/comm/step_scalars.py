"""The training loop's scalar collectives of every step: the loss and the gradient norm.

Beyond the model's own communication, the trainer (:mod:`fxplan.runtime.train.trainer`) meets the
other ranks at least once more per step, with a tensor of one element:

- **the loss** (``ShardedModule._reduce_loss``): with ``pp > 1`` the last stage broadcasts the
  mean loss over the pipeline group; with ``dp > 1`` it is all-reduced over the data-parallel
  group (to report the global batch's mean);
- **the gradient norm** of clipping (:func:`fxplan.runtime.train.optim.global_grad_norm`): the sum
  of squares of each group of local gradients is all-reduced over every mesh dimension those
  gradients are sharded on — ``dp`` when FSDP2 shards the parameters (ZeRO-2/3, and ZeRO-1
  with ``tp > 1``), ``tp`` when tensor parallelism splits some (every ``tp > 1`` layout
  does) — and the total over the pipeline group when ``pp > 1``.

Each is a blocking collective of 4 (loss, fp32) or 8 (norm, fp64) bytes, so its cost is
latency: α plus a hop latency per step of its algorithm (:func:`cost_model.comm.collectives.
collective_time_s`). That is microseconds on NVLink and InfiniBand, but milliseconds between
time-shared CPU ranks in gloo (``local-cpu``: 572 µs per hop, calibrated between bursts of
compute). On stage ``s`` with groups ``G_pp``, ``G_dp``, ``G_tp``::

    t_scalars = [pp > 1]·(B(G_pp, 4) + AR(G_pp, 8)) + [dp > 1]·AR(G_dp, 4)
                + [sharded over dp]·AR(G_dp, 8) + [tp > 1]·AR(G_tp, 8)

priced after the stage's backward (the ``post`` time of :mod:`cost_model.step.stage_costs`),
where nothing can hide it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.config import ParallelConfig

__all__ = ["LOSS_BYTES", "NORM_BYTES", "step_scalar_collectives", "step_scalars_s"]

#: The loss is reduced in fp32, the squared norm in fp64 (``runtime/train/optim.py``).
LOSS_BYTES, NORM_BYTES = 4.0, 8.0


def step_scalar_collectives(config: ParallelConfig, *, sharded_dp: bool
                            ) -> list[tuple[str, float, str]]:
    """``(kind, bytes, group)`` of the step's scalar collectives (module docstring); ``group``
    is ``"pp"``, ``"dp"`` or ``"tp"``; ``sharded_dp``: FSDP2 shards the parameters over dp."""
    out: list[tuple[str, float, str]] = []
    if config.pp > 1:
        out.append(("broadcast", LOSS_BYTES, "pp"))
    if config.dp > 1:
        out.append(("all_reduce", LOSS_BYTES, "dp"))
    if sharded_dp and config.dp > 1:
        out.append(("all_reduce", NORM_BYTES, "dp"))
    if config.tp > 1:
        out.append(("all_reduce", NORM_BYTES, "tp"))
    if config.pp > 1:
        out.append(("all_reduce", NORM_BYTES, "pp"))
    return out


def step_scalars_s(config: ParallelConfig, groups: dict[str, tuple[int, ...]],
                   price: Callable[[str, float, tuple[int, ...]], float], *,
                   sharded_dp: bool) -> float:
    """Seconds of one stage's scalar collectives: each priced by ``price(kind, bytes,
    group)`` over ``groups[name]`` (the stage's pp, dp and tp groups)."""
    return sum(price(kind, nbytes, groups[name])
               for kind, nbytes, name in step_scalar_collectives(config, sharded_dp=sharded_dp))
