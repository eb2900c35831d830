"""What the runtime keeps on each rank (parameters, gradients, optimizer state), measured by
``benchmarks/runtime_states.py`` on the gloo pool, against the layout its wrappers and dtypes
imply and against what the memory model prices
(:func:`fxplan.cost_model.memory.breakdown.model_state_bytes`).

The runtime's layout, in bytes on one rank, from the dtypes (``W = 4``: fp32, the parameters,
gradients and AdamW's two moments; ``C = 2``: bf16, the compute dtype FSDP2
gathers parameters in), ``N = dp``, ``Ψ`` the rank's parameters after tp and ``Ψ_o`` those
its optimizer updates (``Σ_dp Ψ_o = Ψ``)::

    config                      params kept  gathered (peak)      grads  buckets  optimizer  host
    ZeRO-0 (DDP)                WΨ           0                    WΨ     0        2WΨ        0
    ZeRO-1, tp=1 (DDP + ZeRO)   WΨ           0                    WΨ     0        2WΨ_o      0
    ZeRO-2 (fully_shard)        WΨ/N         CΨ                   WΨ/N   0        2WΨ/N      0
    ZeRO-1, tp=2 (as ZeRO-2)    WΨ/N         CΨ                   WΨ/N   0        2WΨ/N      0
    ZeRO-3 (fully_shard)        WΨ/N         C(Ψ_root + 2Ψ_block) WΨ/N   0        2WΨ/N      0
    offload=optimizer, ZeRO-0   WΨ           0                    WΨ     0        0          4WΨ
    offload=optimizer, ZeRO-1   WΨ           0                    WΨ     0        0          4WΨ_o

and where FSDP2's reduction waits for the last microbatch (ZeRO-1 with tp = 2 and ``m = 2``,
and ZeRO-2 under the interleaved schedule with ``m = 4``, whose ``REDUCE_GRAD`` pass follows
the last backward) the unsharded gradients accumulated in fp32 before it, ``WΨ`` at their
peak, beside the rows above (the ``WΨ/N`` shards replace them after the reduction).

(DDP's gradients are views into its fp32 buckets, ``gradient_as_bucket_view=True``: no bucket
bytes beside them; ZeRO-3's
window is the root — embedding, head, final norm, which FSDP2 keeps gathered from forward to
backward — and two blocks, the running one and the one prefetched; the host optimizer keeps
an fp32 master, gradient buffer and two moments.)

The memory model prices this layout (``state_layout="runtime"``,
:data:`~fxplan.cost_model.memory.breakdown.ADAM_AMP`; a ZeRO-2 rank's gathered copy is part of
its priced weights, ZeRO-3's window a buffer), and every gradient reduction at 4 B per
parameter: the tests below compare each configuration's measurement with it, state by state.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
import torch

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.append(BENCHMARKS)   # before the pool starts: its workers import the job by name

from runtime_states import CONFIGS, LAYERS, defers, device_states, priced  # noqa: E402

W = torch.finfo(torch.float32).bits // 8
C = torch.finfo(torch.bfloat16).bits // 8

_REPORTS: dict[str, list[dict[str, Any]]] = {}


def measured(rank_pool: Any, name: str) -> list[dict[str, Any]]:
    """The member ranks' reports of configuration ``name``, measured once per test run."""
    if name not in _REPORTS:
        reports = rank_pool.run("runtime_states:measure_states", plan_kwargs=CONFIGS[name])
        _REPORTS[name] = [r for r in reports if r is not None]
    return _REPORTS[name]


def _window() -> tuple[int, int]:
    """``(Ψ_root, Ψ_block)`` of the tiny GPT: the parameters outside the blocks (tied once)
    and those of one block."""
    from rt_plans import build_model

    params = dict(build_model(LAYERS).named_parameters())
    root = sum(p.numel() for k, p in params.items() if not k.startswith("h."))
    block = sum(p.numel() for k, p in params.items() if k.startswith("h.0."))
    return root, block


def expected(name: str, report: dict[str, Any]) -> dict[str, int]:
    """The runtime's layout of configuration ``name`` on the rank of ``report`` (table in the
    module docstring)."""
    config, psi, updated = CONFIGS[name], report["psi"], report["updated"]
    n = config["dp"]
    offload = config.get("offload") == "optimizer"
    if config["zero"] in (0, 1) and config.get("tp", 1) == 1:   # DDP (+ ZeroRedundancyOptimizer)
        return dict(params=W * psi, gathered=0, grads=W * psi, accumulated=0, buckets=0,
                    optimizer=0 if offload else 2 * W * updated,
                    host=4 * W * updated if offload else 0)
    root, block = _window()
    gathered = C * (root + 2 * block) if config["zero"] == 3 else C * psi
    return dict(params=W * psi // n, gathered=gathered, grads=W * psi // n,
                accumulated=W * psi if defers(config) else 0, buckets=0,
                optimizer=2 * W * psi // n, host=0)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_runtime_keeps_its_layout(rank_pool, name):
    """Every member rank holds exactly the bytes of the module docstring's table, in fp32
    (gathered parameters in bf16), its optimizer updating its share of the parameters."""
    reports = measured(rank_pool, name)
    assert len(reports) == (CONFIGS[name]["dp"] * CONFIGS[name].get("tp", 1)
                            * CONFIGS[name].get("pp", 1))
    for report in reports:
        assert report["bytes"] == expected(name, report), report
        for kind, dtypes in report["dtypes"].items():
            if report["bytes"][kind]:
                assert dtypes == (["bfloat16"] if kind == "gathered" else ["float32"]), report
        assert report["reduction"]["dtypes"] == ["float32"], report
        assert report["reduction"]["bytes"] == W * report["psi"], report
    zero, tp = CONFIGS[name]["zero"], CONFIGS[name].get("tp", 1)
    if zero == 0:
        assert all(r["updated"] == r["psi"] for r in reports), reports
    elif zero == 1 and tp == 1:   # ZeroRedundancyOptimizer's partitions cover Ψ once
        assert sum(r["updated"] for r in reports) == reports[0]["psi"], reports
    else:                         # FSDP2's dp shards
        assert all(r["updated"] * CONFIGS[name]["dp"] == r["psi"] for r in reports), reports
    if CONFIGS[name].get("tp", 1) > 1:
        assert any("ZeRO-1 with tp=2 runs as FSDP2" in line for line in reports[0]["fallbacks"])


def _mean_per_param(reports: list[dict[str, Any]], kinds: tuple[str, ...]) -> float:
    """Bytes of ``kinds`` per parameter, averaged over the member ranks (ZeRO-1's partitions
    differ by rank; their mean is the ``1/N`` share the model prices)."""
    return sum(sum(r["bytes"][k] for k in kinds) / r["psi"] for r in reports) / len(reports)


def _priced_per_param(name: str, report: dict[str, Any], kinds: tuple[str, ...]) -> float:
    model = priced(CONFIGS[name], report["psi"], report["dtype"])
    return sum(model[k] for k in kinds) / report["psi"]


def _device_total(name: str, reports: list[dict[str, Any]]) -> tuple[float, float]:
    """The device's model states per parameter (``runtime_states.device_states``: ZeRO-3's
    gathered window is a buffer in the model), measured (mean over the ranks) and priced."""
    config = CONFIGS[name]
    runtime = sum(device_states(r["bytes"], config) / r["psi"] for r in reports) / len(reports)
    return runtime, device_states(priced(config, reports[0]["psi"], reports[0]["dtype"]),
                                  config) / reports[0]["psi"]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_model_prices_the_device_total(rank_pool, name):
    runtime, model = _device_total(name, measured(rank_pool, name))
    assert runtime == pytest.approx(model, rel=1e-9)


@pytest.mark.parametrize("name", [n for n in CONFIGS if CONFIGS[n].get("offload") is None])
def test_the_model_prices_each_state(rank_pool, name):
    """Weights (a ZeRO-2 rank's gathered copy with them; ZeRO-3's window is a buffer in the
    model), gradients (DDP's buckets with them; where the reduction waits for the last
    microbatch, the unsharded ones at their peak) and optimizer state one by one."""
    reports = measured(rank_pool, name)
    weights = ("params",) if CONFIGS[name]["zero"] == 3 else ("params", "gathered")
    grads = ("accumulated",) if defers(CONFIGS[name]) else ("grads", "buckets")
    for runtime_kinds, model_kinds in ((weights, ("params",)), (grads, ("grads",)),
                                       (("optimizer",), ("optimizer",))):
        assert _mean_per_param(reports, runtime_kinds) == pytest.approx(
            _priced_per_param(name, reports[0], model_kinds), rel=1e-9), runtime_kinds


@pytest.mark.parametrize("name", [n for n in CONFIGS if CONFIGS[n].get("offload")])
def test_the_model_prices_the_host(rank_pool, name):
    """The host optimizer's fp32 master, gradient buffer and moments: 16 B per parameter the
    rank updates, as priced (``OptimizerSpec.host_bytes``), and nothing of it on the device."""
    reports = measured(rank_pool, name)
    assert _mean_per_param(reports, ("host",)) == pytest.approx(
        _priced_per_param(name, reports[0], ("host",)), rel=1e-9)
    assert all(r["bytes"]["optimizer"] == 0 for r in reports)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_model_prices_the_gradient_reduction(rank_pool, name):
    """Gradients are reduced in fp32 (DDP's buckets, FSDP2's ``reduce_dtype``), as priced."""
    from fxplan.cost_model.memory.breakdown import adam_for

    report = measured(rank_pool, name)[0]
    assert report["reduction"]["bytes"] == adam_for(report["dtype"]).grad_bytes * report["psi"]

