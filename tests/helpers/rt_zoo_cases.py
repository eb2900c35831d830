"""Jobs the rank pool runs for the model zoo test (``tests/cli/test_model_zoo.py``): a model
spec trained two SGD steps under a plan, on the ranks of the plan's mesh, against the same
steps on one process."""

from __future__ import annotations

from typing import Any

import torch

from fxplan.core.plan import Plan
from fxplan.examples.model_spec import resolve_model
from fxplan.runtime.apply import apply_plan
from fxplan.runtime.module_probe import model_output
from rt_cases import train_steps
from rt_module_cases import lm_loss

LR = 0.1
VOCAB = 64
STEPS = 2


def build(spec: str) -> torch.nn.Module:
    """The model of ``spec``, seeded (every rank and the reference alike)."""
    torch.manual_seed(0)
    return resolve_model(spec).build("cpu")


def batch(size: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, VOCAB, (size, seq + 1), generator=torch.Generator().manual_seed(1))
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def one_process(spec: str, size: int, seq: int) -> list[float]:
    """The losses of :data:`STEPS` SGD steps of the whole model on one process."""
    model = build(spec)
    tokens, targets = batch(size, seq)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for _ in range(STEPS):
        loss = lm_loss(model_output(model(tokens)), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def train(spec: str, plan_json: str) -> dict[str, Any] | None:
    """:data:`STEPS` SGD steps of ``spec`` under the plan (``None`` on a rank outside its
    mesh): the losses, the path that ran and the fallbacks taken."""
    plan = Plan.from_json(plan_json)
    tokens, targets = batch(plan.batch, plan.seq)
    sharded = apply_plan(build(spec), plan, tokens)
    if sharded is None:
        return None
    losses = train_steps(sharded, sharded.optimizer(torch.optim.SGD, lr=LR),
                         (tokens, targets), STEPS)
    return dict(losses=losses, path=sharded.path, fallbacks=list(sharded.fallbacks))
