"""Which path a plan takes, decided on one process before any process group exists: the
tensor-parallel styles derived from placements, the pipeline cut at block boundaries, and the
reasons the module level refuses a plan (the runtime then runs the graph rewrite)."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                               RowwiseParallel, SequenceParallel)

from fxplan.passes.rewrite.base import PassError
from fxplan.runtime.apply.graph import apply_plan
from fxplan.runtime.apply.module import module_level_plan, replicated_tp_note
from fxplan.runtime.apply.probe import model_output
from fxplan.runtime.apply.stages import StageBlocks, stage_module
from fxplan.runtime.styles.tp_styles import NotExpressible
from fxplan.runtime.styles.tp_attention import HeadParallelAttention
from rt_module_cases import ENCODER_MLP_TP, ENCODER_TP, build, plan_for

TOKENS = torch.zeros(2, 8, dtype=torch.long)


def test_hf_llama_styles_follow_the_placements():
    pytest.importorskip("transformers")
    model = build("llama")
    styles = module_level_plan(model, plan_for(model, tp=2, sp=True), TOKENS).styles
    assert isinstance(styles["model.layers.0.self_attn.q_proj"], ColwiseParallel)
    row = styles["model.layers.1.mlp.down_proj"]
    assert isinstance(row, RowwiseParallel) and row.output_layouts == (Shard(1),)
    assert isinstance(styles["model.embed_tokens"], RowwiseParallel)   # vocabulary-parallel
    head = styles["lm_head"]
    assert isinstance(head, ColwiseParallel) and head.output_layouts == (Replicate(),)
    assert isinstance(styles["model.layers.0.input_layernorm"], SequenceParallel)
    assert isinstance(styles["model.norm"], SequenceParallel)
    gather = styles["model.layers.0.self_attn"]      # called with hidden_states=… (keyword)
    assert isinstance(gather, PrepareModuleInput)
    assert gather.input_kwarg_layouts == {"hidden_states": Shard(1)}
    assert isinstance(styles["model.layers.0.mlp"], PrepareModuleInput)


def test_hf_llama_pipeline_stage_keeps_the_users_names():
    pytest.importorskip("transformers")
    model = build("llama")
    plan = plan_for(model, pp=2)
    decided = module_level_plan(model, plan, TOKENS)   # checks the chain against the model
    assert decided.probe.pre == ["model.embed_tokens"]
    assert decided.probe.post == ["model.norm", "lm_head"]
    last = stage_module(model, plan, 1, decided.probe)
    names = [n for n, _ in last.named_parameters()]
    assert names == ["model.layers.1." + n.split(".", 3)[3] for n in names[:-2]] + [
        "model.norm.weight", "lm_head.weight"]
    assert isinstance(last.model.layers, StageBlocks) and len(last.model.layers) == 1
    assert isinstance(last.model.embed_tokens, torch.nn.Identity)
    assert decided.stage_io[1].inputs[0].shape == (2, 8, 32)
    assert decided.stage_io[0].outputs[0].shape == (2, 8, 32)
    assert decided.stage_io[1].outputs[0].shape == (2, 8, 64)


def test_encoder_stage_cut_and_replicated_attention():
    model = build("encoder")
    decided = module_level_plan(model, plan_for(model, pp=2), TOKENS[:, :8])
    assert decided.probe.blocks == ["encoder.layers.0", "encoder.layers.1"]
    # nn.MultiheadAttention's fused in_proj_weight split alone (not head-parallel) is refused
    plan = plan_for(model, tp=2, overrides={"encoder.layers.0.self_attn.in_proj_weight": "RS(0)"})
    with pytest.raises(NotExpressible, match="MultiheadAttention.*in_proj_weight S.0., "
                                             "in_proj_bias R.*not the head-parallel layout"):
        module_level_plan(model, plan, TOKENS)
    # in_proj S(0) with out_proj S(1) is head-parallel attention
    styles = module_level_plan(model, plan_for(model, tp=2, overrides=ENCODER_TP), TOKENS).styles
    assert isinstance(styles["encoder.layers.1.self_attn"], HeadParallelAttention)
    assert "encoder.layers.1.self_attn.out_proj" not in styles
    # the MLP alone can be split; with sequence parallelism the replicated attention cannot
    # take the sequence-sharded stream
    styles = module_level_plan(model, plan_for(model, tp=2, overrides=ENCODER_MLP_TP),
                               TOKENS).styles
    assert sorted(styles) == [f"encoder.layers.{i}.linear{j}" for i in (0, 1) for j in (1, 2)]
    plan = plan_for(model, tp=2, sp=True, overrides={**ENCODER_MLP_TP, "emb.weight": "RS(0)",
                                                     "head.weight": "RS(0)", "head.bias": "RS(0)"})
    with pytest.raises(NotExpressible, match="MultiheadAttention 'encoder.layers.0.self_attn'"):
        module_level_plan(model, plan, TOKENS)


def test_tp_plan_that_splits_nothing_says_so():
    """A tp=2 plan whose placements are all replicated (what the search picks for a small
    Llama on local-cpu) gets no styles — each tp rank runs the whole model — and one line
    saying so; a plan that splits over tp gets none."""
    pytest.importorskip("transformers")
    model = build("llama")
    replicated = {name: "RR" for name, _ in model.named_parameters()}
    decided = module_level_plan(model, plan_for(model, tp=2, overrides=replicated), TOKENS)
    assert decided.styles == {}
    assert decided.fallbacks == [replicated_tp_note(2)]
    assert "tp=2 splits no parameter" in decided.fallbacks[0]
    decided = module_level_plan(model, plan_for(model, tp=2), TOKENS)
    assert decided.styles and not decided.fallbacks


def test_tied_weight_takes_one_layout_and_pipeline_copies():
    """A tied Llama: under tp the embedding and the head read one placement (the sharded use's
    where the search planned them apart, with a fallback line); under pp the first and the
    last stage hold a copy, named by the first name; under sp × pp the stage boundary is the
    local sequence shard."""
    pytest.importorskip("transformers")
    model = build("llama-tied")
    plan = plan_for(model, tp=2, sp=True, overrides={"model.embed_tokens.weight": "RR",
                                                     "lm_head.weight": "RS(0)"})
    decided = module_level_plan(model, plan, TOKENS)
    assert isinstance(decided.styles["model.embed_tokens"], RowwiseParallel)  # vocab-parallel
    assert isinstance(decided.styles["lm_head"], ColwiseParallel)
    assert decided.aliases == {"model.embed_tokens.weight": "model.embed_tokens.weight",
                               "lm_head.weight": "model.embed_tokens.weight"}
    (line,) = decided.fallbacks
    assert "R for 'model.embed_tokens.weight', S(0) for 'lm_head.weight'" in line, line
    plan = plan_for(model, tp=2, pp=2, sp=True)
    decided = module_level_plan(model, plan, TOKENS)
    assert decided.tied_users == {"model.embed_tokens.weight": [0, 1]}
    assert not decided.fallbacks
    assert decided.stage_io[0].outputs[0].shape == (2, 4, 32)   # (b, s/tp, h)
    assert decided.stage_io[1].inputs[0].shape == (2, 4, 32)
    assert decided.stage_io[1].outputs[0].shape == (2, 8, 64)   # full logits
    plan = plan_for(model, tp=2, overrides={"lm_head.weight": "RS(1)"})
    with pytest.raises(NotExpressible, match="two sharded layouts"):
        module_level_plan(model, plan, TOKENS)


@pytest.mark.parametrize("case, reason", [
    ("fixed_heads_tp", "local shapes"),
    ("bias_mismatch", "not a column- or row-parallel layout"),
    ("sp_replicated_head", "'emb' is replicated over tp: with sequence parallelism"),
])
def test_module_level_refusals_name_the_reason(case, reason):
    from fxplan.examples.model_spec import resolve_model

    if case == "fixed_heads_tp":  # fused c_attn split by a constant width, heads constant
        from pathlib import Path

        models = Path(__file__).resolve().parent / "models"
        model = resolve_model(f"{models / 'nanogpt_style.py'}:build").build("cpu")
        plan = plan_for(model, tp=2, overrides={
            **{f"transformer.h.{i}.c_attn.{p}": "RS(0)" for i in range(2)
               for p in ("weight", "bias")},
            **{f"transformer.h.{i}.c_proj.weight": "RS(1)" for i in range(2)}})
    elif case == "sp_replicated_head":
        model = build("encoder")
        plan = plan_for(model, tp=2, sp=True, overrides=ENCODER_MLP_TP)
    elif case == "bias_mismatch":
        model = build("encoder")
        plan = plan_for(model, tp=2, overrides={"encoder.layers.0.linear1.weight": "RS(0)",
                                                "encoder.layers.0.linear1.bias": "RR"})
    tokens = torch.zeros(2, 8, dtype=torch.long)
    with pytest.raises(NotExpressible, match=reason):
        module_level_plan(model, plan, tokens)
    with pytest.raises(PassError, match=rf"\[module-apply\].*{reason}"):
        apply_plan(model, plan, tokens, path="module")


def test_refused_plan_of_an_export_only_model_is_one_clear_error():
    """A plan the module level refuses falls back to the graph rewrite, which cannot trace a
    Hugging Face model: one ``PassError`` naming both reasons, before any process group."""
    pytest.importorskip("transformers")
    model = build("llama")
    plan = plan_for(model, tp=2, overrides={"model.norm.weight": "RS(0)"})
    with pytest.raises(PassError, match=r"\[graph-rewrite\].*module level refused it \(.*"
                                        r"'model.norm' has parameter\(s\) weight sharded over "
                                        r"tp.*symbolic_trace"):
        apply_plan(model, plan, torch.zeros(2, 8, dtype=torch.long))


def test_gpt_sequence_parallel_runs_at_module_level():
    """The zoo GPT under sp runs at module level: its replicated position embedding looks up
    each tp rank's own sequence shard (``PositionShard``: no collective), the
    vocabulary-parallel lookup reduce-scatters to ``Shard(1)``, the attention is
    head-parallel and each region passes its gathered input on as a DTensor."""
    from fxplan.runtime.styles.tp_fused_qkv import FusedQKVAttention
    from fxplan.runtime.styles.tp_positions import PositionShard
    from rt_plans import build_model, fixed_batch, make_plan

    plan = make_plan(tp=2, sp=True)
    styles = module_level_plan(build_model(2), plan, fixed_batch(plan)[0]).styles
    assert isinstance(styles["wpe"], PositionShard)
    assert isinstance(styles["wte"], RowwiseParallel)
    assert isinstance(styles["h.0.attn"], FusedQKVAttention)
    assert isinstance(styles["h.0.mlp"], PrepareModuleInput)
    assert not styles["h.0.mlp"].use_local_output


def test_gpt_pipeline_cut_skips_the_prologue_on_later_stages():
    """The zoo GPT's prologue (token and position embeddings, then an embedding dropout) is cut
    at module level under pp alone, with cp and with tp + sp: the first stage runs all three,
    a later stage skips them (``x + 0`` for the positions), the tied ``wte``/``lm_head`` is
    held by both stages, and under sp the later stage takes the received sequence shard at
    ``wte``'s place while its ``NoPositions`` takes no style."""
    from torch import nn

    from fxplan.runtime.apply.module import _present
    from fxplan.runtime.apply.stages import NoPositions, token_embedding
    from fxplan.runtime.styles.tp_positions import PositionShard
    from rt_cp_cases import with_cp
    from rt_plans import build_model, fixed_batch, make_plan

    plain = make_plan(pp=2, num_microbatches=2)
    tokens = fixed_batch(plain)[0]
    for plan, batch in ((plain, tokens), (with_cp(make_plan(pp=2, dp=2, num_microbatches=2), 2),
                                          tokens[:, :8])):
        model = build_model(2)
        decided = module_level_plan(model, plan, batch)   # checks the chain against the model
        assert decided.probe.pre == ["wte", "wpe"] and token_embedding(decided.probe, model) == "wte"
        assert decided.tied_users == {"wte.weight": [0, 1]}
        first, last = (stage_module(model, plan, k, decided.probe) for k in (0, 1))
        assert isinstance(first.wpe, nn.Embedding) and isinstance(first.drop, nn.Dropout)
        assert isinstance(last.wte, nn.Identity) and isinstance(last.wpe, NoPositions)
        assert isinstance(last.drop, nn.Identity)
        hidden = torch.randn(2, 8, model.config.hidden)
        assert torch.equal(last.drop(last.wte(hidden) + last.wpe(torch.arange(8))), hidden)
    plan = make_plan(pp=2, tp=2, sp=True, num_microbatches=2)
    model = build_model(2)
    decided = module_level_plan(model, plan, tokens)
    assert isinstance(decided.styles["wpe"], PositionShard), decided.styles
    assert _present(stage_module(model, plan, 0, decided.probe), "wpe")
    assert not _present(stage_module(model, plan, 1, decided.probe), "wpe")
    assert decided.stage_io[1].inputs[0].shape == (2, 8, model.config.hidden)  # (b, s/tp, h)


class _NormedPrologue(torch.nn.Module):
    """A token embedding followed by a LayerNorm before the blocks (BLOOM's
    ``word_embeddings_layernorm``); with ``project`` a Linear instead of the norm."""

    def __init__(self, project: bool = False) -> None:
        super().__init__()
        from rt_module_cases import build as build_case

        base = build_case("encoder")
        self.emb, self.encoder, self.head = base.emb, base.encoder, base.head
        width = base.emb.embedding_dim
        self.emb_norm = torch.nn.Linear(width, width) if project else torch.nn.LayerNorm(width)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.emb_norm(self.emb(tokens))))


def test_pipeline_prologue_with_a_norm_of_the_embeddings_is_cut():
    """A later stage skips the embedding and its norm (it receives the normalised state);
    the chain of stages is checked against the model on one microbatch (was refused)."""
    model = _NormedPrologue()
    plan = plan_for(model, pp=2)
    decided = module_level_plan(model, plan, TOKENS)
    later = stage_module(model, plan, 1, decided.probe)
    assert isinstance(later.emb_norm, torch.nn.Identity)


def test_pipeline_prologue_the_stage_builder_cannot_cut_is_refused():
    """A projection before the first block is refused with the modules named; ``module``
    raises it, ``auto`` would run the graph rewrite and say why."""
    model = _NormedPrologue(project=True)
    plan = plan_for(model, pp=2)
    with pytest.raises(NotExpressible, match=r"one token nn\.Embedding.*found Embedding 'emb', "
                                             r"Linear 'emb_norm': a later stage could not "
                                             r"skip it"):
        module_level_plan(model, plan, TOKENS)
    with pytest.raises(PassError, match=r"\[module-apply\].*Linear 'emb_norm'"):
        apply_plan(model, plan, TOKENS, path="module")


#: OPT in small (dropout off): its attention reshapes q/k/v by ``self.num_heads``.
OPT = ("hf:opt:num_hidden_layers=2,hidden_size=32,ffn_dim=64,num_attention_heads=4,"
       "vocab_size=64,max_position_embeddings=32,word_embed_proj_dim=32,dropout=0.0,"
       "attention_dropout=0.0")


def _head_parallel(model: torch.nn.Module) -> dict[str, str]:
    """q/k/v and fc1 column-parallel, out_proj and fc2 row-parallel (Megatron's layout)."""
    tokens = {"q_proj": "RS(0)", "k_proj": "RS(0)", "v_proj": "RS(0)", "fc1": "RS(0)",
              "out_proj": "RS(1)", "fc2": "RS(1)", "embed_tokens": "RS(0)"}
    return {n: tokens[n.rsplit(".", 2)[-2]] for n, _ in model.named_parameters()
            if n.rsplit(".", 2)[-2] in tokens and (n.endswith("weight") or
                                                  tokens[n.rsplit(".", 2)[-2]] == "RS(0)")}


def test_a_head_count_fixed_in_the_code_is_refused_not_run_wrong():
    """OPT's ``view(bsz, -1, self.num_heads, head_dim)`` runs on the local shards, attending
    over half the positions (4 ranks trained to a loss 1.6e-3 off one process); the local
    probe's attention shapes tell. The module level then sets the local head count on each
    rank (``self.num_heads = 2``), which it checks the same way; a count it could not set
    (pinned here by a property) stays refused, never run wrong."""
    pytest.importorskip("transformers")
    from fxplan.examples.model_spec import resolve_model
    torch.manual_seed(0)
    model = resolve_model(OPT).build("cpu")
    plan = plan_for(model, tp=2, overrides=_head_parallel(model))
    decided = module_level_plan(model, plan, TOKENS)
    assert decided.head_counts["model.decoder.layers.0.self_attn"] == {"num_heads": 2,
                                                                        "embed_dim": 16}
    attention = type(model.model.decoder.layers[0].self_attn)
    pinned = type("Pinned", (attention,), {"num_heads": property(lambda self: 4,
                                                                 lambda self, value: None)})
    for layer in model.model.decoder.layers:
        layer.self_attn.__class__ = pinned
        del layer.self_attn.__dict__["num_heads"]
    with pytest.raises(NotExpressible, match=r"attention's query is \(2, 4, 4, 8\) where the "
                                             r"model's is \(2, 4, 8, 8\).*head count fixed"):
        module_level_plan(model, plan, TOKENS)
    module_level_plan(model, plan_for(model, tp=1), TOKENS)   # one rank: nothing to refuse
    llama = build("llama")                                      # heads from -1: splits right
    decided = module_level_plan(llama, plan_for(llama, tp=2), TOKENS)
    assert decided.styles and not decided.head_counts          # nothing to set


def _user_model(name: str) -> torch.nn.Module:
    from fxplan.examples.model_spec import resolve_model
    from pathlib import Path
    torch.manual_seed(0)
    return resolve_model(f"{Path(__file__).parent / 'models' / name}.py:build").build("cpu")


def test_pipeline_cut_of_a_module_dict_of_layers_computes_the_model():
    """torchtitan's ``for layer in self.layers.values()``: each stage keeps a ``ModuleDict``
    of its layers (was a ``StageBlocks`` list without ``.values()``); the chain of stages is
    checked against the model on one microbatch."""
    model = _user_model("titan_style")
    decided = module_level_plan(model, plan_for(model, pp=2), TOKENS)
    stage = stage_module(model, plan_for(model, pp=2), 1, decided.probe)
    assert list(stage.layers.keys()) == ["1"]


def test_pipeline_cut_of_a_forward_that_reads_the_token_shape_computes_the_model():
    """nanoGPT's ``b, t = idx.size()`` on a later stage: the stage runs on zero token ids of
    the hidden state's ``(b, t)`` with the hidden state in the embedding's place (was: every
    rank failed unpacking ``(b, t, h)``); the chain is checked against the model."""
    model = _user_model("nanogpt_style")
    plan = plan_for(model, pp=2)
    decided = module_level_plan(model, plan, TOKENS)
    assert decided.stage_io[1].inputs[0].shape == (2, 8, 32)


class _TwoInputs(torch.nn.Module):
    """A forward that needs a second input a later stage never receives."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, 32)
        self.layers = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(32, 32))
                                          for _ in range(2))
        self.head = torch.nn.Linear(32, 64)

    def forward(self, tokens, scale):
        x = self.embed(tokens) * scale.unsqueeze(-1)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def test_a_stage_that_cannot_run_on_its_input_is_refused_on_one_process():
    """The stages' fake run finds it before any launch, for a model on ``meta`` too."""
    from fxplan.runtime.apply.build import meta_parameters
    with meta_parameters():
        model = _TwoInputs()
    with pytest.raises(NotExpressible, match=r"pipeline stage 1 \(blocks 1-1\) does not run on "
                                             r"its input \(2, 8, 32\) \(TypeError"):
        module_level_plan(model, plan_for(model, pp=2), (TOKENS, torch.ones(2, 8)))


def test_hf_opt_pipeline_cut_passes_its_position_embedding_keywords():
    """OPT calls ``embed_positions(mask, past, position_ids=…)``: a later stage's
    ``NoPositions`` takes any arguments (was: an unexpected keyword on every rank)."""
    pytest.importorskip("transformers")
    from fxplan.examples.model_spec import resolve_model
    torch.manual_seed(0)
    model = resolve_model(OPT).build("cpu")
    module_level_plan(model, plan_for(model, pp=2), TOKENS)   # the chain is checked too


def test_a_router_auxiliary_loss_under_pipelining_is_refused_before_launch():
    """Mixtral with ``output_router_logits``: no stage sees every layer's router logits, so a
    pipelined plan would train without the auxiliary loss (was a fallback line on every
    rank); the module level refuses it, on one process."""
    pytest.importorskip("transformers")
    model = build("mixtral-aux")
    with pytest.raises(NotExpressible, match=r"auxiliary loss.*--constrain pp=1"):
        module_level_plan(model, plan_for(model, pp=2), TOKENS)
    module_level_plan(model, plan_for(model, dp=2), TOKENS)


def test_a_stage_cut_for_a_check_shares_the_blocks_and_leaves_the_model_alone():
    """``share_blocks``: the stage holds the model's own blocks (no copy of the ``pp·v − 1``
    other stages' blocks per stage), computes what the copied stage computes, and the model
    keeps its container, embedding and head."""
    model = build("encoder")
    plan = plan_for(model, pp=2)
    decided = module_level_plan(model, plan, TOKENS)
    container = decided.probe.containers[0]
    before = dict(model.named_modules())
    for k in range(2):
        shared = stage_module(model, plan, k, decided.probe, share_blocks=True)
        copied = stage_module(model, plan, k, decided.probe)
        kept = decided.probe.blocks[plan.stages[k].layers[0]:plan.stages[k].layers[1]]
        for name in kept:
            key = name.rpartition(".")[2]
            assert dict(shared.get_submodule(container).named_children())[key] is before[name]
            assert dict(copied.get_submodule(container).named_children())[key] \
                is not before[name]
        assert [n for n, _ in shared.named_parameters()] == \
            [n for n, _ in copied.named_parameters()]
    assert dict(model.named_modules()) == before
    x = TOKENS
    with torch.no_grad():
        for k in range(2):
            got = model_output(stage_module(model, plan, k, decided.probe,
                                            share_blocks=True).eval()(x))
            want = model_output(stage_module(model, plan, k, decided.probe).eval()(x))
            torch.testing.assert_close(got, want, rtol=0, atol=0)
            x = want


@pytest.fixture
def torch_without_view_sharding(monkeypatch):
    """This torch as one without DTensor's view propagation of a sharded dimension (torch
    2.11; on that release the fixture changes nothing)."""
    from fxplan.core import torch_support

    entry = torch_support.FEATURES["dtensor_view_sharding"]
    monkeypatch.setitem(torch_support.FEATURES, "dtensor_view_sharding",
                        ("torch", "no_such_attribute", entry[2]))
    torch_support.torch_has.cache_clear()
    yield
    torch_support.torch_has.cache_clear()


def test_graph_rewrite_tp_on_a_torch_without_view_sharding_is_refused_before_any_group(
        torch_without_view_sharding):
    """torch 2.11's DTensor refuses the views of the graph rewrite's tensor parallelism (the
    heads folded into the batch) on every rank: the plan is refused on one process first, with
    the feature it needs, and the search is told so for any cluster."""
    from types import SimpleNamespace

    from fxplan.core.torch_support import TorchVersionError
    from fxplan.passes.tracer import trace_model
    from fxplan.runtime.apply.runnable import graph_rewrite_tp_refusal
    from rt_plans import build_model, fixed_batch, make_plan

    plan = make_plan(tp=2, recompute="selective")   # written-out attention: the graph rewrite
    tokens, _ = fixed_batch(plan)
    with pytest.raises(TorchVersionError, match=r"runs as the graph rewrite.*with tp=2 it needs "
                                                r"DTensor's view propagation.*Upgrade torch"):
        apply_plan(build_model(2), plan, tokens)
    with pytest.raises(TorchVersionError, match="DTensor's view propagation"):
        apply_plan(build_model(2), make_plan(tp=2), tokens, path="graph")
    graph = SimpleNamespace(gm=trace_model(build_model(2), 1))   # what the refusal reads
    for cpu in (False, True):
        assert "DTensor's view propagation" in graph_rewrite_tp_refusal(graph, cpu)
