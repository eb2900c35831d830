"""Bad arguments to the public Python API: each raises a ``UserError`` subclass, before any
capture or search, whose message names the argument and what was expected."""

from __future__ import annotations

import math

import pytest
import torch

import fxplan
import fxplan.cluster_specs
import fxplan.core.config
from fxplan.core.errors import UserError

CL = "local-cpu:devices=4"


def _module() -> torch.nn.Module:
    return torch.nn.Linear(4, 4)


CASES = [
    ("search-batch-str", lambda: fxplan.search("gpt-tiny", CL, batch="16"), ["batch", "'16'", "integer"]),
    ("search-batch-float", lambda: fxplan.search("gpt-tiny", CL, batch=16.0), ["batch", "float"]),
    ("search-batch-bool", lambda: fxplan.search("gpt-tiny", CL, batch=True), ["batch", "bool"]),
    ("search-batch-0", lambda: fxplan.search("gpt-tiny", CL, batch=0), ["batch", "in 1"]),
    ("search-batch-huge", lambda: fxplan.search("gpt-tiny", CL, batch=10 ** 12), ["batch", "16,777,216"]),
    ("search-batch-none", lambda: fxplan.search("gpt-tiny", CL, batch=None), ["batch", "NoneType"]),
    ("search-seq-neg", lambda: fxplan.search("gpt-tiny", CL, batch=8, seq=-1), ["seq"]),
    ("search-seq-str", lambda: fxplan.search("gpt-tiny", CL, batch=8, seq="64"), ["seq", "str"]),
    ("search-cluster-none", lambda: fxplan.search("gpt-tiny", None, batch=8), ["cluster", "NoneType"]),
    ("search-cluster-dict", lambda: fxplan.search("gpt-tiny", {"nodes": 1}, batch=8),
     ["cluster", "Cluster.from_dict"]),
    ("search-cluster-int", lambda: fxplan.search("gpt-tiny", 8, batch=8), ["cluster", "int"]),
    ("search-cluster-empty", lambda: fxplan.search("gpt-tiny", "", batch=8), ["empty cluster spec"]),
    ("search-model-none", lambda: fxplan.search(None, CL, batch=8), ["model", "NoneType"]),
    ("search-model-int", lambda: fxplan.search(3, CL, batch=8), ["model", "int"]),
    ("search-model-empty", lambda: fxplan.search("", CL, batch=8), ["model spec", "non-empty"]),
    ("search-time-budget-neg", lambda: fxplan.search("gpt-tiny", CL, batch=8, time_budget_s=-1),
     ["time_budget_s", "≥ 0"]),
    ("search-time-budget-nan", lambda: fxplan.search("gpt-tiny", CL, batch=8, time_budget_s=math.nan),
     ["time_budget_s", "finite"]),
    ("search-time-budget-str", lambda: fxplan.search("gpt-tiny", CL, batch=8, time_budget_s="5"),
     ["time_budget_s", "str"]),
    ("search-finalists-0", lambda: fxplan.search("gpt-tiny", CL, batch=8, finalists=0),
     ["finalists", "in 1"]),
    ("search-finalists-float", lambda: fxplan.search("gpt-tiny", CL, batch=8, finalists=2.0),
     ["finalists", "float"]),
    ("search-constraints-str", lambda: fxplan.search("gpt-tiny", CL, batch=8, constraints="tp=2"),
     ["constraints", "mapping"]),
    ("search-headroom-150", lambda: fxplan.search("gpt-tiny", CL, batch=8, headroom="150%"),
     ["memory headroom '150%'", "below 100"]),
    ("search-headroom-both", lambda: fxplan.search("gpt-tiny", CL, batch=8, headroom=0.1,
                                                   memory_headroom=0.1), ["not both"]),
    ("plan-headroom-neg", lambda: fxplan.plan(_module(), CL, inputs=torch.ones(4, 4), batch=4,
                                              memory_headroom=-1), ["memory headroom", "≥ 0"]),
    ("capture-batch-str", lambda: fxplan.capture("gpt-tiny", batch="2"), ["batch", "str"]),
    ("capture-batch-0", lambda: fxplan.capture("gpt-tiny", batch=0), ["batch"]),
    ("capture-seq-float", lambda: fxplan.capture("gpt-tiny", batch=1, seq=64.0), ["seq", "float"]),
    ("capture-model-none", lambda: fxplan.capture(None, batch=1), ["capture(model=None)"]),
    ("capture-model-list", lambda: fxplan.capture([1], batch=1), ["model", "list"]),
    ("capture-unknown-model", lambda: fxplan.capture("gpt-nope", batch=1), ["gpt-nope"]),
    ("plan-inputs-none", lambda: fxplan.plan(_module(), CL, inputs=None, batch=4), ["inputs=None",
                                                                                 "tensor"]),
    ("plan-inputs-empty", lambda: fxplan.plan(_module(), CL, inputs=(), batch=4), ["inputs"]),
    ("plan-inputs-list-of-int", lambda: fxplan.plan(_module(), CL, inputs=[1, 2], batch=4),
     ["inputs", "int", "tensors"]),
    ("plan-batch-str", lambda: fxplan.plan(_module(), CL, inputs=torch.ones(4, 4), batch="4"),
     ["batch", "str"]),
    ("plan-batch-bool", lambda: fxplan.plan(_module(), CL, inputs=torch.ones(4, 4), batch=True),
     ["batch", "bool"]),
    ("plan-plan-path", lambda: fxplan.plan(_module(), CL, inputs=torch.ones(4, 4), batch=4,
                                           plan="x.json"), ["plan='x.json'", "load_plan"]),
    ("plan-plan-dict", lambda: fxplan.plan(_module(), CL, inputs=torch.ones(4, 4), batch=4,
                                           plan={}), ["plan=", "Plan"]),
    ("plan-cluster-none", lambda: fxplan.plan(_module(), None, inputs=torch.ones(4, 4), batch=4),
     ["cluster", "NoneType"]),
    ("plan-cluster-dict", lambda: fxplan.plan(_module(), {"a": 1}, inputs=torch.ones(4, 4),
                                              batch=4), ["cluster", "Cluster.from_dict"]),
    ("plan-model-spec", lambda: fxplan.plan("gpt-tiny", CL, inputs=torch.ones(4, 4), batch=4),
     ["plan(model='gpt-tiny')", "torch.nn.Module"]),
    ("load-plan-missing", lambda: fxplan.load_plan("/nonexistent/plan.json"), ["does not exist"]),
    ("load-plan-int", lambda: fxplan.load_plan(3), ["load_plan", "int"]),
    ("load-plan-dir", lambda: fxplan.load_plan("/"), ["is a directory"]),
    ("parallel-config-parse-empty", lambda: fxplan.core.config.ParallelConfig.parse(""),
     ["config ''", "key=value"]),
    ("parallel-config-dp-str", lambda: fxplan.core.config.ParallelConfig(dp="2"), ["dp", "'2'"]),
    ("cluster-load-none", lambda: fxplan.cluster_specs.Cluster.load(None), ["NoneType"]),
    ("cluster-load-nodes-huge", lambda: fxplan.cluster_specs.Cluster.load(
        "dgx-a100-80g:nodes=1000000000"), ["nodes", "1,048,576"]),
]


@pytest.mark.parametrize("name,call,needles", CASES, ids=[c[0] for c in CASES])
def test_bad_argument_raises_a_user_error(name, call, needles):
    with pytest.raises(UserError) as info:
        call()
    message = str(info.value)
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"


def test_a_graph_captured_in_a_dtype_the_devices_lack_is_a_user_error() -> None:
    """A bf16 capture (``capture_for_search``'s default) searched on CPU ranks, which list fp32
    only: the precision check's paragraph, not the cost model's bare ``ValueError``."""
    from fxplan.api import capture_for_search

    with pytest.raises(UserError, match="no bf16 peak.*their dtypes are fp32"):
        fxplan.search(capture_for_search("gpt-tiny"), CL, batch=16)
