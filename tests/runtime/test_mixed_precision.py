"""Mixed precision in the runtime (:mod:`fxplan.runtime.apply.precision`) on 4 pooled gloo ranks: bf16
compute with fp32 master weights, optimizer state and gradient reduction, under dp (DDP +
autocast), tp+sp (parallelize_module + autocast) and pp+ZeRO-3 (FSDP2 MixedPrecisionPolicy).

Tolerance. The reference is one process with the forward under ``torch.autocast("cpu",
bfloat16)`` and fp32 parameters, on the same samples. bf16 keeps 8 significant bits (relative
rounding 2⁻⁹ ≈ 2e-3 per op); the plans differ from the reference in where bf16 rounding happens
(a tp shard's partial matmul is rounded before the all-reduce; FSDP2 computes every op of a
block in bf16, not only the matmuls), so 30 steps drift apart by a few rounding units of the
loss: the losses must agree within 2e-2 relative (measured: see the test's printed maximum),
an order of magnitude below the loss's fall over the run (> 20 %), and a wrong reduction
(a missing or doubled shard) is off by far more from step 1.
"""

from __future__ import annotations

import pytest

from rt_trainer_cases import TRAINER_PLANS

ADAMW = dict(steps=20, optimizer="adamw", lr=1e-2, warmup_steps=3, grad_clip=1.0)
TOLERANCE = 1e-2


@pytest.mark.parametrize("name", list(TRAINER_PLANS))
def test_bf16_curve_matches_one_process_under_autocast(rank_pool, token_file, name):
    report = rank_pool.run("rt_trainer_cases:trainer_matches_reference",
                           plan_kwargs=TRAINER_PLANS[name],
                           token_file=token_file, config=ADAMW, dtype="bf16")[0]
    losses = report["losses"]
    fall = 1 - sum(losses[-5:]) / sum(losses[:5])
    print(f"{name}: bf16 max relative loss difference {report['loss_error']:.3g}, "
          f"mean loss of the last 5 steps {fall:.1%} below the first 5")
    assert report["linear_dtypes"] == ["bfloat16"], report  # every matmul wrote bf16
    assert report["param_dtypes"] == ["float32"], report     # fp32 master weights
    assert report["state_dtypes"] == ["float32"], report     # fp32 AdamW moments
    assert report["loss_error"] <= TOLERANCE, report
    assert fall > 0.05, losses


def test_fp32_is_untouched(rank_pool, token_file):
    """``--dtype fp32``: no autocast, fp32 matmuls, and the fp32 curve of one process."""
    report = rank_pool.run("rt_trainer_cases:trainer_matches_reference",
                           plan_kwargs=TRAINER_PLANS["dp"],
                           token_file=token_file, config={**ADAMW, "steps": 5}, dtype="fp32")[0]
    assert report["linear_dtypes"] == ["float32"], report
    assert report["loss_error"] <= 1e-5, report


@pytest.mark.parametrize("name", ["tp_sp", "pp_zero3"])
def test_bf16_hf_llama_at_module_level(rank_pool, token_file, name):
    """The module-level path: ``parallelize_module`` + autocast (tp+sp) and FSDP2's policy on the
    user's decoder layers inside pipeline stages (pp+ZeRO-3)."""
    pytest.importorskip("transformers")
    report = rank_pool.run("rt_trainer_cases:trainer_matches_reference",
                           plan_kwargs=TRAINER_PLANS[name],
                           token_file=token_file, config=ADAMW, dtype="bf16", model="llama")[0]
    print(f"llama {name}: bf16 max relative loss difference {report['loss_error']:.3g}")
    assert report["path"] == "module", report
    assert report["linear_dtypes"] == ["bfloat16"], report
    assert report["param_dtypes"] == ["float32"] and report["state_dtypes"] == ["float32"]
    assert report["loss_error"] <= TOLERANCE, report
