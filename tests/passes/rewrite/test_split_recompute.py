"""Full recompute beside a split backward (``passes.rewrite.split_recompute``), in one process:
torch's two passes (``stage_backward_input``, then ``stage_backward_weight`` over the kept
graph) read one recompute, and the gradients are a plain backward's bit for bit."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

from fxplan.passes.rewrite import split_recompute
from fxplan.passes.rewrite.layers import OutlineLayers
from fxplan.passes.rewrite.recompute import Recompute
from fxplan.passes.rewrite.split_recompute import (RecomputeMismatch, is_kept_checkpoint,
                                                   kept_checkpoint)
from fxplan.passes.tracer import trace_model
from rt_plans import build_model, make_plan


class Counted(nn.Module):
    """A block with dropout (the recompute must draw the same mask) that counts its runs."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down, self.drop = nn.Linear(8, 16), nn.Linear(16, 8), nn.Dropout(0.25)
        self.runs = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.runs += 1
        return x + self.down(self.drop(torch.nn.functional.gelu(self.up(x))))


def _blocks(seed: int = 0) -> nn.ModuleList:
    torch.manual_seed(seed)
    return nn.ModuleList(Counted() for _ in range(3))


def _forward(blocks: nn.ModuleList, x: torch.Tensor, dtype: torch.dtype | None = None
             ) -> torch.Tensor:
    torch.manual_seed(7)
    with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        h = x
        for block in blocks:
            h = torch.tanh(block(h))
    return h.float()


def _plain_grads(dtype: torch.dtype | None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    blocks = _blocks()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
    out = _forward(blocks, x, dtype)
    out.backward(torch.ones_like(out))
    return x.grad, [p.grad for p in blocks.parameters()]


def _split_grads(blocks: nn.ModuleList, dtype: torch.dtype | None
                 ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
    out = _forward(blocks, x, dtype)
    _, groups = stage_backward_input([out], [torch.ones_like(out)], [x], blocks.parameters())
    stage_backward_weight(blocks.parameters(), groups)
    return x.grad, [p.grad for p in blocks.parameters()]


@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["fp32", "bf16-autocast"])
def test_both_passes_read_one_recompute_and_match_a_plain_backward(dtype) -> None:
    """Bit-identical input and weight gradients (dropout's masks redrawn alike, the forward's
    autocast re-entered in the backward, which runs outside it), the names of the
    parameters unchanged, and each block run twice: its forward and one recompute."""
    want_x, want = _plain_grads(dtype)
    blocks = _blocks()
    names = [n for n, _ in blocks.named_parameters()]
    for block in blocks:
        kept_checkpoint(block)
    assert [n for n, _ in blocks.named_parameters()] == names
    assert all(is_kept_checkpoint(b) for b in blocks)
    got_x, got = _split_grads(blocks, dtype)
    assert torch.equal(got_x, want_x)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert [b.runs for b in blocks] == [2, 2, 2]


def test_the_recompute_is_freed_with_the_graph() -> None:
    """The recorded tensors live from the first unpack to the end of the weight pass."""
    blocks = _blocks()
    kept_checkpoint(blocks[0])
    frames: list[weakref.ref] = []
    real = split_recompute._Frame._recompute

    def spy(self):  # type: ignore[no-untyped-def]
        frames.append(weakref.ref(self))
        return real(self)

    x = torch.randn(4, 8, requires_grad=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(split_recompute._Frame, "_recompute", spy)
        out = _forward(blocks, x)
        _, groups = stage_backward_input([out], [torch.ones_like(out)], [x],
                                         blocks.parameters())
        assert len(frames) == 1 and frames[0]() is not None      # kept for the W pass
        assert frames[0]().recomputed                              # type: ignore[union-attr]
        stage_backward_weight(blocks.parameters(), groups)
        del out, groups
        gc.collect()
    assert frames[0]() is None


def test_torch_checkpoints_fail_where_the_kept_one_runs() -> None:
    """The reason for the module: the composable ``checkpoint`` torch offers fails in the
    weight pass of the same split backward (if a torch release fixes that, this says so)."""
    from torch.distributed._composable import checkpoint

    blocks = _blocks()
    for block in blocks:
        checkpoint(block)
    with pytest.raises(Exception):
        _split_grads(blocks, None)


def test_a_recompute_that_saves_otherwise_is_refused() -> None:
    class Moody(nn.Module):
        """Saves one tensor in its forward and two when rerun."""

        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(4))
            self.calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            y = x * self.w
            return y.sin() if self.calls > 1 else y

    block = kept_checkpoint(Moody())
    x = torch.randn(4, requires_grad=True)
    with pytest.raises(RecomputeMismatch, match="saved 3 tensors .* saved 2"):
        block(x).sum().backward()


def test_the_rewrite_pass_keeps_the_recompute_under_a_split_backward() -> None:
    """``Recompute`` hooks the outlined blocks in place under ``zb`` (their names as without
    recompute) and wraps them in torch's ``checkpoint_wrapper`` under 1F1B."""
    for schedule, kept in (("zb", True), ("1f1b", False)):
        model = build_model(2)
        gm = OutlineLayers()(trace_model(model, 1), None).module
        plan = make_plan(pp=2, schedule=schedule, recompute="full", num_microbatches=2)
        out = Recompute()(gm, plan).module
        assert is_kept_checkpoint(out.layer_0) is kept
        assert any("_checkpoint_wrapped_module" in n
                   for n, _ in out.named_parameters()) is not kept


@pytest.mark.parametrize("attention", ["math", "sdpa"])
def test_a_selective_checkpoint_runs_once_under_a_split_backward(attention: str) -> None:
    """Selective recompute under ``zb``: each block's outlined attention core, which holds no
    weights, is recomputed once — in the input-gradient pass; the weight pass starts from the
    inputs of the weights' ops and never reads what the core saved (so nothing of it is kept
    between the passes, as the memory model prices: ``ActivationBytes.weights_read``) — and
    the gradients equal a plain backward's."""
    from fxplan.cost_model.memory.activations import ActivationBytes

    def grads(recompute: str) -> tuple[list[torch.Tensor], dict[str, int]]:
        model = build_model(2, attention=attention)
        gm = OutlineLayers()(trace_model(model, 1), None).module
        plan = make_plan(pp=2, schedule="zb", recompute=recompute, num_microbatches=2)
        out = Recompute()(gm, plan).module
        runs: dict[str, int] = {}
        for name, module in out.named_modules():
            if name.endswith("._checkpoint_wrapped_module"):   # the outlined core itself
                module.register_forward_pre_hook(
                    lambda *_, key=name: runs.__setitem__(key, runs.get(key, 0) + 1))
        stage_input: list[torch.Tensor] = []   # the embedding's output, as a stage's input

        def as_input(module: nn.Module, args: object, output: torch.Tensor) -> torch.Tensor:
            stage_input.append(output.detach().requires_grad_())
            return stage_input[-1]

        out.embed.register_forward_hook(as_input)
        tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(3))
        loss = out(tokens).float().square().mean()
        params = [p for n, p in out.named_parameters() if not n.startswith("embed.")]
        _, groups = stage_backward_input([loss], None, stage_input, params)
        stage_backward_weight(params, groups)
        return [stage_input[0].grad, *(p.grad for p in params)], runs

    plain, _ = grads("none")
    selective, runs = grads("selective")
    assert len(runs) == 2 and set(runs.values()) == {2}, runs   # forward, and once in B
    for a, b in zip(plain, selective, strict=True):
        torch.testing.assert_close(a, b)
    assert ActivationBytes(1.0, 5.0, weights_read=False).kept == 0.0
    assert ActivationBytes(1.0, 5.0).kept == 4.0
