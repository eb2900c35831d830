"""``TrainConfig``: the optimisation settings of a training run, and its learning-rate schedule.

One type for the command line (``fxplan launch`` flags and the TOML run config, which extend
it with the run's data and directories: :class:`fxplan.cli.run_config.RunSettings`) and the
runtime's training loop (:func:`fxplan.runtime.train.trainer.train`).

**Schedule** for the update of step ``t = 1 … T`` with peak ``η``, floor ``η_min`` (default
``η / 10``) and ``W`` warm-up steps::

    η_t = η · t / W                                          t ≤ W
    η_t = η_min + (η − η_min) · ½ (1 + cos(π · p)),  p = (t − W − 1) / max(1, T − W − 1)

so the first step after the warm-up runs at ``η`` and the last at ``η_min``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["AFFINITY_ENV", "AFFINITY_MODES", "APPLY_PATHS", "TrainConfig", "lr_at"]

#: How a plan is applied (``fxplan.plan(path=…)``, ``apply_plan``, ``fxplan launch --path``):
#: ``module`` on the user's own module with PyTorch's parallel pieces, ``graph`` by the graph
#: rewrite, ``auto`` the module level where the plan allows it, else the graph rewrite.
APPLY_PATHS: tuple[str, ...] = ("auto", "module", "graph")
#: Where CPU ranks run (``fxplan launch --cpu-affinity``, handed to the ranks as
#: ``AFFINITY_ENV``; :mod:`fxplan.runtime.launch.affinity`): ``auto`` pins where ranks outnumber cores
#: (the default), ``core`` always, ``none`` never.
AFFINITY_MODES: tuple[str, ...] = ("auto", "core", "none")
AFFINITY_ENV = "FXPLAN_CPU_AFFINITY"


def lr_at(step: int, *, lr: float, steps: int, warmup: int = 0, min_lr: float | None = None
          ) -> float:
    """The learning rate of update ``step`` (1-based; module docstring)."""
    floor = lr / 10 if min_lr is None else min_lr
    if step <= warmup:
        return lr * step / warmup
    progress = (step - warmup - 1) / max(1, steps - warmup - 1)
    return floor + (lr - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Optimisation settings of a run: ``steps`` updates of ``optimizer`` (``adamw``/``sgd``)
    at peak ``lr`` with the warm-up + cosine schedule (module docstring), AdamW's
    ``weight_decay``/``beta1``/``beta2``, clipping to global norm ``grad_clip`` (0: off), a
    metrics line every ``log_every`` steps."""

    steps: int = 10
    optimizer: str = "adamw"
    lr: float = 1e-3
    min_lr: float | None = None
    warmup_steps: int = 0
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    log_every: int = 1

    def lr_at(self, step: int) -> float:
        return lr_at(step, lr=self.lr, steps=self.steps, warmup=self.warmup_steps,
                     min_lr=self.min_lr)
