"""capture(): input forms, concrete arguments, dtype, fingerprint, leaf modules."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from fxplan.examples.model_spec import InputSpec, resolve_model
from fxplan.passes.capture import CaptureError
from fxplan.api import capture


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        out = x
        for _ in range(x.size(0)):  # shape-dependent Python: fine on fake tensors
            out = self.lin(out)
        return out


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(8, 8)
        self.inner = Inner()

    def forward(self, x, mode: str = "plain"):
        return self.inner(self.pre(x))


def test_inputs_as_tensor_spec_tuple_or_dict():
    model = Outer()
    by_spec = capture(model, inputs={"x": InputSpec((3, 8))}, leaf_modules=[Inner])
    by_tensor = capture(model, inputs=torch.randn(3, 8, device="meta"), leaf_modules=["inner"])
    by_tuple = capture(model, inputs=(torch.randn(3, 8),), leaf_modules=["Inner"])
    assert by_spec.fingerprint() == by_tensor.fingerprint() == by_tuple.fingerprint()
    assert by_spec.inputs == {"x": ((3, 8), torch.float32)}


def test_leaf_modules_are_reported_and_measured():
    graph = capture(Outer(), inputs=InputSpec((3, 8)), leaf_modules=["inner"])
    assert graph.leaf_modules == {"inner": "Inner"}
    info = graph.info("inner")
    assert info.params == ["inner.lin.weight", "inner.lin.bias"]
    assert info.flops == 3 * 2 * 3 * 8 * 8  # measured: three 3×8×8 products (no rule)
    assert info.op_class == "matmul"
    assert graph.unpriced_ops == {"module:Inner": 1}
    by_pattern = capture(Outer(), inputs=InputSpec((3, 8)), leaf_modules=["inn*"])
    assert by_pattern.leaf_modules == {"inner": "Inner"}


def test_unmatched_leaf_spec_is_an_error():
    with pytest.raises(CaptureError, match=r"leaf_modules \['nothing'\] matched no module"):
        capture(resolve_model("gpt-tiny"), leaf_modules=["nothing"])


def test_targets_default_traces_the_logits_path():
    bundle = resolve_model("gpt-tiny")
    logits = capture(bundle, inputs=bundle.example_inputs(2, with_targets=False))
    loss = capture(bundle, batch=2)
    assert logits.info("output").shape == (2, 64, 512)
    assert loss.info("output").shape == ()
    assert "cross_entropy" not in {n.name for n, _ in logits.nodes()}


def test_dtype_casts_parameters_and_activations():
    graph = capture("gpt-tiny", batch=1, dtype=torch.bfloat16)
    assert graph.params["h.0.attn.qkv.weight"].dtype == torch.bfloat16
    assert graph.params["h.0.attn.qkv.weight"].bytes == 192 * 64 * 2
    assert graph.info("h_0_attn_qkv").dtype == torch.bfloat16
    assert graph.inputs["tokens"] == ((1, 64), torch.int64)


def test_fingerprint_is_stable_and_sensitive():
    a = capture("gpt-tiny", batch=2).fingerprint()
    assert a == capture("gpt-tiny", batch=2).fingerprint()
    assert a != capture("gpt-tiny", batch=4).fingerprint()
    assert a != capture("gpt-tiny", batch=2, dtype=torch.bfloat16).fingerprint()
    assert len(a) == 64


@pytest.mark.parametrize("kwargs, message", [
    (dict(), "needs inputs="),
    (dict(inputs={"y": InputSpec((1, 8))}), "not parameters of Outer.forward(x, mode)"),
    (dict(inputs=InputSpec((3, 8)), batch=2), "batch= and seq= apply to a model bundle"),
    (dict(inputs={"x": InputSpec((3, 8))}, concrete_args={"x": 1}), "given both"),
])
def test_capture_argument_errors(kwargs, message):
    with pytest.raises(CaptureError) as err:
        capture(Outer(), leaf_modules=["inner"], **kwargs)
    assert message in str(err.value)


class _Unused(nn.Module):
    """A parameter the forward never reads: the graph would price a smaller model."""

    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(8, 8)
        self.spare = nn.Linear(8, 1000)

    def forward(self, x):
        return self.used(x)


def test_the_graphs_parameters_must_add_up_to_the_models():
    with pytest.raises(CaptureError, match=r"never reads 2 of its parameters \(spare\.bias, "
                                           r"spare\.weight\).*72 elements where the model has 9,072"):
        capture(_Unused(), inputs=torch.zeros(2, 8))
