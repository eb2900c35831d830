"""Context parallelism (``cp = 2``) trains like one process: the tiny GPT (module level, its
math attention run as SDPA; also with tp = 2 and sequence parallelism, its position embedding
embedding each tp rank's shard of the chunk's positions) and the tiny ``hf:llama`` (RoPE, grouped-query SDPA; also with
tp = 2 and sequence parallelism, where each rank's ``s/cp`` chunk is split again over tp
between the blocks' tp regions) on pooled gloo ranks, 3 SGD steps in fp32, losses and every gathered parameter within the numerics tests'
relative 1e-5 (:mod:`fxplan.runtime.styles.context_parallel`)."""

from __future__ import annotations

import pytest

#: ``(model, cp, plan kwargs)``: dp counts every data rank, cp of them per CP group.
CASES = {
    "gpt_cp2": ("gpt", 2, dict(dp=2)),
    "gpt_dp2_cp2": ("gpt", 2, dict(dp=4)),
    "llama_cp2": ("llama", 2, dict(dp=2)),
    "llama_dp2_cp2": ("llama", 2, dict(dp=4)),
    "llama_cp2_tp2": ("llama", 2, dict(dp=2, tp=2)),
    "llama_cp2_tp2_sp": ("llama", 2, dict(dp=2, tp=2, sp=True)),
    "gpt_dp2_cp2_zero3_recompute": ("gpt", 2, dict(dp=4, zero=3, recompute="full")),
    "llama_pp2_cp2": ("llama", 2, dict(pp=2, dp=2, num_microbatches=2, schedule="gpipe")),
    "gpt_pp2_cp2": ("gpt", 2, dict(pp=2, dp=2, num_microbatches=2, schedule="gpipe")),
    "gpt_cp2_tp2": ("gpt", 2, dict(dp=2, tp=2)),
    "gpt_cp2_tp2_sp": ("gpt", 2, dict(dp=2, tp=2, sp=True)),
    "llama_cp2_selective": ("llama", 2, dict(dp=2, recompute="selective")),
    "gpt_cp2_selective": ("gpt", 2, dict(dp=2, recompute="selective")),
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


def test_load_balanced_chunks():
    """Rank r holds chunks r and 2·cp−1−r; the ranks' positions together are the sequence."""
    from fxplan.runtime.styles.context_parallel import local_positions
    from fxplan.runtime.apply.offload import RuntimeSupportError

    assert local_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert local_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    every = sorted(p for r in range(4) for p in local_positions(16, 4, r).tolist())
    assert every == list(range(16))
    with pytest.raises(RuntimeSupportError, match="2·cp = 4"):
        local_positions(10, 2, 0)


def _cp_plan(**kwargs):
    from rt_cp_cases import with_cp
    from rt_plans import make_plan

    return with_cp(make_plan(dp=2, **kwargs), 2)


def test_attention_spelled_out_is_refused_before_launch():
    """A block whose attention is not a causal SDPA call is refused, naming the block (no
    process group is needed: the check runs before any)."""
    from fxplan.runtime.apply.graph import apply_plan
    from fxplan.runtime.apply.offload import RuntimeSupportError
    from rt_plans import build_model, fixed_batch

    plan = _cp_plan()
    model = build_model(2)
    for block in model.h:  # another class: the runtime does not switch it to its SDPA branch
        block.attn.__class__ = type("SpelledOutAttention", (type(block.attn),), {})
    with pytest.raises(RuntimeSupportError, match=r"block 'h\.0' \(Block\) cannot be reached"):
        apply_plan(model, plan, fixed_batch(plan)[0])


def test_graph_path_is_refused():
    from fxplan.runtime.apply.graph import apply_plan
    from fxplan.runtime.apply.offload import RuntimeSupportError
    from rt_plans import build_model, fixed_batch

    plan = _cp_plan()
    with pytest.raises(RuntimeSupportError, match="module level only"):
        apply_plan(build_model(2), plan, fixed_batch(plan)[0], path="graph")


def test_trainer_reads_group_samples_and_chunks(rank_pool, token_file):
    """The launch trainer under dp=4, cp=2 (2 CP groups of 2) on the tiny Llama: each group
    reads its half of the token file's global batch (``replica_slice``), each rank its chunks
    of the sequence; 10 steps give one process's curve."""
    pytest.importorskip("transformers")
    config = dict(steps=10, optimizer="sgd", lr=0.5, warmup_steps=2, grad_clip=1.0,
                  weight_decay=0.0)
    report = rank_pool.run("rt_trainer_cases:trainer_matches_reference",
                           plan_kwargs=dict(dp=4, microbatch_size=2, num_microbatches=2),
                           token_file=token_file, config=config, model="llama", cp=2)[0]
    print(f"trainer dp=4 cp=2: loss error {report['loss_error']:.2g}, grad-norm error "
          f"{report['norm_error']:.2g}")
    assert report["batch"] == 8 and report["path"] == "module", report
    assert report["loss_error"] <= 1e-5 and report["norm_error"] <= 1e-5, report


def test_gpt_fused_qkv_runs_head_parallel():
    """The zoo GPT's fused QKV attention takes the head-parallel style, under cp and without
    it (its proj row-parallel, checked without a local-shape probe of its own forward): its tp
    plans run at module level, not as the graph rewrite (where DTensor all-gathers the fused
    output at the q/k/v split and every rank runs the whole attention)."""
    from fxplan.runtime.apply.module import module_level_plan
    from fxplan.runtime.styles.tp_fused_qkv import FusedQKVAttention
    from rt_plans import build_model, fixed_batch, make_plan

    plain = make_plan(dp=2, tp=2)
    tokens = fixed_batch(plain)[0]
    for plan, batch in ((plain, tokens), (_cp_plan(tp=2), tokens[:, :8])):
        decided = module_level_plan(build_model(2), plan, batch)
        kinds = {name: type(style).__name__ for name, style in decided.styles.items()}
        assert kinds["h.0.attn"] == "FusedQKVAttention" and "h.0.attn.qkv" not in kinds
        assert kinds["h.0.attn.proj"] == "RowwiseParallel", kinds
        assert isinstance(decided.styles["h.1.attn"], FusedQKVAttention)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_collectives_per_layer_are_the_priced_ones(rank_pool, recompute):
    """What the runtime issues per layer and microbatch is what ``cost_model/context_parallel``
    prices: one all-gather of K and V together forward (of the cost model's ``KV`` bytes), one
    reduce-scatter backward, and the all-gather again under full recompute only (selective
    recompute checkpoints the attention call on the gathered K and V, which it keeps: nothing is
    gathered again)."""
    import fxplan
    from fxplan.cost_model.parallel.context_parallel import cp_layers, kv_bytes
    from fxplan.cost_model.step.layer_costs import graph_segments
    from rt_plans import MODEL

    report = rank_pool.run("rt_cp_cases:cp_collectives", recompute=recompute)[0]
    per_step = report["layers"] * report["microbatches"]
    assert report["all_gathers"] == per_step * (2 if recompute == "full" else 1), report
    assert report["backward"] == per_step, report
    graph = fxplan.capture(f"{MODEL},layers=2", batch=report["mb"])
    (layer,) = cp_layers(graph).values()
    priced = kv_bytes(layer, scale=report["mb"] / graph_segments(graph).batch, tp=1)
    assert report["forward_bytes"] == [priced] * report["layers"], (report, priced)


def test_gpt_position_embedding_takes_its_sequence_shard_under_sp():
    """Under cp with tp and sequence parallelism the zoo GPT's replicated position embedding
    runs PositionShard (each tp rank embeds its shard of the chunk's positions) instead of
    being refused; a later pipeline stage's NoPositions takes no style."""
    from fxplan.runtime.apply.module import _present, module_level_plan
    from fxplan.runtime.apply.stages import stage_module
    from fxplan.runtime.styles.tp_positions import PositionShard
    from rt_plans import build_model, fixed_batch

    piped = _cp_plan(tp=2, sp=True, pp=2, num_microbatches=2)
    model = build_model(2)
    decided = module_level_plan(model, piped, fixed_batch(piped)[0][:, :8])
    assert isinstance(decided.styles["wpe"], PositionShard), decided.styles
    assert _present(stage_module(model, piped, 0, decided.probe), "wpe")
    assert not _present(stage_module(model, piped, 1, decided.probe), "wpe")


def test_gathered_order_is_the_one_process_token_order():
    """The dp ranks' gathered tokens (rank order, each rank its two chunks of its group's
    samples) map one-to-one onto the one-process order; identity without cp."""
    from fxplan.runtime.styles.context_parallel import gathered_order

    assert gathered_order(2, 8, 1, 2).tolist() == list(range(32))
    order = gathered_order(2, 4, 2, 4)      # 2 CP groups × 2 ranks, 2 samples of 8 tokens
    assert sorted(order.tolist()) == list(range(32))
    assert order[:8].tolist() == [0, 1, 6, 7, 8, 9, 14, 15]       # group 0, CP rank 0
    assert order[24:].tolist() == [18, 19, 20, 21, 26, 27, 28, 29]  # group 1, CP rank 1


def test_expert_parallel_under_cp_routes_as_one_process(rank_pool):
    """moe-tiny under ep=2 with cp=2 (dp=4): the gathered choices are put in the one-process
    token order before the capacity queue, so the same assignments are dropped (capacity
    factor 0.5) and 3 SGD steps match one process (rank order instead gave a parameter
    error of 0.85)."""
    report = rank_pool.run("rt_ep_cases:train_ep_matches_reference",
                           plan_kwargs=dict(dp=4, ep=2, cp=2))[0]
    print(f"ep=2 cp=2: loss error {report['loss_error']:.2g}, parameter error "
          f"{report['param_error']:.2g}, aux error {report['aux_error']:.2g}, "
          f"{report['dropped']} assignments dropped")
    assert report["path"] == "module" and not report["missing"], report
    assert report["dropped"] > 0, report
    assert report["loss_error"] <= 1e-5 and report["param_error"] <= 1e-5, report
    assert report["aux_error"] <= 1e-5, report
