"""Per-stage build: the model on meta, each rank materialises only its own stages (and tp
shards), initialised from the single-process model's values, and trains like one process."""

from __future__ import annotations

import pytest

CASES = {
    "pp2": dict(pp=2, num_microbatches=2),
    "pp2tp2": dict(pp=2, tp=2, num_microbatches=2, sp=True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_rank_holds_only_its_stage(rank_pool, name):
    kwargs = CASES[name]
    results = rank_pool.run("rt_cases:train_matches_reference", plan_kwargs=kwargs, meta=True)
    members = [r for r in results if r is not None]
    assert len(members) == kwargs["pp"] * kwargs.get("tp", 1)
    for report in members:
        assert report["local_bytes"] < report["total_bytes"], report
        if kwargs.get("tp", 1) == 1:  # exactly the stage's parameters, nothing else
            assert report["local_bytes"] == report["stage_bytes"], report
        else:  # tp shards of the stage: well under the stage, above 1/tp of it
            assert report["stage_bytes"] / 2 <= report["local_bytes"] < report["stage_bytes"]
    report = results[0]
    assert not report["missing"], report
    assert report["loss_error"] <= 1e-5 and report["param_error"] <= 1e-5, report


def test_materialize_one_process_keeps_ties_and_values():
    """Single process: a meta-built model materialised from the reference's values equals it,
    the tied embedding/LM head stays one Parameter, and buffers were never on meta."""
    import torch

    from fxplan.runtime.apply.build import has_meta, init_values, materialize
    from rt_plans import build_model

    model = build_model(2, meta=True)
    assert model.wte.weight.is_meta and not model.positions.is_meta
    names = {id(p): n for n, p in model.named_parameters()}
    assert materialize(model, names, torch.device("cpu"), init_values(lambda: build_model(2)))
    assert not has_meta(model) and model.lm_head.weight is model.wte.weight
    for (name, param), (_, expected) in zip(model.named_parameters(),
                                            build_model(2).named_parameters()):
        assert torch.equal(param, expected), name


def test_meta_model_without_values_is_refused():
    from fxplan.runtime.apply.graph import apply_plan
    from rt_plans import build_model, fixed_batch, make_plan

    plan = make_plan()
    with pytest.raises(ValueError, match="needs init="):
        apply_plan(build_model(2, meta=True), plan, fixed_batch(plan)[0])


def test_materialize_moves_the_host_buffers_to_the_parameters_device():
    """``meta_parameters`` keeps buffers real on the host; materialising onto another device
    moves them there with the parameters (on a GPU, the positions buffer on the host made every
    launch fail in its first embedding). ``meta`` stands in for the other device here."""
    import torch

    from fxplan.runtime.apply.build import materialize
    from rt_plans import build_model

    model = build_model(2, meta=True)
    assert model.positions.device.type == "cpu"
    names = {id(p): n for n, p in model.named_parameters()}
    materialize(model, names, torch.device("meta"), None)
    assert all(b.device.type == "meta" for b in model.buffers())
    assert all(p.device.type == "meta" for p in model.parameters())
