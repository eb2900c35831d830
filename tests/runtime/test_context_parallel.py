"""Context parallelism (``cp = 2``) trains like one process: the tiny GPT (module level, its
math attention run as SDPA) and the tiny ``hf:llama`` (RoPE, grouped-query SDPA) on pooled gloo
ranks, 3 SGD steps in fp32, losses and every gathered parameter within the numerics tests'
relative 1e-5 (:mod:`fxplan.runtime.context_parallel`)."""

from __future__ import annotations

import pytest

#: ``(model, cp, plan kwargs)``: dp counts every data rank, cp of them per CP group.
CASES = {
    "gpt_cp2": ("gpt", 2, dict(dp=2)),
    "gpt_dp2_cp2": ("gpt", 2, dict(dp=4)),
    "llama_cp2": ("llama", 2, dict(dp=2)),
    "llama_dp2_cp2": ("llama", 2, dict(dp=4)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_cp_matches_single_process(rank_pool, name):
    model, cp, kwargs = CASES[name]
    if model == "llama":
        pytest.importorskip("transformers")
    report = rank_pool.run("rt_cp_cases:cp_matches_reference", model=model, cp=cp,
                           plan_kwargs=kwargs)[0]
    print(f"{name}: loss error {report['loss_error']:.2g}, parameter error "
          f"{report['param_error']:.2g}, {report['local_tokens']} tokens per rank")
    assert report["path"] == "module", report
    assert not report["missing"], report
    assert report["loss_error"] <= 1e-5, report
    assert report["param_error"] <= 1e-5, report
    assert report["losses"][-1] < report["losses"][0], report
