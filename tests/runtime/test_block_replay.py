"""The probe's shortcut through repeated blocks gives the answer of the full run: every record
(call order, hidden inputs, outputs, pre/post modules, attention shapes) equal with and without
it, for the example models, Hugging Face ones and user-style models, whole, with
tensor-parallel local shapes and cut into pipeline stages; a block that differs or that
changes the rest of the model is run, never replayed."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from fxplan.examples.model_spec import resolve_model
from fxplan.runtime.apply import module as module_apply
from fxplan.runtime.apply import module_checks
from fxplan.runtime.apply.module import module_level_plan
from fxplan.runtime.apply.probe import ModuleProbe, probe_module
from fxplan.runtime.styles.tp_styles import NotExpressible
from rt_module_cases import MIXTRAL, QWEN_MOE, plan_for

GPT = "gpt:layers=6,hidden=64,heads=4,vocab=128,seq=32"
MOE = "moe:layers=6,hidden=64,heads=4,vocab=128,seq=32,experts=4,moe_every=2"
LLAMA = "llama:layers=5,hidden=64,heads=4,kv_heads=2,vocab=128,seq=32"
HF = [MIXTRAL.replace("num_hidden_layers=2", "num_hidden_layers=4"),
      QWEN_MOE.replace("num_hidden_layers=2", "num_hidden_layers=4")]


def _meta(t: torch.Tensor | None) -> Any:
    return None if t is None else (tuple(t.shape), t.dtype)


def record(probe: ModuleProbe) -> tuple:
    """Everything a probe found, comparable."""
    calls = [(name, c.order, c.positional, c.keywords, c.num_args,
              [_meta(x) for x in c.inputs], _meta(c.output)) for name, c in probe.calls.items()]
    return (probe.containers, probe.blocks, calls, _meta(probe.output), probe.pre, probe.post,
            probe.between, probe.attention)


def spec_model(spec: str) -> tuple[nn.Module, list[torch.Tensor]]:
    bundle = resolve_model(spec)
    specs = dict(bundle.example_inputs(2, None))
    for name in ("targets", "labels"):
        specs.pop(name, None)
    return bundle.build("meta"), [torch.zeros(s.shape, dtype=s.dtype) for s in specs.values()]


class _Counted(nn.Module):
    """A pre-LN MLP block that counts its real runs; ``width`` may differ per block."""

    runs = 0

    def __init__(self, hidden: int, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, width)
        self.down = nn.Linear(width, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        type(self).runs += 1
        return x + self.down(torch.relu(self.up(self.norm(x))))


class _Talking(_Counted):
    """A block that hands something to the rest of the model through shared state."""

    def __init__(self, hidden: int, width: int, log: list) -> None:
        super().__init__(hidden, width)
        self.log = log

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.log.append(x.shape[0])
        return super().forward(x)


class _Toy(nn.Module):
    def __init__(self, widths: list[int], talking: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.seen: list[int] = []
        self.layers = nn.ModuleList(_Talking(16, w, self.seen) if talking else _Counted(16, w)
                                    for w in widths)
        self.head = nn.Linear(16, 32)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


@pytest.mark.parametrize("spec", [GPT, MOE, LLAMA])
def test_replayed_probe_equals_the_full_run(spec):
    model, inputs = spec_model(spec)
    assert record(probe_module(model, inputs)) == record(probe_module(model, inputs,
                                                                      replay=False))


@pytest.mark.parametrize("spec", HF)
def test_replayed_probe_equals_the_full_run_on_hugging_face_models(spec):
    pytest.importorskip("transformers")
    model, inputs = spec_model(spec)
    assert record(probe_module(model, inputs)) == record(probe_module(model, inputs,
                                                                      replay=False))


def _outcome(model: nn.Module, inputs: list[torch.Tensor], shapes: dict, replay: bool) -> Any:
    try:
        return record(probe_module(model, inputs, shapes, replay=replay))
    except Exception as err:  # noqa: BLE001 - the failure is the outcome compared
        return f"{type(err).__name__}: {err}"


def test_replayed_probe_with_local_shapes_equals_the_full_run():
    model, inputs = spec_model(GPT)
    column = {n: (p.shape[0] // 2, *p.shape[1:]) for n, p in model.named_parameters()
              if n.endswith(("fc1.weight", "fc1.bias"))}
    row = {n: (p.shape[0], p.shape[1] // 2) for n, p in model.named_parameters()
           if n.endswith("fc2.weight")}
    mlp = {**column, **row}
    assert _outcome(model, inputs, mlp, True) == _outcome(model, inputs, mlp, False)
    assert not isinstance(_outcome(model, inputs, mlp, True), str)
    # the fused QKV split by the global width fails on its local shard: alike either way
    fused = {n: (p.shape[0] // 2, *p.shape[1:]) for n, p in model.named_parameters()
             if n.endswith(("qkv.weight", "qkv.bias"))}
    failed = _outcome(model, inputs, fused, True)
    assert isinstance(failed, str) and failed == _outcome(model, inputs, fused, False)


def test_identical_blocks_run_once_and_different_ones_run():
    model = _Toy([24, 24, 24, 40, 24, 24])
    tokens = torch.zeros(2, 8, dtype=torch.long)
    _Counted.runs = 0
    full = probe_module(model, [tokens], replay=False)
    assert _Counted.runs == 6
    _Counted.runs = 0
    replayed = probe_module(model, [tokens])
    assert _Counted.runs == 2          # one per structure: width 24 and width 40
    assert record(replayed) == record(full)


def test_a_block_that_changes_shared_state_is_never_replayed():
    model = _Toy([24] * 5, talking=True)
    tokens = torch.zeros(2, 8, dtype=torch.long)
    probe_module(model, [tokens])
    assert model.seen == [2] * 5       # every block ran and told the model


def _without_replay(monkeypatch):
    real = module_apply.probe_module
    for where in (module_apply, module_checks):   # the decision and its checks
        monkeypatch.setattr(where, "probe_module",
                            lambda *a, **k: real(*a, **{**k, "replay": False}))


def _decision(model: nn.Module, plan: Any, tokens: torch.Tensor) -> Any:
    """What the module level decides: the stage inputs and outputs, or why it refuses."""
    try:
        decided = module_level_plan(model, plan, tokens)
    except NotExpressible as why:
        return str(why)
    return (record(decided.probe), sorted(decided.styles),
            [([_meta(t) for t in io.inputs], [_meta(t) for t in io.outputs])
             for io in decided.stage_io])


@pytest.mark.parametrize("pp,v,tp", [(3, 2, 1), (2, 1, 2), (6, 1, 1)])
def test_pipeline_decision_equals_the_one_without_replay(monkeypatch, pp, v, tp):
    model, (tokens,) = spec_model(GPT)
    plan = plan_for(model, pp=pp, tp=tp, layers=6, seq=tokens.shape[1])
    plan = plan if v == 1 else _interleaved(plan, pp, v)
    fast = _decision(model, plan, tokens)
    _without_replay(monkeypatch)
    assert fast == _decision(model, plan, tokens)


def _interleaved(plan: Any, pp: int, v: int) -> Any:
    """``plan`` under the interleaved schedule with ``v`` chunks per pipeline rank."""
    from dataclasses import replace

    from fxplan.core.schedule import Schedule
    from rt_plans import stages_for

    return replace(plan, config=replace(plan.config, schedule=Schedule.parse(f"interleaved:{v}")),
                   stages=stages_for(6, pp, v))


class _Between(_Toy):
    """A module with parameters runs between two blocks: no block-boundary pipeline cut."""

    def __init__(self) -> None:
        super().__init__([24] * 4)
        self.mid = nn.Linear(16, 16)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for i, layer in enumerate(self.layers):
            x = self.mid(layer(x)) if i == 1 else layer(x)
        return self.head(x)


def test_a_refused_pipeline_gives_the_same_reason(monkeypatch):
    model, tokens = _Between(), torch.zeros(2, 8, dtype=torch.long)
    plan = plan_for(model, pp=2, layers=4, seq=8)
    fast = _decision(model, plan, tokens)
    assert isinstance(fast, str) and "mid" in fast   # refused, naming the module between
    _without_replay(monkeypatch)
    assert fast == _decision(model, plan, tokens)


def test_a_probe_watched_by_a_torch_function_mode_runs_every_block():
    """The context-parallel check counts each block's attention calls in a mode of its own:
    no block may be replayed there."""
    from fxplan.runtime.styles.context_parallel import block_attention_calls

    model, inputs = spec_model(LLAMA)
    blocks = probe_module(model, inputs).blocks
    calls = block_attention_calls(model, inputs, blocks)
    assert len(calls) == 5 and all(causal == 1 for causal, _ in calls.values())
