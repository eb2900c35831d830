"""The training precision of a cluster: one rule for the search, CLI and cost model."""

from __future__ import annotations

import pytest
import torch

from fxplan.api import capture
from fxplan.cluster_specs import (Cluster, ClusterSpecError, check_precision, training_dtype,
                                  training_precision)
from fxplan.core.config import ParallelConfig
from fxplan.core.config_error import CostModelError
from fxplan.core.errors import UserError
from fxplan.cost_model import estimate


@pytest.mark.parametrize("spec, key, name", [
    ("dgx-a100-80g", "bf16", "bfloat16"),
    ("aws-p3-v100", "fp16", "float16"),
    ("dgx1-v100-32g", "fp16", "float16"),
    ("local-cpu:devices=2", "fp32", "float32"),
])
def test_training_precision_follows_the_peaks(spec: str, key: str, name: str) -> None:
    cluster = Cluster.load(spec)
    assert training_precision(cluster) == key
    assert training_dtype(cluster) == name
    check_precision(cluster, key)   # the default is always one the devices have


def test_a_missing_peak_names_the_listed_ones() -> None:
    with pytest.raises(ClusterSpecError, match=r"no bf16 peak.*their dtypes are fp32, fp16"):
        check_precision(Cluster.load("aws-p3-v100"), "bf16")


def test_estimate_refuses_a_graph_in_a_precision_the_device_lacks() -> None:
    graph = capture("gpt-tiny", batch=1, dtype=torch.bfloat16)
    with pytest.raises(CostModelError, match=r"lists no peak for 'bf16'.*captured in") as err:
        estimate(graph, Cluster.load("aws-p3-v100"), ParallelConfig(dp=8), batch=8)
    assert isinstance(err.value, UserError)


def test_a_mixed_cluster_trains_each_group_in_its_own_precision() -> None:
    """V100 + A100: bf16 where the A100s have it, the V100s in their fp16."""
    from fxplan.cluster_specs import group_precisions

    cluster = Cluster.load("hetero-v100-a100")
    assert training_precision(cluster) == "bf16"
    assert group_precisions(cluster, "bf16") == {"v100": "fp16", "a100": "bf16"}
    assert group_precisions(cluster, "fp16") == {"v100": "fp16", "a100": "fp16"}
    check_precision(cluster, "bf16")
    check_precision(cluster, "fp16")
    with pytest.raises(ClusterSpecError, match=r"no fp8 peak"):
        check_precision(cluster, "fp8")
