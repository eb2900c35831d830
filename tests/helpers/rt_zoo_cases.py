"""Jobs the rank pool runs for the model zoo test (``tests/cli/test_model_zoo.py``): a model
spec trained two SGD steps under a plan, on the ranks of the plan's mesh, against the same
steps on one process. The batch is the launch's synthetic data for the spec (its inputs bound
to the forward by name, its targets and loss the ones ``fxplan launch`` trains on: a forward
that computes its own loss is fed the targets, last, and trained on the loss it returns)."""

from __future__ import annotations

from typing import Any

import torch

from fxplan.core.plan import Plan
from fxplan.examples.model_spec import resolve_model
from fxplan.core.model_output import returned_loss
from fxplan.passes.forward_swap import computes_own_loss, forward_taking
from fxplan.runtime.apply.graph import apply_plan
from fxplan.runtime.train.data import SyntheticData
from fxplan.runtime.train.fed_targets import ReturnedLoss
from fxplan.runtime.apply.probe import model_output
from fxplan.rank.loss import training_loss
from rt_cases import train_steps

LR = 0.1
VOCAB = 64
STEPS = 2


def batch(spec: str, size: int, seq: int | None
          ) -> tuple[list[str], tuple[torch.Tensor, ...], torch.Tensor]:
    """The names of the forward's inputs, a seeded batch of them and its targets (an ``hf:``
    model's ``labels``); the targets are an input too when the forward computes its loss."""
    specs = dict(resolve_model(spec).example_inputs(size, seq))
    specs["targets"] = specs.pop("labels", None) or specs["targets"]
    data = SyntheticData(specs, high=VOCAB, seed=1)
    names = [k for k in specs if k != "targets"]
    if fed(spec):
        return [*names, "targets"], (*data.inputs, data.targets), data.targets
    return names, data.inputs, data.targets


def fed(spec: str) -> bool:
    """Whether ``spec``'s forward is fed the targets and trained on the loss it returns."""
    bundle = resolve_model(spec)
    return computes_own_loss(bundle, bundle.build("meta"))


def build(spec: str, names: list[str]) -> torch.nn.Module:
    """The model of ``spec``, seeded (every rank and the reference alike), taking ``names``
    by position."""
    torch.manual_seed(0)
    return forward_taking(resolve_model(spec).build("cpu"), names)


def one_process(spec: str, size: int, seq: int | None) -> list[float]:
    """The losses of :data:`STEPS` SGD steps of the whole model on one process."""
    names, inputs, targets = batch(spec, size, seq)
    model = build(spec, names)
    loss_fn = training_loss(resolve_model(spec))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for _ in range(STEPS):
        out = model(*inputs)
        loss = returned_loss(out) if fed(spec) else loss_fn(model_output(out), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def train(spec: str, plan_json: str, path: str = "auto") -> dict[str, Any] | None:
    """:data:`STEPS` SGD steps of ``spec`` under the plan (``None`` on a rank outside its
    mesh): the losses, the path that ran and the fallbacks taken. ``path``: how the plan is
    applied (a model that feeds its own targets: the module level)."""
    plan = Plan.from_json(plan_json)
    names, inputs, targets = batch(spec, plan.batch, plan.seq)
    model = build(spec, names)
    loss_fn = ReturnedLoss(model) if fed(spec) else training_loss(resolve_model(spec))
    sharded = apply_plan(model, plan, inputs, path="module" if fed(spec) else path)
    if sharded is None:
        return None
    losses = train_steps(sharded, sharded.optimizer(torch.optim.SGD, lr=LR),
                         (inputs, targets), STEPS, loss_fn)
    return dict(losses=losses, path=sharded.path, fallbacks=list(sharded.fallbacks))
