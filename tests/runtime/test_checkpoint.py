"""A sharded checkpoint saved under one plan loads under another (different mesh)."""

from __future__ import annotations

import pytest

PAIRS = {
    # 4 ranks, FSDP2 × TP DTensors  →  2 ranks, pipeline, plain tensors
    "dp2tp2zero3_to_pp2": (dict(dp=2, tp=2, zero=3), dict(pp=2, num_microbatches=2)),
    # pipeline × TP with the tied weight on two ranks  →  ZeRO-2 over 4 ranks
    "pp2tp2_to_dp4zero2": (dict(pp=2, tp=2, num_microbatches=2), dict(dp=4, zero=2)),
}


@pytest.mark.parametrize("name", list(PAIRS))
def test_checkpoint_reshards_across_plans(rank_pool, tmp_path, name):
    save, load = PAIRS[name]
    results = rank_pool.run("rt_cases:checkpoint_reshards", save_plan=save, load_plan=load,
                            path=str(tmp_path / "ckpt"))
    report = results[0]
    assert report["keys_match"], report
    assert report["changed"] > 1e-3, "the loading model must start from other weights"
    assert report["error"] == 0.0, report
