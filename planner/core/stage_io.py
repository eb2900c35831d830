"""``StageIO``: the shapes a pipeline stage exchanges, shared by the stage split and the runtime.

The graph rewrite's stage split (:mod:`fxplan.passes.rewrite.stages`) and the module-level
path (:mod:`fxplan.runtime.apply.module`) both describe each stage by meta tensors of its
inputs and outputs for one microbatch; the pipeline runtime (:mod:`fxplan.runtime.train.pipeline`)
builds its ``PipelineStage`` buffers from them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["StageIO"]


@dataclass(frozen=True)
class StageIO:
    """Meta tensors with the shapes/dtypes of a stage's inputs and outputs for one microbatch."""

    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[torch.Tensor, ...]
