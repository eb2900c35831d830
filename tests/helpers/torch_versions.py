"""Skip marks for tests that need more than the oldest supported torch has
(:mod:`fxplan.core.torch_support`; CI runs the fast part of the suite on that release too)."""

from __future__ import annotations

import pytest
import torch

from fxplan.core.torch_support import FEATURES, parse_version, torch_has

#: The sharding options fxplan reads from DTensor's op tables, as torch 2.13 registers them.
#: Older releases register fewer strategies and have no decomposition tracer: those ops take
#: the reported replicate fallback, which a test of the 2.13 options cannot expect.
dtensor_tables_of_2_13 = pytest.mark.skipif(
    parse_version(torch.__version__)[:2] < (2, 13),
    reason=f"asserts the options of DTensor's op tables of torch 2.13 (this is {torch.__version__}, "
           "whose tables hold fewer; those ops fall back to replicate, reported)")


def needs(feature: str) -> pytest.MarkDecorator:
    """Skip unless the installed torch has ``feature`` (a key of ``FEATURES``)."""
    return pytest.mark.skipif(not torch_has(feature),
                              reason=f"needs {FEATURES[feature][2]} (torch {torch.__version__})")


def skip_without_expert_zero(plan_kwargs: dict) -> None:
    """Skip a case whose expert weights are sharded over the expert-data-parallel group (ZeRO ≥ 1
    with ``dp/ep > 1``): it needs FSDP2's ``DataParallelMeshDims`` (the runtime refuses it
    before training without; ``fxplan.runtime.styles.expert_zero``)."""
    sharded = plan_kwargs.get("zero", 0) >= 1 and plan_kwargs.get("dp", 1) // plan_kwargs.get("ep", 1) > 1
    if sharded and not torch_has("fsdp_spmd_mesh_dims"):
        pytest.skip(f"needs {FEATURES['fsdp_spmd_mesh_dims'][2]} (torch {torch.__version__})")
