"""Model families: a config dataclass, a model class and its example inputs, under one name.

A family name with overrides (``gpt:layers=48,hidden=6144``) starts from the config's
defaults; a preset (:mod:`examples.presets`) starts from its own values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch.nn as nn

from fxplan.examples.bundle import InputSpec, ModelBundle
from fxplan.examples.models import convnet, gpt, llama, mlp, moe
from fxplan.examples.models.lm import lm_example_inputs


@dataclass(frozen=True)
class Family:
    """What it takes to build and feed one kind of model."""

    name: str
    config_cls: type
    model_cls: type[nn.Module]
    inputs: Callable[[Any, int, "int | None", bool], dict[str, InputSpec]]
    description: str

    def bundle(self, name: str, config: Any) -> ModelBundle:
        """A :class:`ModelBundle` for ``config`` (an instance of ``config_cls``)."""
        return ModelBundle(
            name=name, family=self.name, config=config,
            _build=lambda: self.model_cls(config),
            _inputs=lambda batch, seq, with_targets: self.inputs(config, batch, seq,
                                                                  with_targets))


FAMILIES: dict[str, Family] = {
    f.name: f for f in (
        Family("gpt", gpt.GPTConfig, gpt.GPT, lm_example_inputs,
               "decoder-only transformer, learned positions, tied LM head"),
        Family("moe", moe.MoEConfig, moe.MoEGPT, lm_example_inputs,
               "GPT with mixture-of-experts feed-forward layers (top-k router, capacity, "
               "auxiliary load-balancing loss)"),
        Family("llama", llama.LlamaConfig, llama.Llama, lm_example_inputs,
               "RMSNorm, rotary embeddings, SwiGLU, grouped-query attention"),
        Family("mlp", mlp.MLPConfig, mlp.MLP, mlp.example_inputs,
               "residual multi-layer perceptron classifier"),
        Family("convnet", convnet.ConvNetConfig, convnet.ConvNet, convnet.example_inputs,
               "small ResNet-style image classifier"),
    )
}
