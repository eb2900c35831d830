"""The launch trainer on a tiny Hugging Face ``hf:llama`` (applied at module level: the user's
``LlamaForCausalLM``, ``parallelize_module``, DDP / FSDP2, pipeline stages) on 4 pooled gloo
ranks: 50 steps from the token file under dp, tp+sp and pp+ZeRO-3 give the loss curve of one
process reading the same samples, and a run interrupted after step 20's checkpoint and resumed
gives the uninterrupted curve bit for bit. (The tiny GPT's twins: test_trainer.py and
test_resume.py.)

Tolerance: SGD in fp32, the plans differ from one process only in reduction order; 50 steps
stay within 1e-5 relative of the reference's losses (the printed maximum is the measured one).
"""

from __future__ import annotations

import pytest

from rt_trainer_cases import TRAINER_PLANS

pytest.importorskip("transformers")

SGD = dict(steps=50, optimizer="sgd", lr=0.5, warmup_steps=5, grad_clip=1.0, weight_decay=0.0)


@pytest.mark.parametrize("name", list(TRAINER_PLANS))
def test_llama_curve_matches_one_process(rank_pool, token_file, name):
    report = rank_pool.run("rt_trainer_cases:trainer_matches_reference",
                           plan_kwargs=TRAINER_PLANS[name],
                           token_file=token_file, config=SGD, model="llama")[0]
    losses = report["losses"]
    fall = 1 - sum(losses[-5:]) / sum(losses[:5])
    print(f"llama {name}: max relative loss difference {report['loss_error']:.3g}, "
          f"loss fell {fall:.1%}")
    assert report["path"] == "module", report
    assert report["batch"] == 8 and len(losses) == 50
    assert report["loss_error"] <= 1e-5, report
    assert fall > 0.05, losses


def test_llama_resumed_at_step_20_gives_the_uninterrupted_curve(rank_pool, token_file, tmp_path):
    report = rank_pool.run("rt_resume_cases:resume_matches_uninterrupted",
                           plan_kwargs=TRAINER_PLANS["pp_zero3"], token_file=token_file,
                           config={**SGD, "optimizer": "adamw", "lr": 3e-3}, tmp=str(tmp_path),
                           every=20, model="llama")[0]
    assert len(report["whole"]) == 50 and len(report["resumed"]) == 30, report
    assert report["committed"] == ["latest", "step-20"], report
    assert report["resumed"] == report["whole"][20:], report  # bit for bit
