"""The loss a rank's model is trained on: the default (cross-entropy or mean squared error), a
user file's own, or the loss a forward that takes its targets returns."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["loss_fn", "returned_loss", "training_loss"]


def loss_fn(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every position (integer targets), else mean squared error
    (:func:`fxplan.examples.user_loss.default_loss`); the runtime adds a Hugging Face MoE's
    router auxiliary loss (``router_aux_loss_coef · aux``, when its config sets
    ``output_router_logits``: :mod:`fxplan.runtime.styles.router_aux`). A bundle that fixes its own
    loss (a user file's ``loss(outputs, batch)``) is trained on that (:func:`training_loss`)."""
    from fxplan.examples.user_loss import default_loss

    return default_loss(output, targets)


def training_loss(bundle: Any) -> Any:
    """The loss ``bundle``'s model is trained on: the bundle's own (a user file's, the one
    capture priced), else :func:`loss_fn`; a forward that takes the targets and returns its
    own loss is trained on that instead (:func:`returned_loss`)."""
    return getattr(bundle, "loss", None) or loss_fn


def returned_loss(plan: Any, model: torch.nn.Module, path: str) -> tuple[Any, str]:
    """The loss and apply path of a forward trained on the loss it returns
    (:mod:`fxplan.runtime.train.fed_targets`): its returned loss, at module level; a
    pipeline or the graph rewrite (which does not run the user's forward) refused."""
    from fxplan.runtime.apply.offload import RuntimeSupportError
    from fxplan.runtime.train.fed_targets import ReturnedLoss, pipeline_refusal

    refusal = pipeline_refusal(plan) or ("--path graph: the graph rewrite does not run the "
                                         "user's forward, whose own loss is trained"
                                         if path == "graph" else None)
    if refusal:
        raise RuntimeSupportError(f"{plan.summary}: {refusal}")
    return ReturnedLoss(model), "module"
